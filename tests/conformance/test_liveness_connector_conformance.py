"""The liveness explorer with a KV connector is the engine's step (checker/liveness, checker/semantics/transfer.py).

Every explorer transition equals the engine's step on the same inputs: breadth-first over the engine's own states
(no reduction: request numbers, absolute steps and transfer steps as the engine makes them, merged only when exactly
equal), stepping each under every environment choice of its key gives exactly the successor keys the explorer
computes from the key's representative, and the keys met are the graph's. Also for the states the graph's BFS paths
replay to, and with the memo off or two worker processes.
"""

from __future__ import annotations

import pytest

from checker.api import apply_overrides, load_policy
from checker.liveness.explore import LivenessEnv, Transition, explore
from checker.semantics.state import SchedulerState
from checker.verify.explicit import fast_fingerprint
from tests.helpers import POLICIES
from tests.unit.test_liveness_cache import _engine_state, _engine_successor_states, _engine_successors

OFFLOAD = ["connector.kind=offload", "connector.max_load_steps=2"]

# (policy, overrides, env): the holders' queue on and off, hung loads aborted under each release rule, in-flight
# reservations off, a prefill node pinning finished requests, prefix caching with loads, an aging clock
CASES = [
    ("vllm_v1", ["connector.kind=offload", "connector.max_load_steps=3", "kv.num_blocks=5"],
     LivenessEnv(3, (32,), (1, 2), arrivals_per_step=1, external=(0, 16))),
    ("vllm_v1", OFFLOAD + ["kv.num_blocks=3", "connector.holders_first=false"], LivenessEnv(2, (32,), (1, 2))),
    ("vllm_v1", OFFLOAD + ["kv.num_blocks=4"], LivenessEnv(2, (32,), (1,), cancellations=True)),
    ("vllm_v1", OFFLOAD + ["kv.num_blocks=4", "connector.release=deadline", "connector.release_deadline_steps=2",
                           "cancellation.release_lag_steps=1"], LivenessEnv(2, (32,), (1,), cancellations=True)),
    ("vllm_v1", OFFLOAD + ["kv.num_blocks=4", "connector.release=immediate", "connector.reserve_inflight=false"],
     LivenessEnv(3, (32,), (1,), cancellations=True, arrivals_per_step=1)),
    ("vllm_v1", ["connector.kind=prefill_node", "connector.max_load_steps=2", "kv.num_blocks=4"],
     LivenessEnv(2, (16, 32), (1,), cancellations=True)),
    ("prefix_caching/vllm_v1", OFFLOAD + ["kv.num_blocks=5", "batch.max_num_seqs=2"],
     LivenessEnv(2, (32,), (1,), identities=((0, 0),), external=(0, 16, -1))),
    ("prefix_caching/vllm_v1", OFFLOAD + ["kv.num_blocks=5", "connector.release=deadline",
                                          "connector.release_deadline_steps=1", "cancellation.release_lag_steps=2"],
     LivenessEnv(2, (32,), (1,), cancellations=True, identities=((0, 0),), external=(0, 16))),
    ("priority_aging", ["connector.kind=decode_node", "connector.max_load_steps=1", "kv.num_blocks=3",
                        "batch.max_num_seqs=1"], LivenessEnv(2, (32,), (1,), (0, 1), step_us=250_000)),
]
IDS = ["holders-first", "holders-in-queue", "hung-abort", "deadline+lag", "immediate-no-reserve", "prefill-node",
       "cache", "cache-aborts", "aging-decode-node"]


def _policy(name, overrides):
    return apply_overrides(load_policy(POLICIES / f"{name}.yaml"), list(overrides))


@pytest.mark.parametrize("name,overrides,env", CASES, ids=IDS)
def test_the_states_the_graphs_paths_replay_to_have_its_keys_and_successors(name, overrides, env):
    policy = _policy(name, overrides)
    sg = explore(policy, env, max_states=2500, timeout_s=120)
    trans = Transition(sg.canon, sg.env)
    loading = {sg.keys[u][2 + 8 * i] == 7 for u in range(sg.states) for i in range(sg.keys[u][0])}
    assert sg.states > 10 and (True in loading or not policy.connector.loads)  # some state has a LOADING request
    for node in range(0, sg.states, max(1, sg.states // 50)):
        s, now = _engine_state(sg, node)
        key = sg.canon.encode(s, now)
        successors = set(trans.successors(key))
        assert key == sg.keys[node] and _engine_successors(sg, trans, s, now) == successors, node
        assert successors == {sg.keys[v] for v in sg.graph.successors(node)} or not sg.complete


@pytest.mark.parametrize("name,overrides,env", CASES, ids=IDS)
def test_the_explorers_transitions_are_the_engines_steps_on_the_engines_own_states(name, overrides, env):
    policy = _policy(name, overrides)
    sg = explore(policy, env, max_states=20_000, timeout_s=120)
    nodes = set(sg.keys)
    trans = Transition(sg.canon, sg.env)
    layer = [SchedulerState(policy, [], num_tenants=env.tenants)]
    checked = 0
    for depth in range(DEPTH):
        now = depth * env.step_us
        following = {}
        for s in layer:
            key = sg.canon.encode(s, now)
            assert key in nodes or not sg.complete
            states = _engine_successor_states(sg, trans, s, now)
            assert {sg.canon.encode(c, now + env.step_us) for c in states} == set(trans.successors(key)), (depth, key)
            checked += 1
            for c in states:
                following.setdefault(fast_fingerprint(c), c)
        layer = list(following.values())[::max(1, len(following) // PER_LAYER)]  # a spread sample of the layer
    assert checked > 3 * DEPTH


DEPTH, PER_LAYER = 6, 60


@pytest.mark.parametrize("case", [0, 3, 5, 8], ids=[IDS[0], IDS[3], IDS[5], IDS[8]])
def test_memo_off_and_two_workers_give_the_same_graph(case):
    name, overrides, env = CASES[case]
    policy = _policy(name, overrides)
    a = explore(policy, env, max_states=2500)
    for other in (explore(policy, env, max_states=2500, memo=False), explore(policy, env, max_states=2500, workers=2)):
        assert a.keys == other.keys and list(a.graph.edges) == list(other.graph.edges)
