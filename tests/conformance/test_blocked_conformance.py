"""Blocked waiting states (structured-output grammars not ready) and failed KV loads: the engine agrees with the real
vLLM 0.33 scheduler step by step on every case of tests/vllm_connector_harness.BLOCKED_CASES, compared on its
recorded real log (tests/data/vllm_blocked/, recorded by record_blocked(): no venv needed), under the policy `batchcheck
import vllm` makes from the driver's flags (queue.blocked_waiting skip where the trace has grammar_steps). The same
comparison with the new rules taken away diverges, so each case exercises them. (When the venv is present,
tests/conformance/test_vllm_connector_driver.py checks that a fresh driver run reproduces the kept logs byte for
byte, in its one driver process.)"""

from __future__ import annotations

import json

import pytest

from checker.checklog import conformance, load_arrivals, load_log, run_check_log
from tests.connector_logs import assert_agrees, policy_for
from tests.vllm_connector_harness import BLOCKED_CASES, BLOCKED_FIXTURES

CASES = sorted(BLOCKED_CASES)


@pytest.mark.parametrize("name", CASES)
def test_every_step_and_free_block_count_agrees_with_the_real_scheduler(name, tmp_path):
    rows, flags = BLOCKED_CASES[name]
    assert_agrees(rows, flags, BLOCKED_FIXTURES / f"{name}.log.jsonl", name, tmp_path)


def _without_new_rules(name: str, tmp_path):
    """The comparison with grammar_steps ignored (blocked_waiting off) and, for the failed loads, the other
    load_failure rule."""
    rows, flags = BLOCKED_CASES[name]
    policy = policy_for(flags, name)  # no rows: blocked_waiting stays off
    if any(r.get("load_fails") for r in rows):
        other = "fail" if policy.connector.load_failure == "recompute" else "recompute"
        policy = policy.model_validate({**policy.model_dump(mode="json"),
                                        "connector": {**policy.connector.model_dump(mode="json"),
                                                      "load_failure": other}})
    trace = tmp_path / f"{name}.trace.json"
    trace.write_text(json.dumps(rows))
    arrivals = load_arrivals(trace)
    return conformance(policy, arrivals, load_log(BLOCKED_FIXTURES / f"{name}.log.jsonl", arrivals))


@pytest.mark.parametrize("name", CASES)
def test_without_the_new_rules_the_engine_diverges(name, tmp_path):
    assert _without_new_rules(name, tmp_path).first_divergence is not None


def test_load_failures_end_or_restart_the_request(tmp_path):
    """fail: F ends with LOAD_FAILED in the output of step 1 (its 2-step load's report), blocks freed then;
    recompute: F is admitted from scratch (96 prompt tokens) when the scan next reaches it."""
    fail = [json.loads(x) for x in (BLOCKED_FIXTURES / "load_fail.log.jsonl").read_text().splitlines()]
    again = [json.loads(x) for x in (BLOCKED_FIXTURES / "load_fail_recompute.log.jsonl").read_text().splitlines()]
    assert "F" in fail[1]["finished"] and "F" not in fail[1]["scheduled"]
    assert again[2]["scheduled"]["F"] == 96


@pytest.mark.parametrize("name", CASES)
def test_check_log_finds_no_violation_in_the_real_logs(name, tmp_path):
    """check-log's reconstruction of each log (the pool request by request from its held/loading fields) passes its
    default invariants: a failed load under recompute restarts from no computed token (checklog.loaded_tokens)."""
    rows, flags = BLOCKED_CASES[name]
    trace = tmp_path / f"{name}.json"
    trace.write_text(json.dumps(rows))
    result = run_check_log(policy_for(flags, name, rows), BLOCKED_FIXTURES / f"{name}.log.jsonl", trace)
    assert result.violation is None and result.done == result.requests
