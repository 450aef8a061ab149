"""The engine under speculative decoding against the real vLLM 0.33 scheduler (tests/vllm_spec_driver.py: a
SpeculativeConfig, a fake drafter proposing k drafts, a seeded verifier): the kept logs of tests/data/vllm_spec/
(no venv needed) and, with the venv, fresh logs of smaller generated traces. check-log reads each step's accepted
counts from the log and feeds them to the engine."""

from __future__ import annotations

import json

import pytest

from checker.checklog import run_check_log
from tests.vllm_spec_logs import KEPT, absent_reason, cases, compare, flags, import_args, run_jobs, trace

CASES = cases()


@pytest.mark.parametrize("name", sorted(CASES))
def test_kept_log_agrees_with_the_engine(name, tmp_path):
    rows, fl = CASES[name]
    log = KEPT / f"{name}.log.jsonl"
    assert json.loads((KEPT / f"{name}.trace.json").read_text()) == rows  # the kept trace is the case's
    conf = compare(rows, fl, log, name, tmp_path)
    assert conf.steps >= 500
    assert conf.share >= 0.99, conf.detail
    assert conf.free_blocks_agreeing >= 0.99 * conf.steps


def test_kept_logs_verify_drafts_and_preempt():
    drafted = preempted = 0
    for name in CASES:
        lines = [json.loads(x) for x in (KEPT / f"{name}.log.jsonl").read_text().splitlines()]
        drafted += sum(sum(line["drafts"].values()) for line in lines)
        preempted += sum(len(line["preempted"]) for line in lines)
        assert any(any(line["accepted"].values()) for line in lines)  # some drafts accepted
        assert any(a < line["drafts"][r] for line in lines for r, a in line["accepted"].items())  # and some rejected
    assert drafted > 10_000 and preempted > 50


def test_kept_policies_are_the_imports():
    from checker.importers import import_policy

    for name, (_, fl) in CASES.items():
        assert (KEPT / f"{name}.yaml").read_text() == import_policy("vllm", import_args(fl), name=name).text


def test_streaming_check_log_agrees_and_finds_no_violation():
    name = "draft_k3_pressure"
    result = run_check_log(str(KEPT / f"{name}.yaml"), KEPT / f"{name}.log.jsonl", KEPT / f"{name}.trace.json",
                           with_conformance=True)
    assert result.violation is None
    assert result.conformance.share == 1.0, result.conformance.detail


def test_without_the_accepted_counts_the_engine_disagrees(tmp_path):
    """The log's accepted counts matter: dropped from the lines, the engine (accepting none) diverges."""
    name = "ngram_k3_roomy"
    rows, fl = CASES[name]
    stripped = tmp_path / "stripped.log.jsonl"
    lines = [json.loads(x) for x in (KEPT / f"{name}.log.jsonl").read_text().splitlines()]
    stripped.write_text("".join(json.dumps({k: v for k, v in line.items() if k != "accepted"}) + "\n"
                                for line in lines))
    assert compare(rows, fl, stripped, name, tmp_path).share < 0.9


def test_fresh_logs_agree(tmp_path):
    reason = absent_reason()
    if reason is not None:
        pytest.skip(reason)
    jobs = {"fresh_ngram": (trace(60, 11, gap=0.7), flags("ngram", 2, 60, seed=11)),
            "fresh_eagle": (trace(60, 12, gap=0.7, priority=True), flags("eagle", 4, 70, seed=12,
                                                                        extra=("--policy", "priority"))),
            "fresh_draft": (trace(60, 13, gap=0.7, aborts=0.1), flags("draft_model", 2, 60, seed=13))}
    run_jobs(jobs, keep=tmp_path)
    for name, (rows, fl) in jobs.items():
        conf = compare(rows, fl, tmp_path / f"{name}.log.jsonl", name, tmp_path)
        assert conf.share >= 0.99, (name, conf.detail)
