"""diff's SLO witnesses mean something for the declared SLO (issue 19 item 8), undecided rows say so, and
the summary gives a one-line reason per regression (issue 19, "Decisive, fast defaults")."""

from __future__ import annotations

from checker.diff.compare import Change, PropertyDiff, Side
from checker.diff.run import DiffReport
from checker.diff.slo import Comparison, Tolerance, compare, counts, samples_needed
from checker.fuzz.slo import LatencyBound, Outcome
from checker.fuzz.strategies import Draw
from checker.inputfiles import load_policy
from checker.loading import load_model
from checker.profile import load_profile
from checker.workload import Workload
from tests.helpers import POLICIES, WORKLOADS

TTFT_P99 = LatencyBound(kind="latency", name="interactive_ttft_p99", **{"class": "interactive"}, metric="ttft_ms",
                        stat="p99", bound_ms=3000)
LOOSE_P99 = TTFT_P99.model_copy(update={"bound_ms": 1e6})
TTFT_MAX = TTFT_P99.model_copy(update={"name": "interactive_ttft_max", "stat": "max"})


def test_a_worse_p99_on_two_requests_that_meet_the_slo_is_no_witness():
    c = Comparison(Outcome(True, 698.7, 3000, "x"), Outcome(True, 2100.0, 3000, "x"), samples=2)
    assert Tolerance().worse(c.new.observed, c.old.observed)  # what diff took for a regression before
    assert c.why(TTFT_P99, True) is None
    assert not counts(c, TTFT_P99, Tolerance(), True)
    assert samples_needed(TTFT_P99) == (100, "a ttft_ms p99")


def test_a_witness_breaks_the_declared_slo_or_is_large_enough_and_says_which():
    broken = Comparison(Outcome(True, 2740.7, 3000, "x"), Outcome(False, 7353.5, 3000, "x"), samples=9)
    assert broken.why(TTFT_P99, True) == "breaks the declared SLO (allowed 3000) where the other meets it"
    assert counts(broken, TTFT_P99, Tolerance(), True)
    large = Comparison(Outcome(True, 600.0, 3000, "x"), Outcome(True, 900.0, 3000, "x"), samples=120)
    assert large.why(TTFT_P99, True) == "120 requests of its group, enough for a ttft_ms p99 (at least 100)"
    assert counts(large, TTFT_P99, Tolerance(), True)
    assert not counts(large, TTFT_P99, Tolerance(must_violate=True), True)  # --slo-gate violates
    small_max = Comparison(Outcome(True, 8.0, 3000, "x"), Outcome(True, 32.0, 3000, "x"), samples=2)
    assert small_max.why(TTFT_MAX, True) == "2 requests of its group, enough for a ttft_ms max (at least 1)"


def test_on_the_engine_a_two_request_trace_worse_under_one_slot_is_no_p99_witness():
    old = load_policy(POLICIES / "vllm_v1.yaml")
    new = old.model_copy(update={"batch": old.batch.model_copy(update={"max_num_seqs": 1}), "name": "one_slot"})
    workload = load_model(Workload, WORKLOADS / "chat_mixed.yaml")
    profile = load_profile(None)
    trace = [Draw(0, 0, 3000, 200), Draw(0, 0, 3000, 200)]  # two interactive requests at once
    c = compare(old, new, workload, profile, LOOSE_P99, trace)
    assert c.samples == 2 and c.old.holds and c.new.holds
    assert Tolerance().worse(c.new.observed, c.old.observed)  # NEW is worse on it: the second request waits
    assert not counts(c, LOOSE_P99, Tolerance(), True)


def test_undecided_rows_say_undecided_and_the_summary_names_each_regression():
    unknown = PropertyDiff("invariant", "kv_never_overcommitted", "UNKNOWN", "UNKNOWN", Change.UNKNOWN)
    assert unknown.summary_line().split()[0] == "undecided"
    slo = PropertyDiff("slo", "interactive_ttft_p99", "holds (698.727)", "holds (663.577)", Change.LESS_SAFE,
                       new_worse=Side(9, 9, None, "9 request(s): interactive ttft_ms p99 old 2740.71 -> new 7353.47 "
                                      "(allowed 3000.0); it breaks the declared SLO (allowed 3000) where the other "
                                      "meets it", "on a 9-request witness 2740.71 -> 7353.47 (allowed 3000): breaks "
                                      "the declared SLO (allowed 3000) where the other meets it"))
    assert slo.summary_line() == (
        "REGRESSION interactive_ttft_p99              strictly less safe  holds (698.727) -> holds (663.577); on a "
        "9-request witness 2740.71 -> 7353.47 (allowed 3000): breaks the declared SLO (allowed 3000) where the "
        "other meets it")
    old = load_policy(POLICIES / "vllm_v1.yaml")
    new = old.model_copy(update={"name": "small_budget"})
    report = DiffReport(old, new, "old.yaml", "new.yaml", None, [unknown, slo],
                        changed_fields=["batch.max_num_batched_tokens: 8192 -> 512"])
    lines = report.text().splitlines()
    assert lines[1:4] == [
        "changed: batch.max_num_batched_tokens: 8192 -> 512",
        "why interactive_ttft_p99: NEW worse, 9 request(s): interactive ttft_ms p99 old 2740.71 -> new 7353.47 "
        "(allowed 3000.0); it breaks the declared SLO (allowed 3000) where the other meets it",
        "undecided: kv_never_overcommitted (a search timed out: raise --timeout, or lower --requests / --depth)"]
