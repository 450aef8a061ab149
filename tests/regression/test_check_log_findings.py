"""check-log: an aborted request that keeps its blocks and a request scheduled and preempted in one step are
findings (issue 19, item 5), each with the counts that make it one; a correct log stays clean.

Before: an aborted request was rebuilt with no blocks whatever the log's free blocks said (so
cancellation_releases could never fail on a log), and a request both scheduled and preempted was rebuilt as
re-admitted, with only a note about the running count."""

from __future__ import annotations

import json

import pytest

from checker.checklog import default_invariants, engine_log, load_arrivals
from checker.cli import main
from checker.inputfiles import apply_overrides, load_policy
from tests.helpers import POLICIES

ARRIVALS = [  # b holds 4 blocks (64 tokens of 16) when it is aborted at step 5
    {"id": "a", "arrival_step": 0, "prompt_tokens": 100, "output_tokens": 30},
    {"id": "b", "arrival_step": 0, "prompt_tokens": 60, "output_tokens": 30, "abort_step": 5},
    {"id": "c", "arrival_step": 2, "prompt_tokens": 40, "output_tokens": 10},
]
OVERRIDES = ["kv.num_blocks=40"]


def case(tmp_path, mutate=None, overrides=()):
    policy_path = tmp_path / "policy.yaml"
    text = (POLICIES / "vllm_v1.yaml").read_text()
    policy_path.write_text(text.replace("num_blocks: 2500", "num_blocks: 40"))
    policy = load_policy(policy_path)
    assert policy.kv.num_blocks == 40
    arrivals = tmp_path / "arrivals.json"
    arrivals.write_text(json.dumps(ARRIVALS))
    lines = engine_log(apply_overrides(policy, list(overrides)), load_arrivals(arrivals), 40)
    if mutate:
        mutate(lines)
    log = tmp_path / "log.jsonl"
    log.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return str(policy_path), str(log), str(arrivals)


def run(capsys, *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out + err


def leak(lines):
    """The server never frees b's 4 blocks after aborting it."""
    k = next(k for k, line in enumerate(lines) if line["aborted"] == ["b"])
    assert lines[k]["free_blocks"] == lines[k - 1]["free_blocks"] + 4  # the engine freed them at once
    for line in lines[k:]:
        line["free_blocks"] -= 4


def late_free(lines):
    """The server frees b's blocks one step after the abort."""
    k = next(k for k, line in enumerate(lines) if line["aborted"] == ["b"])
    lines[k]["free_blocks"] -= 4


def scheduled_and_preempted(lines):
    """Step 3 preempts c (freeing its 3 blocks) and still gives it a token."""
    lines[3]["preempted"].append("c")
    lines[3]["free_blocks"] += 3


def test_the_engine_log_passes_every_default_invariant(capsys, tmp_path):
    policy, log, arrivals = case(tmp_path)
    code, out = run(capsys, "check-log", policy, log, "--arrivals", arrivals)
    assert code == 0, out
    assert out.splitlines()[0].endswith("no violation of kv_never_overcommitted, token_budget, seq_cap, "
                                        "request_conservation, scheduled_requests_run, cancellation_releases")


def test_an_aborted_request_whose_blocks_are_never_freed_fails_cancellation_releases(capsys, tmp_path):
    policy, log, arrivals = case(tmp_path, leak)
    code, out = run(capsys, "check-log", policy, log, "--arrivals", arrivals)
    assert code == 1
    lines = out.splitlines()
    assert lines[0] == f"{log}: cancellation_releases VIOLATED at step 5 (log line 6)"
    assert "  blocks in use 14 (free_blocks 26), of which the requests the log still serves hold 10: the other 4 " \
           "are still held by aborted requests" in lines
    assert "  request b: CANCELLED (aborted at log step 5), still holding 4 blocks" in lines


def test_the_release_lag_is_the_policys(capsys, tmp_path):
    """Freed one step late: a finding under vLLM's lag 0, none when the policy says the server frees a step
    later; and a leak is still one after that lag."""
    policy, log, arrivals = case(tmp_path, late_free)
    code, out = run(capsys, "check-log", policy, log, "--arrivals", arrivals)
    assert code == 1 and out.splitlines()[0].endswith("cancellation_releases VIOLATED at step 5 (log line 6)")
    code, out = run(capsys, "check-log", policy, log, "--arrivals", arrivals, "--invariant", "cancellation_releases:1")
    assert code == 0, out
    policy, log, arrivals = case(tmp_path, leak)
    code, out = run(capsys, "check-log", policy, log, "--arrivals", arrivals, "--invariant", "cancellation_releases:1")
    assert code == 1 and out.splitlines()[0].endswith("cancellation_releases VIOLATED at step 6 (log line 7)")


def test_a_request_scheduled_and_preempted_in_one_step_fails_scheduled_requests_run(capsys, tmp_path):
    policy, log, arrivals = case(tmp_path, scheduled_and_preempted)
    code, out = run(capsys, "check-log", policy, log, "--arrivals", arrivals)
    assert code == 1
    lines = out.splitlines()
    assert f"{log}: scheduled_requests_run VIOLATED at step 3 (log line 4)" in lines
    assert "  request c: scheduled 1 tokens in this step, WAITING after it" in lines


def test_the_default_lag_follows_the_policy(tmp_path):
    policy = apply_overrides(load_policy(POLICIES / "vllm_v1.yaml"), ["cancellation.release_lag_steps=2"])
    assert default_invariants(policy)[-1] == "cancellation_releases:steps=2"


@pytest.mark.parametrize("name", ["request_conservation", "cancellation_releases"])
def test_under_prefix_caching_the_block_counting_invariants_are_refused(capsys, tmp_path, name):
    policy, log, arrivals = case(tmp_path)
    cached = tmp_path / "cached.yaml"
    cached.write_text((POLICIES / "prefix_caching" / "vllm_v1.yaml").read_text())
    code, out = run(capsys, "check-log", str(cached), log, "--arrivals", arrivals, "--invariant", name)
    assert code == 2 and f"--invariant='{name}'" in out
