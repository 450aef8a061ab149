"""check-log: the invariant catalogue on a real scheduler's per-step log, and conformance with the engine."""

from __future__ import annotations

import json

from checker.api import load_policy
from checker.checklog import engine_log, load_arrivals
from checker.cli import main
from tests.helpers import POLICIES

POLICY = POLICIES / "broken" / "vllm_v1_small_pool.yaml"  # 32 blocks: preemptions happen
ARRIVALS = [
    {"id": "a", "arrival_step": 0, "prompt_tokens": 100, "output_tokens": 40, "priority": 0},
    {"id": "b", "arrival_step": 1, "prompt_tokens": 150, "output_tokens": 60, "priority": 0},
    {"id": "c", "arrival_step": 2, "prompt_tokens": 120, "output_tokens": 80, "priority": 0, "abort_step": 30},
    {"id": "d", "arrival_step": 5, "prompt_tokens": 90, "output_tokens": 30, "priority": 0},
]


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def write_case(tmp_path, mutate=None):
    arrivals = tmp_path / "arrivals.json"
    arrivals.write_text(json.dumps(ARRIVALS))
    log = engine_log(load_policy(POLICY), load_arrivals(arrivals), 60)
    if mutate:
        mutate(log)
    path = tmp_path / "log.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in log))
    return str(path), str(arrivals), log


def test_engine_log_passes_and_conforms(capsys, tmp_path):
    log, arrivals, lines = write_case(tmp_path)
    assert any(line["preempted"] for line in lines) and any(line["aborted"] for line in lines)
    code, out, _ = run(capsys, "check-log", str(POLICY), log, "--arrivals", arrivals, "--conformance",
                       "--invariant", "decode_progress:gap=3", "--invariant", "kv_never_overcommitted")
    assert code == 0, out
    assert out == (f"{log}: 60 steps, no violation of decode_progress, kv_never_overcommitted\n"
                   f"conformance with the engine under {POLICY}: 60/60 steps agree (100.0 %)\n")


def test_a_step_over_the_token_budget_is_reported_with_context(capsys, tmp_path):
    def over_budget(lines):
        lines[7]["scheduled"]["a"] = 9000

    log, arrivals, _ = write_case(tmp_path, over_budget)
    code, out, _ = run(capsys, "check-log", str(POLICY), log, "--arrivals", arrivals, "--invariant", "token_budget")
    assert code == 1
    assert out.splitlines()[0] == f"{log}: token_budget VIOLATED at step 7 (log line 8)"
    assert out.splitlines()[1].startswith("  log line 8: scheduled {a: 9000")


def test_conformance_names_the_first_divergence_and_the_share(capsys, tmp_path):
    def reorder(lines):
        lines[20]["preempted"] = ["a"] + lines[20]["preempted"]

    log, arrivals, _ = write_case(tmp_path, reorder)
    code, out, _ = run(capsys, "check-log", str(POLICY), log, "--arrivals", arrivals, "--conformance",
                       "--invariant", "seq_cap")
    assert code == 1
    assert f"conformance with the engine under {POLICY}: 59/60 steps agree (98.3 %)" in out
    assert "  first divergence: step 20 (log line 21): engine scheduled" in out


def test_bad_log_line_is_an_input_error(capsys, tmp_path):
    log, arrivals, _ = write_case(tmp_path)
    text = open(log).read().splitlines()
    text[3] = json.dumps({"step": 3, "scheduled": {"zz": 4}, "preempted": [], "finished": [], "aborted": [],
                          "running": 1, "waiting": 0, "free_blocks": 3})
    open(log, "w").write("\n".join(text) + "\n")
    code, _, err = run(capsys, "check-log", str(POLICY), log, "--arrivals", arrivals)
    assert code == 2
    assert err == f"batchcheck: error: {log}:4: scheduled='zz' (expected a request id from the arrivals file)\n"
