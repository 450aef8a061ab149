"""The step's fast paths (checker/semantics/step.py) equal the general paths they stand for, step by step.

- ``_running_pass``: a decode that fits its blocks or needs one block the pool has is scheduled inline,
  with block identity too (the block taken from the pool, the block the token fills cached, as kv.allocate
  does); by definition every running request goes through ``_serve_running``.
- ``_waiting_pass`` walks the queue itself instead of a copy of it taken as the pass begins.

Each generated case is run twice with the engine recording every step, once as shipped and once with the
definitions below in place of the fast paths: the decisions of every step, the final state and the block
pool (its dicts in their order) must be the same.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import checker.semantics.step as step_module
from checker.engine import simulate
from checker.policy import Policy
from checker.profile import load_profile
from checker.requests import RequestSpec, content_from_prefix_group
from checker.semantics.step import _serve_running, _try_admit
from checker.strategies import small_policies
from checker.traces import RequestSet
from tests.conformance.test_fastforward import _caching, decode_heavy, decode_heavy_with_shared_prompts

PROFILE = load_profile(None)
MAX_STEPS = 20_000


def running_pass_by_definition(s, budget, out, prefill_only=False):
    running = s.running
    i = 0
    while i < len(running) and budget.tokens > 0:
        r = running[i]
        if r.rid in out.scheduled or (prefill_only and not r.in_prefill):
            i += 1
            continue
        i = _serve_running(s, r, i, budget, out)


def waiting_pass_by_definition(s, budget, now_us, out):
    if not s.waiting or step_module._admission_blocked(s, out):
        return
    strict = s.policy.queue.head_of_line is step_module.STRICT
    max_seqs = s.policy.batch.max_num_seqs
    inversion = s.policy.preempts_on_inversion
    for r in list(s.waiting):
        if budget.tokens <= 0 or (len(s.running) >= max_seqs and not inversion):
            return
        if r.rid in out.preempted:
            continue
        if not _try_admit(s, r, budget, out) and strict:
            return


def _pool(s):
    p = s.pool
    if p is None:
        return None
    return (p.uncached_free, p.next_id, p.evictions, list(p.lru), list(p.refs.items()), list(p.hash_of.items()),
            [(h, list(b)) for h, b in p.cached.items()], list(p.chains.items()), list(p.truth.items()),
            [(r.block_ids, r.num_cached_blocks, list(r.chain)) for r in s.requests])


def _run(policy, rs):
    result = simulate(policy, rs, PROFILE, record=True, max_steps=MAX_STEPS)
    return result.decisions, result.state.snapshot(), _pool(result.state), result.stuck, result.livelock


def _same_as_definitions(policy, rs, monkeypatch):
    fast = _run(policy, rs)
    with monkeypatch.context() as m:
        m.setattr(step_module, "_running_pass", running_pass_by_definition)
        m.setattr(step_module, "_waiting_pass", waiting_pass_by_definition)
        slow = _run(policy, rs)
    assert fast[0] == slow[0]  # every step's decision
    assert fast[1:] == slow[1:]
    return fast


@st.composite
def crowded(draw):
    """Many requests arriving together into a small pool: long queues, preemption for growth and by priority
    inversion, admissions and preemptions in one pass (the queue changing while the waiting pass walks it)."""
    policy = draw(small_policies())
    if draw(st.booleans()):  # priority inversion: the waiting pass preempts, and goes on past the victims
        data = policy.model_dump(mode="json")
        data["queue"].update(order="priority", aging_interval_ms=None, vtc=None,
                             head_of_line=draw(st.sampled_from(["strict", "skip"])))
        data["preemption"].update(triggers=["kv_growth_fails", "priority_inversion"], priority_inversion_threshold=0)
        policy = Policy.model_validate(data)
    if draw(st.booleans()):
        policy = _caching(policy, chained=True, counted=draw(st.booleans()))
    specs, t = [], 0
    for rid in range(draw(st.integers(3, 16))):
        t += draw(st.sampled_from([0, 0, 0, 1000, 50_000]))
        output = draw(st.integers(1, 40))
        prompt = draw(st.integers(1, policy.max_model_len))
        content = content_from_prefix_group(draw(st.integers(1, 2)), prompt) if draw(st.booleans()) else None
        specs.append(RequestSpec(rid=rid, arrival_us=t, prompt_len=prompt, output_len=output,
                                 max_output=output + draw(st.integers(0, 3)), priority=draw(st.integers(0, 3)),
                                 tenant=draw(st.integers(0, 1)), content=content))
    return policy, RequestSet(specs, ["c"], ["a", "b"], "generated")


@settings(max_examples=300, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(case=crowded())
def test_fast_paths_equal_definitions_on_crowded_traces(case, monkeypatch):
    _same_as_definitions(*case, monkeypatch)


@settings(max_examples=150, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(case=decode_heavy())
def test_fast_paths_equal_definitions_on_decode_heavy_traces(case, monkeypatch):
    _same_as_definitions(*case, monkeypatch)


@settings(max_examples=200, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(case=decode_heavy_with_shared_prompts())
def test_fast_paths_equal_definitions_with_prefix_caching(case, monkeypatch):
    _same_as_definitions(*case, monkeypatch)


def test_the_waiting_pass_sees_a_changing_queue(monkeypatch):
    """Some generated case admits and preempts in one waiting pass, and has the fast decode path take a
    block with the pool (so the tests above exercise the fast paths where they differ from a copy)."""
    seen = {"moved": 0, "pool_decode": 0}
    waiting_pass, running_pass = step_module._waiting_pass, step_module._running_pass

    def counting_waiting(s, budget, now_us, out):
        before = list(s.waiting)
        waiting_pass(s, budget, now_us, out)
        after = s.waiting
        if out.admitted and any(r not in before for r in after):
            seen["moved"] += 1

    def counting_running(s, budget, out, prefill_only=False):
        grown = len(out.grown)
        running_pass(s, budget, out, prefill_only)
        if s.pool is not None and len(out.grown) > grown:
            seen["pool_decode"] += 1

    monkeypatch.setattr(step_module, "_waiting_pass", counting_waiting)
    monkeypatch.setattr(step_module, "_running_pass", counting_running)

    @settings(max_examples=300, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow])
    @given(case=crowded())
    def run(case):
        simulate(*case, PROFILE, record=True, max_steps=MAX_STEPS)

    run()
    assert seen["moved"] > 0 and seen["pool_decode"] > 0, seen
