"""The liveness explorer with prefix caching: canonical keys with the block pool's content (checker/liveness/canon.py).

The central check: for states the engine reaches from scratch (a graph path's requests replayed on the engine, with
their own request numbers, block ids and chain table), the key is the graph's, and stepping the engine's state under
every environment choice gives exactly the successor keys the explorer computed from the key's representative.
"""

from __future__ import annotations

import random

import pytest

from checker.api import apply_overrides, load_policy
from checker.errors import InputError
from checker.liveness.canon import ORPHAN, Canon
from checker.liveness.check import concrete_trace, liveness_env
from checker.liveness.explore import LivenessEnv, Transition, explore, live_positions
from checker.requests import RequestSpec, identity_content
from checker.semantics.blockpool import NO_PARENT
from checker.semantics.state import Request, SchedulerState
from checker.semantics.step import step
from checker.verify.replay import replay_fixed_clock
from tests.helpers import POLICIES

CACHING = POLICIES / "prefix_caching" / "vllm_v1.yaml"
ALL = (None, (0, 0), (1, 0), (0, 1))


def _policy(path, overrides=()):
    return apply_overrides(load_policy(path), list(overrides))


# (policy, overrides, env): shared prefixes on a small pool (evictions), own tokens and two groups, cancellations with
# a release lag (cancelled requests holding blocks), unchained hashes (a planted bug), uncounted hits (over-commits)
CASES = [
    (CACHING, ["kv.num_blocks=6", "batch.max_num_seqs=2"], LivenessEnv(2, (20, 40), (1, 3), identities=((0, 0),))),
    (CACHING, ["kv.num_blocks=5", "batch.max_num_seqs=1"], LivenessEnv(2, (33,), (1, 2), identities=ALL)),
    (CACHING, ["kv.num_blocks=6", "cancellation.release_lag_steps=1"],
     LivenessEnv(2, (32, 48), (2,), cancellations=True, identities=((0, 0), (0, 1)))),
    (POLICIES / "broken" / "vllm_v1_cache_unchained_hashes.yaml", ["kv.num_blocks=6"],
     LivenessEnv(2, (32, 48), (1, 2), identities=((0, 0), (0, 1)))),
    (POLICIES / "broken" / "vllm_v1_cache_uncounted_hits.yaml", ["kv.num_blocks=4", "batch.max_num_seqs=1"],
     LivenessEnv(2, (32, 64), (1,), identities=((0, 0),))),
    (POLICIES / "priority_aging.yaml", ["kv.prefix_caching.enabled=true", "batch.max_num_seqs=1", "kv.num_blocks=6"],
     LivenessEnv(2, (32,), (1, 2), (0, 1), step_us=250_000, identities=((0, 0),))),
]
IDS = ["shared-prefix", "own+groups", "cancel-lag", "unchained", "uncounted-hits", "aging"]


def _engine_state(sg, node: int) -> tuple[SchedulerState, int]:
    """The state of the node as the engine reaches it from scratch: the BFS path's requests replayed."""
    path = sg.path_to(node)
    specs = concrete_trace(sg, path) if path else []
    n = len(path)
    return replay_fixed_clock(sg.canon.policy, specs, n, sg.env.step_us, sg.env.tenants).state, n * sg.env.step_us


def _engine_successors(sg, trans: Transition, s: SchedulerState, now: int) -> set[tuple]:
    return {sg.canon.encode(c, now + sg.env.step_us) for c in _engine_successor_states(sg, trans, s, now)}


@pytest.mark.parametrize("path,overrides,env", CASES, ids=IDS)
def test_engine_states_have_the_graph_key_and_the_representatives_successors(path, overrides, env):
    policy = _policy(path, overrides)
    sg = explore(policy, env, max_states=3000, timeout_s=120)
    trans = Transition(sg.canon, sg.env)
    assert sg.states > 10 and sg.hit_choices > 0
    for key in sg.keys:  # every key decodes to a state that encodes to it
        s, now = sg.canon.decode(key)
        assert sg.canon.encode(s, now) == key
    step_by = max(1, sg.states // 60)
    for node in range(0, sg.states, step_by):
        s, now = _engine_state(sg, node)
        assert sg.canon.encode(s, now) == sg.keys[node]
        successors = set(trans.successors(sg.keys[node]))
        assert _engine_successors(sg, trans, s, now) == successors, node
        if sg.complete or node == 0:  # and they are the graph's edges
            assert successors == {sg.keys[v] for v in sg.graph.successors(node)}


def test_keys_hold_the_pool_content_that_decides_future_hits():
    """Two states that differ only in which prefix a cached free block holds (group 0's or group 1's first block)
    have different keys, and so do their futures: a group-0 arrival hits in one of them only."""
    policy = _policy(CACHING, ["kv.num_blocks=6"])
    env = LivenessEnv(1, (32,), (1,), identities=((0, 0), (1, 0)))
    canon = Canon(policy, 10_000, classes=env.classes())
    keys = []
    for group in (0, 1):
        content = identity_content((group, 0), 32, 16)
        s = SchedulerState(policy, [RequestSpec(0, 0, 32, 1, 1, content=content)])
        step(s, [s.requests[0]], [], 0)  # admitted, prefilled, finished: its two blocks stay cached and free
        assert s.requests[0].status.name == "FINISHED" and len(s.pool.lru) == 2
        keys.append(canon.encode(s, 10_000))
    assert keys[0] != keys[1]
    hits = []
    for key in keys:
        s, now = canon.decode(key)
        r = Request(canon.spec(len(s.requests), now, 0))  # class 0: group 0
        s.requests.append(r)
        d = step(s, [r], [], now)
        hits.append(d.cache_hits)
    assert hits[0] and not hits[1]


def test_a_gone_requests_own_blocks_are_orphans_and_a_live_ones_are_its_own():
    policy = _policy(CACHING, ["kv.num_blocks=8", "preemption.triggers=[]"])
    canon = Canon(policy, 10_000, classes=LivenessEnv(2, (32,), (1,), identities=(None,)).classes())
    s = SchedulerState(policy, [RequestSpec(0, 0, 32, 1, 1), RequestSpec(1, 0, 40, 3, 3)])
    step(s, list(s.requests), [], 0)  # request 0 finishes (own blocks cached, free); request 1 runs on
    key = canon.encode(s, 10_000)
    decoded, now = canon.decode(key)
    assert canon.encode(decoded, now) == key
    names = key[-2 * (len(s.pool.lru) + len(s.pool.refs)):][::2]
    assert ORPHAN in names and any(n < 0 for n in names)  # request 0's blocks, request 1's blocks


def test_block_ids_and_request_numbers_are_anonymous():
    policy = _policy(CACHING, ["kv.num_blocks=6", "batch.max_num_seqs=1"])
    env = LivenessEnv(2, (40,), (5,), identities=((0, 0),))
    canon = Canon(policy, 10_000, classes=env.classes())
    content = identity_content((0, 0), 40, 16)

    def run(earlier: int) -> SchedulerState:
        # the earlier requests are rejected at once (prompts of max_model_len tokens): other request numbers
        specs = [RequestSpec(i, 0, 16384, 1, 1) for i in range(earlier)]
        specs += [RequestSpec(earlier + i, 10_000 * (1 + i), 40, 5, 5, content=content) for i in range(2)]
        s = SchedulerState(policy, specs)
        for j in range(earlier):  # and another chain table: its chains are other ints
            s.pool.chains.setdefault((NO_PARENT, ("own", 1000 + j, 0)), len(s.pool.chains))
        for k in range(4):
            step(s, [r for r in s.requests if r.arrival_us == k * 10_000], [], k * 10_000)
        return s

    a, b = run(0), run(3)
    assert a.pool.refs and set(a.pool.hash_of.values()) != set(b.pool.hash_of.values())  # other chain ints
    assert canon.encode(a, 40_000) == canon.encode(b, 40_000) and canon.encode(a, 40_000)[0] == 2
    # a relabelling of a's blocks gives the same key
    c = a.copy()
    ids = sorted(set(c.pool.refs) | set(c.pool.lru))
    perm = dict(zip(ids, random.Random(7).sample([100 + i for i in range(len(ids))], len(ids))))
    p = c.pool
    p.refs = {perm[x]: n for x, n in p.refs.items()}
    p.lru = {perm[x]: None for x in p.lru}
    p.hash_of = {perm[x]: h for x, h in p.hash_of.items()}
    p.cached = {h: {perm[x]: None for x in blocks} for h, blocks in p.cached.items()}
    for r in c.requests:
        r.block_ids = [perm[x] for x in r.block_ids]
    assert canon.encode(c, 40_000) == canon.encode(a, 40_000)


def test_memo_and_workers_give_the_same_graph_with_the_cache():
    policy = _policy(CACHING, ["kv.num_blocks=6", "batch.max_num_seqs=2"])
    env = LivenessEnv(2, (20, 40), (1, 2), identities=((0, 0), (1, 0)))
    a = explore(policy, env, max_states=5000)
    b = explore(policy, env, max_states=5000, memo=False)
    c = explore(policy, env, max_states=5000, workers=2)
    assert a.complete and a.keys == b.keys == c.keys
    assert a.hit_choices == b.hit_choices == c.hit_choices > 0
    assert a.found_choices == b.found_choices == c.found_choices >= a.hit_choices
    assert a.choices_run == b.choices_run == c.choices_run
    for g in (b, c):
        assert list(a.graph.edges(data="labels")) == list(g.graph.edges(data="labels"))


def test_caching_instances_choose_identities_and_off_policies_refuse_them():
    caching = _policy(CACHING)
    env = liveness_env(caching)
    assert env.identities == ((0, 0),) and env.prompts == (32,)  # shared prefix, a block a fresh request can hit
    assert "prompt identities {prefix group 0}" in env.describe()[1]
    plain = _policy(POLICIES / "vllm_v1.yaml")
    assert liveness_env(plain).identities is None and "identit" not in " ".join(liveness_env(plain).describe())
    with pytest.raises(InputError, match="only with kv.prefix_caching.enabled"):
        liveness_env(plain, identities=((0, 0),))
    with pytest.raises(InputError, match="prompt identities among"):
        LivenessEnv(2, (16,), (1,), identities=((5, 0),))


def test_the_reduced_graph_is_the_quotient_of_the_unreduced_engine_states():
    """Symmetry reduction stays sound with the cache: breadth-first over the engine's own states (no reduction:
    request numbers, block ids and chain ints as the engine makes them, merged only when exactly equal, by the
    explicit-state verifier's fingerprint), the canonical keys of the states within D iterations are exactly the
    graph's nodes within D iterations."""
    from checker.verify.explicit import fast_fingerprint

    policy = _policy(CACHING, ["kv.num_blocks=5", "batch.max_num_seqs=1"])
    env = LivenessEnv(2, (33,), (1, 2), identities=(None, (0, 0)))
    sg = explore(policy, env)
    assert sg.complete
    canon, trans, depth = sg.canon, Transition(sg.canon, sg.env), 4
    layer = {None: SchedulerState(policy, [])}
    seen = {canon.encode(layer[None], 0)}
    for k in range(depth):
        now = k * env.step_us
        following = {}
        for s in layer.values():
            for key in _engine_successor_states(sg, trans, s, now):
                following.setdefault(fast_fingerprint(key), key)
        layer = following
        seen |= {canon.encode(s, now + env.step_us) for s in layer.values()}
    assert seen == {sg.keys[u] for u in range(sg.states) if sg.depth[u] <= depth}
    assert len(seen) > 30


def _engine_successor_states(sg, trans: Transition, s: SchedulerState, now: int) -> list[SchedulerState]:
    arrivals, cancels = trans.choices(sg.canon.encode(s, now))
    out = []
    for arriving in arrivals:
        for cancelled in cancels:
            c = s.copy()
            live = live_positions(c)
            new = [Request(sg.canon.spec(len(c.requests) + k, now, cid)) for k, cid in enumerate(arriving)]
            c.requests += new
            step(c, new, [c.requests[live[i]] for i in cancelled], now)
            out.append(c)
    return out


def test_a_caching_lasso_is_confirmed_on_the_whole_key_of_the_engines_states():
    from checker.liveness.check import _pool_closes, confirm_lasso
    from checker.liveness.lasso import Lasso, find_lasso

    policy = _policy(POLICIES / "strict_priority.yaml",
                     ["kv.prefix_caching.enabled=true", "batch.max_num_seqs=1", "kv.num_blocks=4"])
    sg = explore(policy, LivenessEnv(2, (32,), (1, 2), (0, 1), identities=((0, 0),)))
    lasso = find_lasso(sg, "eventually_served")
    specs, _, _ = confirm_lasso(policy, sg, lasso)
    assert _pool_closes(policy, sg, lasso, specs)
    shifted = Lasso(lasso.prop, lasso.prefix[:-1], lasso.cycle)  # ends one iteration early: not a cycle's ends
    assert not _pool_closes(policy, sg, shifted, specs)


def test_a_chain_of_no_class_of_the_instance_is_an_orphan_until_a_class_has_it():
    policy = _policy(CACHING, ["kv.num_blocks=6"])
    canon = Canon(policy, 10_000, classes=LivenessEnv(1, (32,), (1,), identities=((0, 0),)).classes())
    s = SchedulerState(policy, [RequestSpec(0, 0, 32, 1, 1, content=identity_content((1, 0), 32, 16))])
    step(s, [s.requests[0]], [], 0)  # a group-1 request (no class of the instance has group 1) finishes
    key = canon.encode(s, 10_000)
    assert key[-4:] == (ORPHAN, 0, ORPHAN, 0)  # its two cached free blocks: nobody to come can hit them
    canon.class_id((32, 1, 1, 0, 0, (1, 0)))  # now a class has group 1: its blocks are named by their chains
    assert canon.encode(s, 10_000)[-4:] != (ORPHAN, 0, ORPHAN, 0)
