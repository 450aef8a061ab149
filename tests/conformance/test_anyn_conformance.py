"""The any-N proof's instance (checker/verify/anyn_model.py: cursor and victim kept, sums over the rest) computes
what the concrete N-slot step computes, for N = 1..4 on random states, for every shipped policy the method
covers; and the comparison can fail (a wrong instance is caught)."""

from __future__ import annotations

import pytest

from checker.api import load_policy
from checker.verify import anyn_model
from checker.verify.anyn_conformance import compare_random
from tests.helpers import POLICIES

COVERED = ["vllm_v1.yaml", "orca.yaml", "sarathi_serve.yaml", "static_batching.yaml", "strict_priority.yaml",
           "tiered_shedding.yaml", "trtllm_guaranteed_no_evict.yaml", "vllm_v0_no_chunking.yaml",
           "priority_aging.yaml", "tgi_router.yaml", "vtc_fair.yaml",
           "broken/unchecked_growth.yaml"]


@pytest.mark.parametrize("policy", COVERED)
def test_instance_equals_the_concrete_action(policy):
    pol = load_policy(POLICIES / policy)
    assert anyn_model.not_covered(pol) == []
    mismatches, states = compare_random(pol, states_per_size=60, seed=7)
    assert states == 2 * 4 * 60
    assert mismatches == []


def test_an_instance_that_ignores_the_rest_is_caught(monkeypatch):
    """kv_used without the rest's blocks: rounds decide differently once the small pool fills."""
    monkeypatch.setattr(anyn_model.RestState, "kv_used",
                        property(lambda self: sum(slot["blocks"] for slot in self.slots)))
    mismatches, _ = compare_random(load_policy(POLICIES / "vllm_v1.yaml"), states_per_size=60, sizes=(4, 5, 6),
                                   seed=0)
    assert any("blocks=" in m or "sched=" in m or "status=" in m for m in mismatches)


def test_a_victim_choice_limited_to_the_cursor_is_caught(monkeypatch):
    monkeypatch.setattr(anyn_model.RestStep, "last", lambda self, cand, keys: [cand[0]] + [False] * (self.n - 1))
    mismatches, _ = compare_random(load_policy(POLICIES / "vllm_v1.yaml"), states_per_size=40, seed=0)
    assert any("status=" in m for m in mismatches)


@pytest.mark.parametrize("policy", ["vllm_v1.yaml", "orca.yaml", "tiered_shedding.yaml", "vllm_v0_no_chunking.yaml"])
def test_instance_equals_the_concrete_action_from_every_state_of_the_predicate(policy):
    """z3: at N = 4 (three slots kept, one summed), for every state the proof's predicate allows, every (cursor,
    victim) case of every round, and every slot of every per-slot map."""
    from checker.verify import anyn, anyn_symbolic

    pol = load_policy(POLICIES / policy)
    proof = anyn.prove(pol)
    assert proof.status == "done"
    before = anyn_symbolic.QUERIES[0]
    assert anyn_symbolic.check_rounds(pol, 4, proof.alive) == []
    assert anyn_symbolic.check_maps(pol, 4, proof.alive) == []
    assert anyn_symbolic.QUERIES[0] - before >= 10  # cases that can happen were posed, not all filtered out


def test_the_symbolic_check_catches_a_wrong_instance(monkeypatch):
    from checker.verify import anyn, anyn_symbolic

    pol = load_policy(POLICIES / "vllm_v1.yaml")
    proof = anyn.prove(pol)
    monkeypatch.setattr(anyn_model.RestState, "kv_used",
                        property(lambda self: sum(slot["blocks"] for slot in self.slots)))
    assert any(p.endswith(": sat") for p in anyn_symbolic.check_rounds(pol, 4, proof.alive))
    monkeypatch.setattr(anyn_model.RestStep, "cancel", lambda self: None)
    assert any(p.endswith(": sat") for p in anyn_symbolic.check_maps(pol, 2, proof.alive))


def test_admission_limits_answered_freely_match_the_concrete_arrivals(monkeypatch):
    """tgi_router's max_inflight: the instance answers "over the limit" freely; the concrete arrival's answer must
    be one of its answers (a variant with max_inflight 2 makes arrivals hit it), and an instance that never
    rejects is caught."""
    pol = load_policy(POLICIES / "tgi_router.yaml")
    assert anyn_model.not_covered(pol) == []
    assert compare_random(pol, states_per_size=60, seed=3)[0] == []
    monkeypatch.setattr(anyn_model.RestStep, "admission_limits", lambda self, i, w, r, q: (False, False))
    assert any("status=" in m for m in compare_random(pol, states_per_size=60, seed=3)[0])
