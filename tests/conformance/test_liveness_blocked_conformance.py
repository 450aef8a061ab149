"""The liveness explorer with blocked waiting states is the engine's step (checker/liveness,
checker/semantics/blocked.py).

In the explorer the grammar delay is the environment's choice: a blocked request's key says only "blocked"
(Canon.blocked_flags), and before each iteration the environment chooses which blocked requests' grammars are ready
in that iteration's scan (Transition.readiness; the others stay blocked, maybe forever). On the engine the same
choice is a value of ``s.blocked``: ready now is the step's own index (the scan finds it ready), staying blocked is
a step that never comes. From engine states (reached by the graph's BFS paths replayed on the engine, each grammar's
delay as concrete_trace writes it, and by random walks of the engine with random arrivals, cancels and readiness),
stepping a copy under every environment choice gives exactly the successor keys the explorer computes from the
key's representative. Also the graph with the memo off and with two worker processes. (The refusal that stays,
connector.loads_may_fail: tests/unit/test_blocked_states.py.)
"""

from __future__ import annotations

import itertools
import random

import pytest

from checker.api import apply_overrides, load_policy
from checker.liveness.explore import LivenessEnv, Transition, explore, live_positions
from checker.semantics.state import NEVER, Request, SchedulerState
from checker.semantics.step import step
from tests.helpers import ROOT
from tests.unit.test_liveness_cache import _engine_state

BLOCKED = ROOT / "tests" / "data" / "blocked"

# (policy, overrides, env): the stop and skip scans on a batch of one seat (requests wait behind each other), with
# cancels, and on a small pool that preempts
CASES = [
    ("stop", ["batch.max_num_seqs=1"], LivenessEnv(3, (16,), (1, 2), arrivals_per_step=1)),
    ("skip", ["batch.max_num_seqs=1"], LivenessEnv(3, (16,), (1, 2), arrivals_per_step=1)),
    ("skip", ["batch.max_num_seqs=1"], LivenessEnv(2, (16,), (1, 2), cancellations=True)),
    ("stop", ["kv.num_blocks=2"], LivenessEnv(2, (16,), (1, 16), cancellations=True)),
]
IDS = ["stop-one-seat", "skip-one-seat", "skip-cancels", "stop-small-pool-cancels"]


def _policy(name, overrides):
    return apply_overrides(load_policy(BLOCKED / f"vllm_v1_blocked_{name}.yaml"), list(overrides))


def _blocked(s: SchedulerState) -> list[int]:
    """The rids of the live requests blocked in the coming scan (their grammar not ready at s.step)."""
    return [rid for rid in live_positions(s) if s.blocked.get(rid, -1) > s.step]


def _engine_successor_states(sg, trans: Transition, s: SchedulerState, now: int) -> list[SchedulerState]:
    """A copy of the engine state stepped under every choice: arrivals, cancels, and every set of blocked requests
    whose grammar is ready in this step's scan (s.blocked set to the step), the others blocked for good (NEVER)."""
    arrivals, cancels = trans.choices(sg.canon.encode(s, now))
    live, waiting = live_positions(s), _blocked(s)
    out = []
    for arriving in arrivals:
        for cancelled in cancels:
            for n in range(len(waiting) + 1):
                for ready in itertools.combinations(waiting, n):
                    c = s.copy()
                    for rid in waiting:
                        c.blocked[rid] = c.step if rid in ready else NEVER
                    new = [Request(sg.canon.spec(len(c.requests) + k, now, cid)) for k, cid in enumerate(arriving)]
                    c.requests += new
                    step(c, new, [c.requests[live[i]] for i in cancelled], now)
                    out.append(c)
    return out


def _successor_keys(sg, trans, s, now) -> tuple[set[tuple], set[tuple], list[SchedulerState]]:
    """(the engine's successor keys, the explorer's successors of the state's key, the engine's successor states)."""
    states = _engine_successor_states(sg, trans, s, now)
    engine = {sg.canon.encode(c, now + sg.env.step_us) for c in states}
    return engine, set(trans.successors(sg.canon.encode(s, now))), states


@pytest.mark.parametrize("name,overrides,env", CASES, ids=IDS)
def test_the_states_the_graphs_paths_replay_to_have_its_keys_and_successors(name, overrides, env):
    sg = explore(_policy(name, overrides), env, max_states=3000, timeout_s=60)
    trans = Transition(sg.canon, sg.env)
    assert sg.complete and sg.states > 10
    chosen = [lab.choice[3] for _, _, labels in sg.graph.edges(data="labels") for lab in labels]
    assert any(chosen) and () in chosen  # some grammar becomes ready, some stays blocked
    assert any(any(sg.canon.blocked_flags(key)) for key in sg.keys)
    assert all(sg.canon.encode(*sg.canon.decode(key)) == key for key in sg.keys)  # decode, encode: the same key
    for node in range(0, sg.states, max(1, sg.states // 40)):
        s, now = _engine_state(sg, node)
        engine, explorer, _ = _successor_keys(sg, trans, s, now)
        assert sg.canon.encode(s, now) == sg.keys[node] and engine == explorer, node
        assert explorer == set(map(sg.keys.__getitem__, sg.graph.successors(node)))


@pytest.mark.parametrize("name,overrides,env", CASES, ids=IDS)
def test_the_explorers_transitions_are_the_engines_steps_on_random_engine_states(name, overrides, env):
    """Random walks of the engine (random arrivals, cancels and readiness, absolute steps and times): at each state
    the explorer's successors of its key are the engine's."""
    policy = _policy(name, overrides)
    sg = explore(policy, env, max_states=1, timeout_s=5)  # the canon and the instance's environment
    trans, rng = Transition(sg.canon, sg.env), random.Random(16)
    walks = 0
    while walks < 5:
        s, walks = SchedulerState(policy, [], num_tenants=sg.env.tenants), walks + 1
        for depth in range(8):
            engine, explorer, states = _successor_keys(sg, trans, s, depth * sg.env.step_us)
            assert engine == explorer, (walks, depth)
            s = rng.choice(states)


def _graph(g) -> tuple:
    return g.keys, list(g.graph.edges), [g.graph[u][v]["labels"] for u, v in g.graph.edges]


@pytest.mark.parametrize("case", [0, 2], ids=[IDS[0], IDS[2]])
def test_memo_off_and_two_workers_give_the_same_graph(case):
    name, overrides, env = CASES[case]
    policy = _policy(name, overrides)
    graphs = [explore(policy, env, max_states=2500, memo=memo, workers=workers)
              for memo, workers in ((True, 1), (False, 1), (True, 2))]
    assert _graph(graphs[0]) == _graph(graphs[1]) == _graph(graphs[2])
