"""The liveness explorer finds the planted blocked-waiting stall (tests/data/blocked/vllm_v1_blocked_stop.yaml: the
waiting scan stops at a request whose structured-output grammar is not ready) and proves its fix
(vllm_v1_blocked_skip.yaml, vLLM 0.33's skip).

The grammar delay is the environment's choice (docs/liveness.md, "Blocked waiting states"): a grammar may stay
blocked forever, and such a request is excluded from eventually_served (it can never be served). Under stop a
request WITHOUT a grammar waits forever behind one blocked for good: a lasso, replayed on the engine (prefix + two
turns) and checked into counterexamples/ (tests/regression replays them all). Under skip the same instance is PROVED.
"""

from __future__ import annotations

import json

import pytest

from checker.api import run_liveness
from checker.liveness.check import PROVED, VIOLATED
from checker.semantics.state import Status
from checker.verify.replay import replay_counterexample
from tests.helpers import ROOT

BLOCKED = ROOT / "tests" / "data" / "blocked"
STOP, SKIP = BLOCKED / "vllm_v1_blocked_stop.yaml", BLOCKED / "vllm_v1_blocked_skip.yaml"
INSTANCE = {"requests": 2, "prompts": (16,), "outputs": (1, 2)}
ONE_SEAT = {"requests": 3, "prompts": (16,), "outputs": (1, 2), "overrides": ["batch.max_num_seqs=1"]}


def _verdicts(report) -> dict[str, str]:
    return {r.prop: r.verdict for r in report.results}


def test_stop_leaves_a_request_without_a_grammar_waiting_forever(tmp_path):
    report = run_liveness(STOP, ["eventually_served", "no_deadlock"], **INSTANCE, out_dir=tmp_path)
    assert report.graph.complete
    assert _verdicts(report) == {"eventually_served": VIOLATED, "no_deadlock": VIOLATED}
    result = report.results[0]
    assert (len(result.lasso.prefix), len(result.lasso.cycle)) == (1, 1)
    replayed = replay_counterexample(result.counterexample)
    assert replayed.violation == replayed.recorded_violation == 2
    doc = json.loads(result.counterexample.read_text())
    grammar = [r.get("grammar_steps", 0) for r in doc["requests"]]
    assert grammar[0] > doc["lasso"]["replayed_iterations"] and grammar[1:] == [0]  # blocked throughout; plain
    last = replayed.replay.frames[-1]
    assert [slot["status"] for slot in last.slots] == [int(Status.WAITING)] * 2  # both wait
    assert not any(last.scheduled)  # and nothing runs
    shipped = ROOT / "counterexamples" / result.counterexample.name
    assert shipped.exists(), f"check in the lasso: cp {result.counterexample} counterexamples/"
    assert json.loads(shipped.read_text())["requests"] == doc["requests"]


@pytest.mark.parametrize("instance", [INSTANCE, ONE_SEAT], ids=["two", "three-one-seat"])
def test_skip_is_proved(tmp_path, instance):
    report = run_liveness(SKIP, **instance, out_dir=tmp_path)
    assert report.graph.complete
    assert set(_verdicts(report).values()) == {PROVED}, _verdicts(report)
    stop = run_liveness(STOP, ["eventually_served"], **instance, out_dir=tmp_path)  # the same instance finds the bug
    assert _verdicts(stop) == {"eventually_served": VIOLATED}
