"""The engine under a stateful Hypothesis test: arrive / cancel / step rules, invariants after every step."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings

from checker.api import load_policy
from checker.errors import InternalError
from checker.fuzz.stateful import machine_for
from tests.helpers import POLICIES


@pytest.mark.parametrize("name", ["vllm_v1", "trtllm_max_utilization", "strict_priority", "tgi_router", "vtc_fair"])
def test_engine_keeps_the_catalogue_under_any_event_sequence(name):
    policy = load_policy(POLICIES / f"{name}.yaml")
    small = policy.model_copy(update={"kv": policy.kv.model_copy(update={"num_blocks": 40})})
    machine = machine_for(small)
    machine.TestCase.settings = settings(max_examples=40, stateful_step_count=40, deadline=None, derandomize=True,
                                         database=None, suppress_health_check=list(HealthCheck))
    machine.TestCase().runTest()


def test_the_machine_catches_a_broken_engine(monkeypatch):
    """The stateful test can fail: with the KV check removed from admission, over-commit is caught."""
    from checker.semantics import kv

    policy = load_policy(POLICIES / "vllm_v1.yaml")
    small = policy.model_copy(update={"kv": policy.kv.model_copy(update={"num_blocks": 8})})
    monkeypatch.setattr(kv, "can_admit", lambda s, r, n, hit=kv.NO_HIT: True)
    machine = machine_for(small)
    machine.TestCase.settings = settings(max_examples=60, stateful_step_count=40, deadline=None, derandomize=True,
                                         database=None, suppress_health_check=list(HealthCheck))
    with pytest.raises((AssertionError, InternalError), match="blocks used > num_blocks|kv_never_overcommitted broken"):
        machine.TestCase().runTest()


@pytest.mark.parametrize("name", ["vllm_v1", "strict_priority", "trtllm_max_utilization"])
def test_engine_keeps_the_frame_invariants_of_issue_17(name):
    """A victim's blocks are back in the pool within its step, and (no drafter) lookahead_fits is the KV count."""
    policy = load_policy(POLICIES / f"{name}.yaml")
    small = policy.model_copy(update={"kv": policy.kv.model_copy(update={"num_blocks": 24})})
    machine = machine_for(small, ("preemption_frees_capacity", "lookahead_fits"))
    machine.TestCase.settings = settings(max_examples=40, stateful_step_count=40, deadline=None, derandomize=True,
                                         database=None, suppress_health_check=list(HealthCheck))
    machine.TestCase().runTest()


def test_the_machine_finds_the_preemption_cascade():
    """On the planted storm (spec/policies/broken/preemption_storm.yaml) some step preempts two requests."""
    machine = machine_for(load_policy(POLICIES / "broken" / "preemption_storm.yaml"), ("bounded_preemptions_per_step",))
    machine.TestCase.settings = settings(max_examples=200, stateful_step_count=30, deadline=None, derandomize=True,
                                         database=None, suppress_health_check=list(HealthCheck))
    with pytest.raises(AssertionError, match="bounded_preemptions_per_step broken"):
        machine.TestCase().runTest()
