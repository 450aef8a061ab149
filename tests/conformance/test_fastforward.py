"""Fast-forward over quiet decode stretches (checker/fastforward.py) equals plain stepping."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from checker.api import load_policy
from checker.engine import simulate
from checker.profile import load_profile
from checker.requests import RequestSpec
from checker.strategies import small_policies
from checker.traces import RequestSet, load_requests
from tests.helpers import POLICIES, WORKLOADS

PROFILE = load_profile(None)
MAX_STEPS = 50_000


def _same(policy, rs):
    fast = simulate(policy, rs, PROFILE, fast_forward=True, max_steps=MAX_STEPS)
    plain = simulate(policy, rs, PROFILE, fast_forward=False, max_steps=MAX_STEPS)
    assert not plain.step_limit_hit, "a small trace ran past the step limit: the engine did not stop"
    assert fast.state.snapshot() == plain.state.snapshot()
    a, b = fast.summary(), plain.summary()
    a["engine"].pop("wall_s"), b["engine"].pop("wall_s")
    assert a == b
    return fast, plain


@st.composite
def decode_heavy(draw):
    policy = draw(small_policies())
    n = draw(st.integers(1, 10))
    specs, t = [], 0
    for rid in range(n):
        t += draw(st.integers(0, 200_000))
        output = draw(st.integers(1, 60))
        cancel = draw(st.none() | st.integers(0, 400_000))
        specs.append(RequestSpec(rid=rid, arrival_us=t, prompt_len=draw(st.integers(1, policy.max_model_len)),
                                 output_len=output, max_output=output + draw(st.integers(0, 5)),
                                 priority=draw(st.integers(0, 2)), tenant=draw(st.integers(0, 1)),
                                 cancel_us=None if cancel is None else t + cancel))
    return policy, RequestSet(specs, ["c"], ["a", "b"], "generated")


@settings(max_examples=200, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(case=decode_heavy())
def test_fast_forward_equals_plain_stepping_on_generated_traces(case):
    _same(*case)


@pytest.mark.parametrize("policy", sorted(p.name for p in POLICIES.glob("*.yaml")))
def test_fast_forward_equals_plain_stepping_on_the_shipped_workload(policy):
    rs = load_requests(workload=WORKLOADS / "chat_mixed.yaml")
    fast, plain = _same(load_policy(POLICIES / policy), rs)
    assert fast.steps == plain.steps
