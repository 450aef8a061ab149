"""The symbolic step with the block pool (checker/smt/pool.py) equals the engine's step, field by field.

For policies with kv.prefix_caching.enabled (both planted-bug knobs drawn too) and scenarios whose prompts have
the identities the encoding accepts (own tokens, prefix groups 1 and 2, group 1 from its second block), the
encoding evaluated with IntOps equals the engine's step on every step, and evaluated by z3 (every input pinned,
a real solver query, the model read back) on a smaller number of steps: every request's fields, the globals,
the pool in its canonical form (block tables, cached-block counts, the LRU queue in order, each block's
reference count, hash and true chain, each hash's blocks in cache order) and the facts the cache invariants read.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from checker.engine import _Clock
from checker.errors import InputError
from checker.policy import Policy
from checker.requests import RequestSpec
from checker.semantics.state import TERMINAL, SchedulerState
from checker.semantics.step import step
from checker.smt import pool as P
from checker.smt.conformance import (Z3CacheStep, cache_capture, cache_int_outputs, cache_outputs_of_engine,
                                     cache_shape, differences)
from checker.strategies import SYMBOLIC_MODES, Scenario, small_policies
from tests.helpers import POLICIES

SETTINGS = dict(deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
STEP_US = 1000


@st.composite
def caching_policies(draw: st.DrawFn, block_sizes: tuple[int, ...] = (1, 2, 4, 4)) -> Policy:
    """small_policies with the cache on and what the cache requires (on-demand, checked, recompute-only)."""
    data = draw(small_policies(SYMBOLIC_MODES)).model_dump(mode="json")
    data["kv"].update(allocation="on_demand", check_allocation=True, swap_blocks=0,
                      block_size=draw(st.sampled_from(block_sizes)), num_blocks=draw(st.integers(2, 14)),
                      prefix_caching={"enabled": True, "count_evictable_hits": draw(st.sampled_from([True, True, False])),
                                      "chained_hashes": draw(st.sampled_from([True, True, False]))})
    data["preemption"]["mode"] = "recompute"
    if data["max_model_len"] < 12:  # room for prompts of a few blocks (a whole prompt fits a step without chunking)
        data["max_model_len"] = 12
        data["batch"]["max_num_batched_tokens"] = max(data["batch"]["max_num_batched_tokens"], 12)
    return Policy.model_validate(data)


@st.composite
def caching_scenarios(draw: st.DrawFn, max_requests: int = 4, max_prompt: int = 20, max_output: int = 6,
                      block_sizes: tuple[int, ...] = (1, 2, 4, 4)) -> Scenario:
    """Requests with the accepted identities (most of them sharing group 1), prompts at block boundaries or any
    length up to ``max_prompt``."""
    policy = draw(caching_policies(block_sizes))
    bs = policy.kv.block_size
    n = draw(st.integers(1, max_requests))
    arrivals = sorted(draw(st.lists(st.integers(0, 6), min_size=n, max_size=n)))
    specs = []
    for rid, at in enumerate(arrivals):
        prompt = draw(st.sampled_from([p for p in (bs, bs + 1, 2 * bs, 3 * bs - 1, 3 * bs) if p <= max_prompt])
                      | st.integers(1, max_prompt))
        output = draw(st.integers(1, max_output))
        ident = draw(st.sampled_from([0, 1, 1, 1, 2, 3, 3]))
        cancel = draw(st.none() | st.none() | st.integers(0, 8))
        specs.append(RequestSpec(rid=rid, arrival_us=at * STEP_US, prompt_len=prompt, output_len=output,
                                 max_output=output + draw(st.integers(0, 3)), priority=draw(st.integers(0, 3)),
                                 tenant=draw(st.integers(0, 1)), cls=0,
                                 cancel_us=None if cancel is None else (at + cancel) * STEP_US,
                                 content=P.identity_content(ident, prompt, bs)))
    return Scenario(policy, specs, 2, STEP_US)


def drive(sc: Scenario, max_steps: int = 30):
    """tests.helpers.drive with the pool captured too."""
    shape = cache_shape(sc.policy, sc.specs)
    s = SchedulerState(sc.policy, sc.specs, num_tenants=sc.num_tenants)
    clock = _Clock(s.requests)
    for k in range(max_steps):
        now = k * sc.step_us
        arrived, cancelled = clock.due(now)
        before = cache_capture(shape, s, cancelled, now)
        d = step(s, arrived, cancelled, now)
        yield shape, before, s, d
        if all(r.status in TERMINAL for r in s.requests) and not s.holding:
            return


# what the generated steps must have exercised, over the whole run (so that the suite is not vacuous)
SEEN: dict[str, int] = {}


@settings(max_examples=200, **SETTINGS)
@given(sc=caching_scenarios())
def test_int_evaluation_of_the_pool_encoding_equals_the_engine_step(sc):
    evictions = 0
    for k, (shape, before, after, d) in enumerate(drive(sc)):
        diff = differences(cache_outputs_of_engine(shape, after, d), cache_int_outputs(sc.policy, shape, before))
        assert not diff, f"step {k}: " + "; ".join(diff[:8])
        for what, happened in (("steps", True), ("hit", bool(d.cache_hits)), ("preemption", bool(d.preempted)),
                               ("cancel", bool(d.cancelled)), ("eviction", after.pool.evictions > evictions),
                               ("shared block", after.pool.facts(after.requests).shared > 0),
                               ("over-committed", after.kv_used > sc.policy.kv.num_blocks)):
            SEEN[what] = SEEN.get(what, 0) + int(happened)
        evictions = after.pool.evictions


def test_the_generated_steps_exercise_the_pool():
    """After the test above (same module, run in order): hits, evictions, sharing, preemption, cancellation and
    over-commitment (the uncounted-hits bug) all occurred on many steps."""
    if not SEEN:
        pytest.skip("run with the test above")
    assert SEEN["steps"] >= 1200, SEEN
    for what in ("hit", "preemption", "cancel", "eviction", "shared block", "over-committed"):
        assert SEEN[what] >= 10, SEEN


def test_z3_evaluation_of_the_pool_encoding_equals_the_engine_step():
    checked: list[int] = []

    @settings(max_examples=15, **SETTINGS)
    @given(sc=caching_scenarios(max_requests=2, max_prompt=8, max_output=3, block_sizes=(2, 4)))
    def one_scenario(sc):
        shape = cache_shape(sc.policy, sc.specs)
        z = Z3CacheStep(sc.policy, shape, sc.num_tenants)
        n = 0
        for k, (shape, before, after, d) in enumerate(drive(sc, max_steps=8)):
            diff = differences(cache_outputs_of_engine(shape, after, d), z.evaluate(before))
            assert not diff, f"step {k}: " + "; ".join(diff[:8])
            n += 1
        checked.append(n)

    one_scenario()
    assert sum(checked) >= 60, f"only {sum(checked)} steps checked against z3"


def test_the_shipped_caching_policies_on_a_small_pool_match_on_every_step():
    """The shipped caching policy and the two planted bugs, on their own pool sizes, with prompts that share a
    prefix, evict, and (for the uncounted-hits bug) over-commit: IntOps == engine on every step."""
    from checker.api import load_policy

    for path in (POLICIES / "prefix_caching" / "vllm_v1.yaml", POLICIES / "broken" / "vllm_v1_cache_uncounted_hits.yaml",
                 POLICIES / "broken" / "vllm_v1_cache_unchained_hashes.yaml"):
        policy = load_policy(path)
        if policy.kv.num_blocks > 16:
            policy = policy.model_copy(update={"kv": policy.kv.model_copy(update={"num_blocks": 16})})
        bs = policy.kv.block_size
        specs = [RequestSpec(rid=0, arrival_us=0, prompt_len=16 * bs - 1, output_len=3, max_output=3,
                             content=P.identity_content(1, 16 * bs - 1, bs)),
                 RequestSpec(rid=1, arrival_us=4 * STEP_US, prompt_len=3 * bs, output_len=2, max_output=2,
                             content=P.identity_content(3, 3 * bs, bs)),
                 RequestSpec(rid=2, arrival_us=4 * STEP_US, prompt_len=4 * bs, output_len=2, max_output=2,
                             content=P.identity_content(1, 4 * bs, bs))]
        sc = Scenario(policy, specs, 1, STEP_US)
        steps = 0
        for k, (shape, before, after, d) in enumerate(drive(sc)):
            diff = differences(cache_outputs_of_engine(shape, after, d), cache_int_outputs(policy, shape, before))
            assert not diff, f"{path.name} step {k}: " + "; ".join(diff[:8])
            steps += 1
        assert steps >= 6, path.name


def test_a_prompt_outside_the_accepted_identities_is_refused():
    policy = Policy.model_validate({"name": "p", "max_model_len": 64, "kv": {"num_blocks": 8, "block_size": 4,
                                                                              "prefix_caching": {"enabled": True}}})
    spec = RequestSpec(rid=0, arrival_us=0, prompt_len=8, output_len=2, max_output=2, content=((0, 8),))  # group 0
    s = SchedulerState(policy, [spec])
    with pytest.raises(InputError, match="IDENTITIES"):
        cache_capture(cache_shape(policy, [spec]), s, [], 0)
