"""The liveness explorer finds the planted lookahead deadlock (spec/policies/broken/eagle_lookahead_deadlock.yaml) and
proves its fix, synchronously and with a batch in flight (async scheduling).

The find asserts the lasso's shape, that it replays on the engine (prefix + two turns), and that it is checked into
counterexamples/ (tests/regression replays them all). The fix (vLLM's rule: preempt when a running request cannot
grow) is PROVED on the complete graph of the same instance; the same instance without speculative decoding has no
lasso (the deadlock is the lookahead's).
"""

from __future__ import annotations

import json

import pytest

from checker.api import run_liveness
from checker.liveness.check import PROVED, VIOLATED
from checker.verify.replay import replay_counterexample
from tests.helpers import POLICIES, ROOT

DEADLOCK = POLICIES / "broken" / "eagle_lookahead_deadlock.yaml"
FIX = ["preemption.triggers=[kv_growth_fails]"]
ASYNC = ["pipeline.in_flight=1"]
INSTANCE = {"requests": 2, "prompts": (8,), "outputs": (2,)}  # two 8-token prompts side by side on 2 blocks


def _verdicts(report) -> dict[str, str]:
    return {r.prop: r.verdict for r in report.results}


@pytest.mark.parametrize("overrides,prefix", [([], 1), (ASYNC, 2)], ids=["sync", "async"])
def test_finds_the_lookahead_deadlock_and_replays_it(tmp_path, overrides, prefix):
    report = run_liveness(DEADLOCK, ["no_deadlock", "eventually_served"], **INSTANCE, overrides=overrides,
                          out_dir=tmp_path)
    assert report.graph.complete and _verdicts(report) == {"no_deadlock": VIOLATED, "eventually_served": VIOLATED}
    result = report.results[0]
    assert (len(result.lasso.prefix), len(result.lasso.cycle)) == (prefix, 1)
    replayed = replay_counterexample(result.counterexample)
    assert replayed.violation == replayed.recorded_violation == prefix + 1
    if not overrides:  # the synchronous lasso is checked in
        shipped = ROOT / "counterexamples" / result.counterexample.name
        assert shipped.exists(), f"check in the lasso: cp {result.counterexample} counterexamples/"
        doc = json.loads(shipped.read_text())
        assert doc["lasso"]["prefix_iterations"] == prefix and doc["lasso"]["cycle_iterations"] == 1
        assert doc["environment"]["accepted_drafts"] == [0, 1, 2, 3, 4]
    # both requests hold a block each and ask for a second one (the lookahead's), forever
    last = replayed.replay.frames[-1]
    assert last.kv_used == 2 and not any(last.scheduled)


@pytest.mark.parametrize("overrides", [FIX, FIX + ASYNC], ids=["sync", "async"])
def test_preempting_on_growth_proves_the_fix(tmp_path, overrides):
    report = run_liveness(DEADLOCK, **INSTANCE, overrides=overrides, out_dir=tmp_path)
    assert report.graph.complete
    assert set(_verdicts(report).values()) == {PROVED}, _verdicts(report)


def test_the_worst_case_acceptance_finds_it_too_and_without_drafts_there_is_no_lasso(tmp_path):
    worst = run_liveness(DEADLOCK, ["no_deadlock"], **INSTANCE, accepted=(0,), out_dir=tmp_path)
    assert _verdicts(worst) == {"no_deadlock": VIOLATED}
    plain = run_liveness(DEADLOCK, **INSTANCE, overrides=["speculative.method=none", "speculative.num_tokens=0"],
                         out_dir=tmp_path)
    assert plain.graph.complete and VIOLATED not in _verdicts(plain).values()
