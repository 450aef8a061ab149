"""Issue 17's invariants find their planted failures (item 3): a preemption cascade found by verify with a minimal
replayed counterexample, its fix holding; a speculative policy whose lookahead slots are not reserved found by fuzz
with a shrunk, replayed counterexample, the reserving policy holding."""

from __future__ import annotations

import json

from checker.api import run_verify
from checker.verify.run import Verdict
from tests.helpers import POLICIES, ROOT

STORM = POLICIES / "broken" / "preemption_storm.yaml"


def test_verify_finds_the_preemption_cascade_with_a_minimal_replayed_counterexample(tmp_path):
    # a prompt longer than the pool, admitted chunk by chunk beside two short requests: its next chunk's 4 blocks do
    # not fit, so the running pass preempts both short requests and then the long one itself, in one step
    _, (result,) = run_verify(STORM, ["bounded_preemptions_per_step:2"], 3, 5, timeout_s=60, out_dir=tmp_path)
    assert result.verdict is Verdict.VIOLATED
    assert (result.requests, result.violation_step) == (3, 1)
    assert not result.notes  # minimality was checked: two requests can never be three preemptions
    doc = json.loads(result.counterexample.read_text())
    assert [r["preempted"] for r in doc["states"][1]["requests"]] == [True, True, True]  # all three, in one step
    shipped = [json.loads(p.read_text()) for p in (ROOT / "counterexamples").glob("preemption_storm__*.json")]
    assert [(len(d["requests"]), d["violation"]["iteration"]) for d in shipped] == [(3, 1)]


def test_rejecting_prompts_that_never_fit_bounds_the_cascade(tmp_path):
    # the fix: a request that can never fit the pool is rejected on arrival, so a request alone always fits and
    # preempting the others frees enough for it (at most two of three requests preempted in a step)
    fixed = tmp_path / "storm_fixed.yaml"
    fixed.write_text(STORM.read_text().replace("reject_never_fits: false", "reject_never_fits: true"))
    _, (bounded,) = run_verify(fixed, ["bounded_preemptions_per_step:2"], 3, 5, timeout_s=120, out_dir=tmp_path)
    assert bounded.verdict is Verdict.HOLDS_UP_TO
    # and for any number of iterations: whole-step induction, with the lemma that a request let in fits alone
    _, (proved,) = run_verify(fixed, ["bounded_preemptions_per_step:2"], 3, 5, timeout_s=120, out_dir=tmp_path,
                              unbounded=True, proof_dir=tmp_path)
    assert proved.verdict is Verdict.PROVED, proved.notes
    assert proved.certificate is not None and proved.certificate.exists()


UNRESERVED = POLICIES / "broken" / "eagle_unreserved_lookahead.yaml"
LOOKAHEAD_WORKLOAD = ROOT / "spec" / "workloads" / "weakness_unreserved_lookahead.yaml"


def _lookahead_counts(policy_path, requests):
    """The engine's frames on the trace (its arrivals are all at 0 ms: the fixed clock schedules it as the timed
    engine does): the first frame lookahead_fits fails and the most blocks it counts at any frame."""
    from checker.api import load_policy
    from checker.smt.ops import IntOps
    from checker.verify.counterexample import specs_from_json
    from checker.verify.replay import first_violation, replay_fixed_clock
    from invariants.catalogue import CATALOGUE, _kv_with_lookahead

    specs = specs_from_json([{**r, "tenant": 0} for r in requests])  # one tenant, by name in a fuzz file
    assert all(s.arrival_us == 0 and s.cancel_us is None for s in specs)
    replay = replay_fixed_clock(load_policy(policy_path), specs, 600, 10_000)
    assert all(r.status.name == "FINISHED" for r in replay.state.requests)
    peak = max(_kv_with_lookahead(IntOps, replay.ctx, t) for t in range(len(replay.frames)))
    return first_violation(CATALOGUE["lookahead_fits"], {}, replay), peak


def test_fuzz_finds_unreserved_lookahead_slots_with_a_shrunk_replayed_trace(tmp_path):
    from checker.api import run_fuzz

    (result,) = run_fuzz(UNRESERVED, LOOKAHEAD_WORKLOAD, None, ["lookahead_fits"], 200, time_budget_s=300, seed=1,
                         out_dir=tmp_path, database_dir=None)
    assert result.violated, result.line()
    assert len(result.trace) <= 3, result.trace
    doc = json.loads(result.counterexample.read_text())
    assert all(r.get("accepted") for r in doc["requests"])  # the verifier's choices travel with the trace
    # the invariant on the engine's frames fails on the same trace, and counts the metric's peak
    failing, peak = _lookahead_counts(UNRESERVED, doc["requests"])
    assert failing is not None and peak == result.outcome.observed > 32
    # reserving the lookahead slots (vLLM), the same trace keeps the invariant
    fixed = tmp_path / "reserved.yaml"
    fixed.write_text(UNRESERVED.read_text().replace("reserve_lookahead: false", "reserve_lookahead: true"))
    failing, peak = _lookahead_counts(fixed, doc["requests"])
    assert failing is None and peak <= 32


def test_reserving_the_lookahead_slots_leaves_fuzz_nothing_to_find(tmp_path):
    from checker.api import run_fuzz

    fixed = tmp_path / "reserved.yaml"
    fixed.write_text(UNRESERVED.read_text().replace("reserve_lookahead: false", "reserve_lookahead: true"))
    (result,) = run_fuzz(fixed, LOOKAHEAD_WORKLOAD, None, ["lookahead_fits"], 500, time_budget_s=300, seed=1,
                         out_dir=tmp_path, database_dir=None)
    assert not result.violated, result.line()
    assert result.examples == 500
