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
    _, (result,) = run_verify(fixed, ["bounded_preemptions_per_step:2"], 3, 5, timeout_s=120, out_dir=tmp_path)
    assert result.verdict is Verdict.HOLDS_UP_TO
