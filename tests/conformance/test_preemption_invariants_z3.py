"""bounded_preemptions_per_step and preemption_frees_capacity are z3 terms on every policy the encoding covers: on
small pools of several shipped policies, verify's answer for each is the engine's (a z3 counterexample is replayed on
the engine, which must agree on every frame, else an internal error), and the minimal size it reports is the least
the engine reaches on brute force over the same small domain."""

from __future__ import annotations

import itertools

import pytest

from checker.api import load_policy, run_verify
from checker.requests import RequestSpec
from checker.verify.replay import first_violation, replay_fixed_clock
from checker.verify.run import Verdict
from invariants.catalogue import CATALOGUE
from tests.helpers import POLICIES

SMALL = {"kv": {"num_blocks": 6, "block_size": 16}, "max_model_len": 96}
CASES = ["vllm_v1", "strict_priority", "sarathi_serve", "broken/thrash_recompute"]


def small(name: str):
    policy = load_policy(POLICIES / f"{name}.yaml")
    kv = policy.kv.model_copy(update=SMALL["kv"])
    update = {"kv": kv, "max_model_len": SMALL["max_model_len"]}
    if not policy.chunking.enabled:
        update["batch"] = policy.batch.model_copy(update={"max_num_batched_tokens": max(
            policy.batch.max_num_batched_tokens, SMALL["max_model_len"])})
    return policy.model_copy(update=update)


def brute_force_least(policy, inv: str, params: dict, depth: int) -> int | None:
    """The fewest requests (all arriving at once, prompts and outputs from a small grid) whose engine run breaks
    the invariant within ``depth`` steps: an upper bound on what verify may call minimal."""
    grid = [(p, o) for p in (1, 16, 17, 48, 80) for o in (1, 8, 40)]
    for n in (1, 2, 3):
        for combo in itertools.product(grid, repeat=n):
            specs = [RequestSpec(i, 0, p, o, o) for i, (p, o) in enumerate(combo)]
            if first_violation(CATALOGUE[inv], params, replay_fixed_clock(policy, specs, depth, 10_000)) is not None:
                return n
    return None


@pytest.mark.parametrize("name", CASES)
def test_verify_agrees_with_the_engine_on_preemptions(tmp_path, name):
    policy = small(name)
    specs = ["bounded_preemptions_per_step:0", "bounded_preemptions_per_step:1", "preemption_frees_capacity"]
    _, results = run_verify(policy, specs, 3, 4, timeout_s=120, out_dir=tmp_path, unbounded=False)
    verdicts = {r.label: r for r in results}
    assert all(r.verdict in (Verdict.VIOLATED, Verdict.HOLDS_UP_TO, Verdict.VACUOUS) for r in results), verdicts
    assert results[2].verdict is not Verdict.VIOLATED  # a victim's blocks are never fenced in this model
    for r, (inv, params) in zip(results[:2], [("bounded_preemptions_per_step", {"p": 0}),
                                              ("bounded_preemptions_per_step", {"p": 1})]):
        least = brute_force_least(policy, inv, params, 4)
        if least is not None:  # the engine breaks it on the grid: z3 must too, with no more requests
            assert r.verdict is Verdict.VIOLATED and r.requests <= least, (r.label, least)
