"""The engine under async scheduling (policy.pipeline) against the real vLLM 0.33 AsyncScheduler stepped as the
engine core's batch queue steps it (tests/vllm_async_driver.py): the kept logs of tests/data/vllm_async/ (no venv
needed) and, with the venv, fresh logs of smaller generated traces."""

from __future__ import annotations

import json

import pytest

from checker.checklog import run_check_log
from tests.vllm_async_logs import KEPT, absent_reason, cases, compare, flags, import_args, run_jobs, spec_flags, trace
from tests.vllm_spec_logs import compare as compare_with, import_args as sync_import_args
from tests.vllm_spec_logs import trace as spec_trace

CASES = cases()


def _lines(name: str) -> list[dict]:
    return [json.loads(x) for x in (KEPT / f"{name}.log.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("name", sorted(CASES))
def test_kept_log_agrees_with_the_engine(name, tmp_path):
    rows, fl = CASES[name]
    assert json.loads((KEPT / f"{name}.trace.json").read_text()) == rows  # the kept trace is the case's
    conf = compare(rows, fl, KEPT / f"{name}.log.jsonl", name, tmp_path)
    assert conf.steps >= 500
    assert conf.share >= 0.99, conf.detail
    assert conf.free_blocks_agreeing >= 0.99 * conf.steps


def test_kept_logs_cover_caching_preemptions_and_aborts():
    preempted = {name: sum(len(line["preempted"]) for line in _lines(name)) for name in CASES}
    aborted = sum(len(line["aborted"]) for name in CASES for line in _lines(name))
    assert sum(1 for n in preempted.values() if n) >= 3 and aborted >= 10
    assert any("--enable-prefix-caching" in fl and preempted[name] for name, (_, fl) in CASES.items())
    for name in CASES:  # one batch in flight: a batch that scheduled tokens is resolved in the next step
        lines = _lines(name)
        assert all(line["resolved"] == prev["step"] for prev, line in zip(lines, lines[1:]) if prev["scheduled"])


def test_a_victim_whose_last_step_is_in_flight_finishes_from_the_queue():
    """stale_finish: the victim is preempted and finished in the same engine step (its stale token is delivered when
    the batch is resolved); the engine agrees on those steps (test_kept_log_agrees_with_the_engine)."""
    both = [line["step"] for line in _lines("stale_finish") if set(line["preempted"]) & set(line["finished"])]
    assert len(both) == 10


def test_speculative_logs_verify_placeholder_drafts():
    """With speculative decoding every decode after a sampling step schedules k placeholder drafts; some are
    accepted, some rejected (the rollback the next line resolves)."""
    for name in ("eagle_k2_pressure", "draft_k3_priority_aborts"):
        lines = _lines(name)
        drafts = sum(sum(line["drafts"].values()) for line in lines)
        accepted = sum(sum(line["accepted"].values()) for line in lines)
        assert drafts > 5_000 and 0 < accepted < drafts
        assert sum(len(line["preempted"]) for line in lines) >= 10


def test_kept_policies_are_the_imports():
    from checker.importers import import_policy

    for name, (_, fl) in CASES.items():
        text = import_policy("vllm", import_args(fl), name=name).text
        assert (KEPT / f"{name}.yaml").read_text() == text
        assert "in_flight: 1" in text


def test_streaming_check_log_agrees_and_finds_no_violation():
    for name in ("priority_aborts", "cache_pressure"):
        result = run_check_log(str(KEPT / f"{name}.yaml"), KEPT / f"{name}.log.jsonl", KEPT / f"{name}.trace.json",
                               with_conformance=True)
        assert result.violation is None
        assert result.conformance.share == 1.0, result.conformance.detail


@pytest.mark.parametrize("name", ["pressure_fcfs", "cache_pressure"])
def test_the_synchronous_model_disagrees(name, tmp_path):
    """The pipeline matters: the same logs under the synchronous policy (finishes and frees a step earlier) diverge
    on most steps."""
    rows, fl = CASES[name]
    conf = compare_with(rows, fl, KEPT / f"{name}.log.jsonl", name, tmp_path, importer=sync_import_args)
    assert conf.share < 0.5


def test_fresh_logs_agree(tmp_path):
    reason = absent_reason()
    if reason is not None:
        pytest.skip(reason)
    jobs = {"fresh_pressure": (trace(60, 31, gap=0.6), flags(60)),
            "fresh_cache": (trace(60, 32, gap=0.6, groups=3), flags(70, extra=("--enable-prefix-caching",))),
            "fresh_priority": (trace(60, 33, gap=0.7, priority=True, aborts=0.1),
                               flags(70, extra=("--policy", "priority"))),
            "fresh_eagle": (spec_trace(60, 34, gap=0.6, aborts=0.1), spec_flags("eagle", 3, 60, 34))}
    run_jobs(jobs, keep=tmp_path)
    for name, (rows, fl) in jobs.items():
        conf = compare(rows, fl, tmp_path / f"{name}.log.jsonl", name, tmp_path)
        assert conf.share >= 0.99, (name, conf.detail)
