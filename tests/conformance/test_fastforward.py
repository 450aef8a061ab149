"""Fast-forward over quiet decode stretches (checker/fastforward.py) equals plain stepping."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from checker.api import load_policy
from checker.engine import simulate
from checker.policy import Policy
from checker.profile import load_profile
from checker.requests import RequestSpec, content_from_hash_ids, content_from_prefix_group
from checker.strategies import small_policies, small_sglang_policies
from checker.traces import RequestSet, load_requests
from tests.helpers import AZURE_CSV, POLICIES, WORKLOADS

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
def decode_heavy(draw, policies=small_policies()):
    policy = draw(policies)
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


@settings(max_examples=200, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(case=decode_heavy(small_sglang_policies()))
def test_fast_forward_equals_plain_stepping_under_sglang_rules(case):
    """SGLang's stretches also decay the new-token ratio: the final state (ratio and flags included) is equal."""
    _same(*case)


@pytest.mark.skipif(not AZURE_CSV.exists(), reason=f"the Azure conversation trace is not at {AZURE_CSV} (../shared/data)")
def test_fast_forward_under_sglang_rules_on_a_slice_of_the_azure_trace():
    rs = load_requests(trace=AZURE_CSV, limit=1500)
    fast, plain = _same(load_policy(POLICIES / "sglang" / "sglang_v05.yaml"), rs)
    assert fast.steps == plain.steps and fast.state.sglang.ratio == plain.state.sglang.ratio


@pytest.mark.parametrize("policy", sorted(p.name for p in POLICIES.glob("*.yaml")))
def test_fast_forward_equals_plain_stepping_on_the_shipped_workload(policy):
    rs = load_requests(workload=WORKLOADS / "chat_mixed.yaml")
    fast, plain = _same(load_policy(POLICIES / policy), rs)
    assert fast.steps == plain.steps


# ----------------------------------------------------------------------------------------- with prefix caching
def _pool_state(result):
    """Everything the block pool and the block tables hold, dicts in their order (fast-forward replays the
    pool operations in plain stepping's order, so even the order of the LRU queue and of the interning
    table agree)."""
    s = result.state
    p = s.pool
    return (p.uncached_free, p.next_id, p.evictions, list(p.lru), list(p.refs.items()), list(p.hash_of.items()),
            [(h, list(b)) for h, b in p.cached.items()], list(p.chains.items()), list(p.truth.items()),
            [(r.block_ids, r.num_cached_blocks, r.chain) for r in s.requests])


def _same_with_pool(policy, rs):
    fast, plain = _same(policy, rs)
    assert _pool_state(fast) == _pool_state(plain)
    return fast, plain


def _caching(policy, chained=True, counted=True):
    """The policy with prefix caching on (the pool with block identity is on-demand, checked, recompute-only)."""
    data = policy.model_dump(mode="json")
    data["kv"].update(allocation="on_demand", check_allocation=True, swap_blocks=0,
                      prefix_caching={"enabled": True, "chained_hashes": chained, "count_evictable_hits": counted})
    data["preemption"]["mode"] = "recompute"
    return Policy.model_validate(data)


@st.composite
def decode_heavy_with_shared_prompts(draw):
    """decode_heavy's shape with prompt identity: own tokens, one of two prefix groups (equal prompts when the
    lengths are equal too: their outputs share blocks, so a preempted one's hit grows as the other decodes),
    or hash ids extending an earlier request's (sessions), over a pool small enough to evict."""
    policy = _caching(draw(small_policies()), chained=draw(st.sampled_from([True, True, True, False])),
                      counted=draw(st.sampled_from([True, True, True, False])))
    n = draw(st.integers(1, 10))
    hash_block = draw(st.sampled_from([2, 4, 8]))
    specs, t, sessions = [], 0, []
    for rid in range(n):
        t += draw(st.integers(0, 200_000))
        output = draw(st.integers(1, 60))
        cancel = draw(st.none() | st.integers(0, 400_000))
        prompt = draw(st.integers(1, policy.max_model_len))
        kind = draw(st.sampled_from(["own", "group", "group", "hash"]))
        content = None
        if kind == "group":
            content = content_from_prefix_group(draw(st.integers(1, 2)), prompt)
        elif kind == "hash":
            base = draw(st.sampled_from(sessions)) if sessions and draw(st.booleans()) else []
            ids = list(base[: prompt // hash_block])
            while len(ids) < -(-prompt // hash_block):
                ids.append(draw(st.integers(0, 30)) if draw(st.booleans()) else 100 + 40 * rid + len(ids))
            ids = list(dict.fromkeys(ids))  # each id at most once in a prompt
            while len(ids) < -(-prompt // hash_block):
                ids.append(1000 + 40 * rid + len(ids))
            sessions.append(ids)
            content = content_from_hash_ids(ids, hash_block, prompt, rid)
        specs.append(RequestSpec(rid=rid, arrival_us=t, prompt_len=prompt, output_len=output,
                                 max_output=output + draw(st.integers(0, 5)), priority=draw(st.integers(0, 2)),
                                 tenant=draw(st.integers(0, 1)), cancel_us=None if cancel is None else t + cancel,
                                 content=content))
    return policy, RequestSet(specs, ["c"], ["a", "b"], "generated")


@st.composite
def twins(draw):
    """Requests of one prefix group, half of them with one prompt length: equal prompts decode into equal
    blocks, so a preempted request's hit grows while its twin decodes, and shrinks as the decodes evict."""
    policy = _caching(draw(small_policies()))
    prompt = draw(st.integers(1, policy.max_model_len))
    specs, t = [], 0
    for rid in range(draw(st.integers(2, 8))):
        t += draw(st.integers(0, 100_000))
        output = draw(st.integers(1, 60))
        length = prompt if draw(st.booleans()) else draw(st.integers(1, policy.max_model_len))
        specs.append(RequestSpec(rid=rid, arrival_us=t, prompt_len=length, output_len=output, max_output=output,
                                 priority=draw(st.integers(0, 2)), content=content_from_prefix_group(1, length)))
    return policy, RequestSet(specs, ["c"], ["a"], "generated")


@settings(max_examples=300, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(case=decode_heavy_with_shared_prompts())
def test_fast_forward_with_prefix_caching_equals_plain_stepping_on_generated_traces(case):
    _same_with_pool(*case)


@settings(max_examples=1000, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(case=twins())
def test_fast_forward_with_prefix_caching_equals_plain_stepping_when_hits_change(case):
    """Equal prompts make hits change during quiet stretches (an eviction shortens one, a twin's decode
    extends one): the stretch stops before such a step. (Disabling either cut did not make these examples
    fail under the decode-first pass, the one that fast-forwards with someone waiting: in the cases drawn, a
    changed hit never let a request in; the cuts are kept because the admission rule can let one in.)"""
    _same_with_pool(*case)


CACHING_POLICIES = sorted([*POLICIES.glob("prefix_caching/*.yaml"), *POLICIES.glob("broken/vllm_v1_cache_*.yaml")])


@pytest.mark.parametrize("workload", ["chat_mixed.yaml", "shared_prefixes.yaml"])
@pytest.mark.parametrize("policy", CACHING_POLICIES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_fast_forward_with_prefix_caching_equals_plain_stepping_on_shipped_workloads(policy, workload, monkeypatch):
    import checker.engine as engine

    skipped = []
    apply = engine.apply_stretch
    monkeypatch.setattr(engine, "apply_stretch", lambda s, k: (skipped.append(k), apply(s, k)))
    rs = load_requests(workload=WORKLOADS / workload)
    fast, plain = _same_with_pool(load_policy(policy), rs)
    assert fast.steps == plain.steps
    if policy.parent.name == "prefix_caching":
        assert sum(skipped) > fast.steps // 4, "fast-forward should cover many of these steps with the cache on"


def test_fast_forward_with_prefix_caching_on_a_slice_of_the_azure_trace():
    """Own prompts only: preempted requests find their own blocks again (hits that evictions shrink)."""
    if not AZURE_CSV.exists():
        pytest.skip(f"needs {AZURE_CSV}")
    rs = load_requests(trace=AZURE_CSV, limit=400)
    _same_with_pool(load_policy(POLICIES / "prefix_caching" / "vllm_v1.yaml"), rs)


@pytest.mark.parametrize("policy", ["vllm_v1.yaml", "prefix_caching/vllm_v1.yaml", "orca.yaml", "static_batching.yaml"])
def test_stretches_that_end_with_the_finishing_step_equal_plain_stepping(policy, monkeypatch):
    """A stretch may end with the step in which the first requests reach their last token
    (fastforward.finish_stretch: status, reason, blocks freed in serving order; the engine's done times, KV
    peak before and after that step, idle slots of the batch after it). On a slice of the Azure trace (a
    queue that waits behind finishing requests) and the shipped workload, such stretches happen and the
    result is plain stepping's, block pool included."""
    import checker.engine as engine

    ended = []
    finish = engine.finish_stretch

    def counted(s):
        done = finish(s)
        ended.extend(done)
        return done

    monkeypatch.setattr(engine, "finish_stretch", counted)
    loads = [load_requests(workload=WORKLOADS / "chat_mixed.yaml")]
    if AZURE_CSV.exists():
        loads.append(load_requests(trace=AZURE_CSV, limit=300))
    for rs in loads:
        before = len(ended)
        pol = load_policy(POLICIES / policy)
        fast, plain = _same_with_pool(pol, rs) if pol.kv.prefix_caching.enabled else _same(pol, rs)
        assert fast.steps == plain.steps
        assert len(ended) > before, "no stretch ended with a finishing step"


def test_a_finishing_step_under_the_mixed_pass_frees_in_queue_order():
    """Under the mixed pass the batch is served in queue order, not in the running list's (admission) order: two
    requests finishing in one step free their blocks in that order, which the LRU queue shows. Here the
    low-priority request is admitted first and both finish in the stretch's last step."""
    import checker.engine as engine

    data = _caching(load_policy(POLICIES / "orca.yaml")).model_dump(mode="json")
    data["queue"]["order"] = "priority"
    policy = Policy.model_validate(data)
    specs = [RequestSpec(rid=0, arrival_us=0, prompt_len=40, output_len=30, max_output=30, priority=2),
             RequestSpec(rid=1, arrival_us=1, prompt_len=40, output_len=29, max_output=29, priority=0)]
    rs = RequestSet(specs, ["c"], ["a"], "generated")
    ended = []
    finish = engine.finish_stretch
    try:
        engine.finish_stretch = lambda s: ended.append([r.rid for r in s.running]) or finish(s)
        fast, plain = _same_with_pool(policy, rs)
    finally:
        engine.finish_stretch = finish
    assert ended == [[0, 1]]  # both finish in a stretch's last step, the running list in admission order


# ----------------------------------------------------------------------------------------- evictions of a blocked hit
def _stretches_through_evictions(monkeypatch):
    """Count the stretches during which a block of a tried waiting request's prefix-cache hit was evicted (the hit
    as the stretch starts vs as it ends): with reserve_full_prompt the stretch no longer stops before them."""
    import checker.engine as engine
    from checker.fastforward import _tried

    through = []
    apply = engine.apply_stretch

    def counted(s, k):
        pool = s.pool
        tried = _tried(s) if pool is not None and s.waiting else []
        before = [pool.cached_prefix(r.chain, pool.hit_limit(r))[0] for r in tried]
        apply(s, k)
        after = [pool.cached_prefix(r.chain, pool.hit_limit(r))[0] for r in tried]
        through.extend(1 for a, b in zip(before, after) if a != b)

    monkeypatch.setattr(engine, "apply_stretch", counted)
    return through


def test_stretches_run_through_evictions_of_a_blocked_hit(monkeypatch):
    """Under reserve_full_prompt (the shipped caching policy) a stretch goes on through the takes that evict blocks
    of the blocked head's hit (fastforward.evictions_keep_blocked): such stretches happen on a slice of the Azure
    trace under the calibrated A100 profile (a queue that builds: about 100 such stretches in 600 requests), and the
    result is plain stepping's, block pool included. Were a shortened hit able to let the head in,
    plain stepping would admit it inside the stretch and the two would differ."""
    if not AZURE_CSV.exists():
        pytest.skip(f"needs {AZURE_CSV}")
    from checker.fastforward import evictions_keep_blocked

    policy = load_policy(POLICIES / "prefix_caching" / "vllm_v1.yaml")
    assert evictions_keep_blocked(policy)
    through = _stretches_through_evictions(monkeypatch)
    rs = load_requests(trace=AZURE_CSV, limit=600)
    prof = load_profile(POLICIES.parent / "profiles" / "a100-llama-2-70b-tp2.json")
    fast = simulate(policy, rs, prof, fast_forward=True, max_steps=MAX_STEPS)
    plain = simulate(policy, rs, prof, fast_forward=False, max_steps=MAX_STEPS)
    assert fast.state.snapshot() == plain.state.snapshot() and _pool_state(fast) == _pool_state(plain)
    a, b = fast.summary(), plain.summary()
    a["engine"].pop("wall_s"), b["engine"].pop("wall_s")
    assert a == b
    assert through, "no stretch ran through an eviction of a blocked hit"


def _waiting_try(s, r, cap):
    """What the waiting pass decides for r now (admitted or not), as _try_admit: its hit, a chunk of at most cap
    tokens after it, kv.can_admit; r is left as it was."""
    from checker.semantics import kv

    hit = kv.prefix_hit(s, r)
    r.num_computed = len(hit) * s.policy.kv.block_size
    n = min(r.prompt_len - r.num_computed, cap)
    ok = n > 0 and kv.can_admit(s, r, n, hit)
    r.num_computed = 0
    return ok


def _pool_with_hit(reserve, prompts, released, order, head_len, block_size=4, num_blocks=24):
    """A state whose pool holds blocks of prefix group 1: one running request per prompt length in ``prompts``
    computed its prompt (equal blocks computed twice are duplicates: a hit takes the first one cached); those
    in ``released`` are freed in that order, then the LRU queue is put in ``order`` (a permutation of its
    indices: any order, not only the ones stepping reaches); the head (group 1, ``head_len`` tokens) waits.
    Returns the state, the head, and an own-token request that decodes (takes blocks one by one)."""
    from checker.semantics import kv
    from checker.semantics.state import SchedulerState

    data = _caching(load_policy(POLICIES / "vllm_v1.yaml")).model_dump(mode="json")
    data["kv"].update(num_blocks=num_blocks, block_size=block_size, watermark=0.0)
    data["admission"]["reserve_full_prompt"] = reserve
    policy = Policy.model_validate(data)
    specs = [RequestSpec(rid=i, arrival_us=0, prompt_len=n, output_len=1, max_output=1,
                         content=content_from_prefix_group(1, n)) for i, n in enumerate(prompts)]
    specs.append(RequestSpec(rid=len(specs), arrival_us=0, prompt_len=head_len, output_len=1, max_output=1,
                             content=content_from_prefix_group(1, head_len)))
    specs.append(RequestSpec(rid=len(specs), arrival_us=0, prompt_len=1, output_len=1000, max_output=1000))
    s = SchedulerState(policy, specs)
    *holders, head, decoder = s.requests
    for r in holders:
        kv.allocate(s, r, r.prompt_len)
        r.num_computed = r.prompt_len
        s.running.append(r)
    for i in released:
        kv.free(s, holders[i])
        s.running.remove(holders[i])
    lru = list(s.pool.lru)
    s.pool.lru = dict.fromkeys(lru[i] for i in order if i < len(lru))
    s.pool.lru.update(dict.fromkeys(lru))  # the rest in their order
    s.running.append(decoder)
    s.waiting.append(head)
    return s, head, decoder


@st.composite
def pools_with_hits(draw):
    prompts = draw(st.lists(st.integers(1, 30), min_size=1, max_size=4))
    released = draw(st.permutations(range(len(prompts))))[: draw(st.integers(0, len(prompts)))]
    return (prompts, released, draw(st.permutations(range(30))), draw(st.integers(2, 40)),
            draw(st.integers(1, 12)))


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(case=pools_with_hits())
def test_a_blocked_hit_stays_blocked_through_evictions_under_full_prompt_reservation(case):
    """evictions_keep_blocked's argument, on pool states of any LRU order, duplicates included: under
    reserve_full_prompt a waiting request that does not fit stays out while decodes take blocks one by one, whatever
    they evict of its hit (the hit never grows here: takes cache nothing)."""
    from checker.semantics import kv

    prompts, released, order, head_len, cap = case
    s, head, decoder = _pool_with_hit(True, prompts, released, order, head_len)
    if _waiting_try(s, head, cap):
        return
    while kv.free_blocks(s) > 0:
        kv.take(s, decoder, 1)
        assert not _waiting_try(s, head, cap)


def test_without_full_prompt_reservation_an_eviction_can_let_a_blocked_hit_in():
    """Why evictions_keep_blocked needs reserve_full_prompt: with only the chunk's blocks checked, a hit whose
    first block is evicted first (an LRU order that duplicates reach) shrinks from 3 free blocks to none, and the
    4-token chunk then needs 1 block where the 13-token head needed 4: one take lets it in. A stretch that ran
    through that take would differ from plain stepping; the guard keeps the cut there."""
    from checker.fastforward import evictions_keep_blocked
    from checker.semantics import kv

    s, head, decoder = _pool_with_hit(False, [12], [0], [2, 1, 0], 13, num_blocks=3)
    assert not evictions_keep_blocked(s.policy)
    assert kv.free_blocks(s) == 3 and len(kv.prefix_hit(s, head)) == 3
    assert not _waiting_try(s, head, 4)
    kv.take(s, decoder, 1)  # evicts the hit's first block
    assert kv.prefix_hit(s, head) == [] and _waiting_try(s, head, 4)
    s, head, decoder = _pool_with_hit(True, [12], [0], [2, 1, 0], 13, num_blocks=3)
    assert evictions_keep_blocked(s.policy) and not _waiting_try(s, head, 4)
    kv.take(s, decoder, 1)
    assert not _waiting_try(s, head, 4)
