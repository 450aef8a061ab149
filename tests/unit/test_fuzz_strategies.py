"""The fuzzer's trace strategies: every stress draws requests inside the workload's ranges, a record of
zero bytes decodes to the simplest request, and the trace shape options hold."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, find, given, settings
from hypothesis import strategies as st

from checker.api import load_policy
from checker.fuzz.strategies import STRESSES, Draw, _scale, adversarial, ranges, request_maker
from checker.loading import load_model
from checker.workload import Workload
from tests.helpers import POLICIES, WORKLOADS

QUICK = settings(max_examples=25, deadline=None, database=None, derandomize=True,
                 suppress_health_check=list(HealthCheck))


@given(st.integers(0, 0xFFFF), st.integers(0, 0xFFFF), st.integers(0, 5000), st.integers(0, 5000))
@QUICK
def test_scaled_is_monotone_within_bounds_and_zero_is_the_floor(a, b, lo, width):
    hi = lo + width
    x, y = sorted((a, b))
    scale = _scale(lo, hi)
    assert lo <= scale(x) <= scale(y) <= hi
    assert scale(0) == lo and scale(0xFFFF) == hi


@pytest.mark.parametrize("workload,policy", [("chat_mixed", "vllm_v1"), ("tiered_normal", "tiered_shedding")])
@pytest.mark.parametrize("stress", list(STRESSES))
def test_every_stress_stays_in_the_workload_ranges(stress, workload, policy):
    w = load_model(Workload, WORKLOADS / f"{workload}.yaml")
    r = ranges(w)

    @QUICK
    @given(STRESSES[stress](r, load_policy(POLICIES / f"{policy}.yaml"), 20))
    def check(trace: list[Draw]) -> None:
        assert trace
        for d in trace:
            assert 0 <= d.cls < len(w.classes) and d.gap_ms >= 0
            assert r.prompt[d.cls][0] <= d.prompt <= r.prompt[d.cls][1]
            assert r.output[d.cls][0] <= d.output <= r.output[d.cls][1]
            assert d.cancel_after_ms is None or d.cancel_after_ms >= 0
    check()


def test_the_zero_record_is_the_simplest_request():
    w = load_model(Workload, WORKLOADS / "chat_mixed.yaml")
    r = ranges(w)
    plain = STRESSES["plain"](r, load_policy(POLICIES / "vllm_v1.yaml"), 20)
    # the shrinker's goal for one request: first class, gap 0, shortest prompt and output
    assert find(plain, lambda t: True, settings=QUICK) == [Draw(0, 0, r.prompt[0][0], r.output[0][0], None)]


def test_min_requests_and_one_segment_give_traces_of_exactly_that_many():
    w = load_model(Workload, WORKLOADS / "chat_mixed.yaml")
    sizes = []

    @QUICK
    @given(adversarial(w, load_policy(POLICIES / "vllm_v1.yaml"), 20, None, min_requests=20, max_segments=1))
    def check(trace: list[Draw]) -> None:
        sizes.append(len(trace))
    check()
    assert set(sizes) == {20}


def test_request_maker_converts_gaps_classes_and_cancels():
    w = load_model(Workload, WORKLOADS / "chat_mixed.yaml")
    trace = [Draw(5, 1, 3000, 200), Draw(0, 0, 100, 20, 40)]
    rs = request_maker(w)(trace, "x")
    a, b = rs.specs
    assert (a.arrival_us, a.cls, a.prompt_len, a.output_len, a.priority, a.cancel_us) == (5000, 1, 3000, 200, 5, None)
    assert (b.arrival_us, b.tenant, b.max_output, b.cancel_us) == (5000, w.tenants.index("app"), 1000, 45000)
