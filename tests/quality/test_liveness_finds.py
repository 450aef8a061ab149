"""What `batchcheck liveness` must find and prove (issue 9's "done when"), cross-checked with z3.

Each find asserts the lasso, that it replays on the engine (prefix + two turns), and that a lasso of the
same shape is checked into counterexamples/ (tests/regression replays them all). Where the graph proves
eventually_served, the derived starvation bound must agree with z3's bounded_starvation(S).
"""

from __future__ import annotations

import json

import pytest

from checker.api import apply_overrides, load_policy, run_liveness
from checker.liveness.check import PROVED, VIOLATED
from checker.verify.env import Environment
from checker.verify.replay import replay_counterexample
from checker.verify.run import Verdict, check_one
from invariants.catalogue import CATALOGUE
from tests.helpers import POLICIES, ROOT

ONE_SEQ = ["batch.max_num_seqs=1"]  # a single running slot: a high-priority stream can hold it forever

FINDS = [
    # (policy, overrides, requests, prompts, outputs, property, prefix, cycle)
    ("strict_priority", ONE_SEQ, 2, (16,), (1, 2), "eventually_served", 1, 1),  # a high-priority stream
    ("broken/thrash_recompute", [], 1, (160,), (1,), "no_livelock", 3, 3),  # a never-fitting prompt thrashes
    ("broken/vllm_v1_small_pool", [], 2, (600, 16), (1, 2), "no_deadlock", 1, 1),  # a head larger than the pool
]


def _verdicts(report) -> dict[str, str]:
    return {r.prop: r.verdict for r in report.results}


@pytest.mark.parametrize("policy,overrides,requests,prompts,outputs,prop,prefix,cycle", FINDS,
                         ids=[f"{p}:{prop}" for p, _, _, _, _, prop, *_ in FINDS])
def test_finds_the_lasso_replays_it_and_it_is_checked_in(tmp_path, policy, overrides, requests, prompts, outputs,
                                                         prop, prefix, cycle):
    report = run_liveness(POLICIES / f"{policy}.yaml", [prop], requests, prompts, outputs, overrides=overrides,
                          out_dir=tmp_path)
    (result,) = report.results
    assert result.verdict == VIOLATED and report.graph.complete
    assert (len(result.lasso.prefix), len(result.lasso.cycle)) == (prefix, cycle)
    replayed = replay_counterexample(result.counterexample)
    assert replayed.violation == replayed.recorded_violation == prefix + 2 * cycle - 1
    shipped = ROOT / "counterexamples" / result.counterexample.name
    assert shipped.exists(), f"check in the lasso: cp {result.counterexample} counterexamples/"
    doc = json.loads(shipped.read_text())
    assert doc["lasso"]["prefix_iterations"] == prefix and doc["lasso"]["cycle_iterations"] == cycle


def test_trtllm_max_utilization_thrashes_on_a_pool_smaller_than_a_prompt(tmp_path):
    report = run_liveness(POLICIES / "trtllm_max_utilization.yaml", ["no_livelock"], 1, (160,), (1,),
                          overrides=["kv.num_blocks=4", "chunking.long_prefill_token_threshold=64",
                                     "admission.reserve_full_prompt=false"], out_dir=tmp_path)
    assert _verdicts(report) == {"no_livelock": VIOLATED}


def test_rejecting_requests_that_never_fit_proves_all_three(tmp_path):
    report = run_liveness(POLICIES / "broken" / "vllm_v1_small_pool.yaml", None, 2, (600, 16), (1, 2),
                          overrides=["admission.reject_never_fits=true"], out_dir=tmp_path)
    assert _verdicts(report) == {"eventually_served": PROVED, "no_livelock": PROVED, "no_deadlock": PROVED}
    assert report.graph.complete and not list(tmp_path.iterdir())


def _z3(policy, requests: int, depth: int, steps: int, step_us: int, outputs=(1, 2)):
    env = Environment(requests, depth, (16, 16), outputs, max(outputs), (0, 1), 1, False, step_us)
    return check_one(policy, None, CATALOGUE["bounded_starvation"], {"steps": steps}, env, 120, None).verdict


def test_z3_violates_bounded_starvation_for_every_s_tried_and_the_graph_has_a_lasso(tmp_path):
    report = run_liveness(POLICIES / "strict_priority.yaml", ["eventually_served"], 2, (16,), (1, 2),
                          overrides=ONE_SEQ, out_dir=tmp_path)
    assert _verdicts(report) == {"eventually_served": VIOLATED}
    assert report.bound.bound.iterations is None  # no bound: a request can wait forever
    policy = apply_overrides(load_policy(POLICIES / "strict_priority.yaml"), ONE_SEQ)
    for s in (1, 2):  # s + 1 high-priority requests keep the low-priority one out for s iterations
        assert _z3(policy, s + 1, s + 2, s, 10_000) is Verdict.VIOLATED


def test_priority_aging_is_proved_and_its_starvation_bound_agrees_with_z3(tmp_path):
    step_us = 500_000  # the 1 s aging interval is 2 iterations
    report = run_liveness(POLICIES / "priority_aging.yaml", None, 2, (16,), (1,), overrides=ONE_SEQ,
                          step_ms=step_us / 1000, out_dir=tmp_path)
    assert _verdicts(report) == {"eventually_served": PROVED, "no_livelock": PROVED, "no_deadlock": PROVED}
    bound = report.bound
    assert bound.bound.iterations == 2 and bound.engine_iteration is not None
    assert bound.line().startswith("starvation bound: 2 iteration(s): bounded_starvation(2) holds for this "
                                   "instance and bounded_starvation(1) does not")
    policy = apply_overrides(load_policy(POLICIES / "priority_aging.yaml"), ONE_SEQ)
    # z3 with 2 slots (a subset of the graph's traces: at most 2 requests in flight) cannot break the bound...
    assert _z3(policy, 2, 4, 2, step_us, (1, 1)) is Verdict.HOLDS_UP_TO
    # ...and the bound is tight: z3 finds the violation of bound - 1 with the witness's requests and depth.
    witness_depth = bound.bound.arrival_iteration + bound.bound.iterations
    assert _z3(policy, bound.witness_requests, witness_depth, 1, step_us, (1, 1)) is Verdict.VIOLATED
