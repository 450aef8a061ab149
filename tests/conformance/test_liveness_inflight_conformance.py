"""The liveness explorer with speculative decoding and async scheduling is the engine's step (checker/liveness,
checker/semantics/speculative.py, inflight.py).

Every explorer transition equals the engine's step on the same inputs, the verifier's acceptance counts included:
from engine states (reached by the graph's BFS paths replayed on the engine, each request's ``accepted`` list as
concrete_trace writes it, and by random walks of the engine with random arrivals, cancels and acceptance counts),
stepping a copy under every environment choice (arrivals, cancels, and for every running request holding drafts every
allowed acceptance count, fed to the engine the way check-log feeds a log's counts) gives exactly the successor keys
the explorer computes from the key's representative. Also the graph with the memo off and with two worker processes.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import replace

import pytest

from checker.api import apply_overrides, load_policy
from checker.errors import InputError
from checker.liveness.canon import LIVE
from checker.liveness.explore import LivenessEnv, Transition, explore, live_positions
from checker.semantics.state import Request, SchedulerState
from checker.semantics.step import step
from tests.helpers import POLICIES
from tests.unit.test_liveness_cache import _engine_state

EAGLE = ["speculative.method=eagle", "speculative.num_tokens=2"]
ASYNC = ["pipeline.in_flight=1"]

# (policy, overrides, env): EAGLE lookahead on a pool that preempts; a draft model's budget slot and a budget that caps
# the drafts; n-gram (no lookahead); async scheduling alone, with cancels, with prefix caching; both together
CASES = [
    ("vllm_v1", EAGLE + ["kv.num_blocks=3", "batch.max_num_seqs=2"], LivenessEnv(3, (8, 16), (1, 4), arrivals_per_step=1)),
    ("vllm_v1", ["speculative.method=draft", "speculative.num_tokens=2", "batch.max_num_batched_tokens=6", "batch.max_num_seqs=2",
                 "kv.num_blocks=4"], LivenessEnv(2, (8,), (2, 4), cancellations=True)),
    ("vllm_v1", ["speculative.method=ngram", "speculative.num_tokens=3", "kv.num_blocks=2"],
     LivenessEnv(2, (16,), (1, 4), accepted=(0, 3))),
    ("vllm_v1", ASYNC + ["kv.num_blocks=3", "batch.max_num_seqs=2"], LivenessEnv(3, (8, 16), (1, 3), arrivals_per_step=1)),
    ("vllm_v1", ASYNC + ["kv.num_blocks=2"], LivenessEnv(2, (16,), (1, 2), cancellations=True)),
    ("prefix_caching/vllm_v1", ASYNC + ["kv.num_blocks=4", "batch.max_num_seqs=2"],
     LivenessEnv(2, (32,), (1, 2), identities=((0, 0),))),
    ("vllm_v1", ASYNC + EAGLE + ["kv.num_blocks=3", "batch.max_num_seqs=2"], LivenessEnv(2, (8, 16), (1, 3))),
    ("vllm_v1", ASYNC + EAGLE + ["kv.num_blocks=3"], LivenessEnv(2, (8, 16), (2, 4), cancellations=True)),
]
IDS = ["eagle", "draft-budget-cancels", "ngram", "async", "async-cancels", "async-cache", "async-eagle",
       "async-eagle-cancels"]


def _policy(name, overrides):
    return apply_overrides(load_policy(POLICIES / f"{name}.yaml"), list(overrides))


def _fed(c: SchedulerState, accepted: dict[int, int]) -> None:
    """The verifier accepts accepted[rid] of rid's drafts in the coming step (the entry speculative.accepted reads)."""
    for rid, a in accepted.items():
        c.spec.fed[rid] = [0] * c.spec.verified.get(rid, 0) + [a]


def _engine_successor_states(sg, trans: Transition, s: SchedulerState, now: int) -> list[SchedulerState]:
    """A copy of the engine state stepped under every choice: arrivals, cancels, and for every live request holding
    drafts every acceptance count the environment allows (capped at its drafts), whether it verifies or not."""
    arrivals, cancels = trans.choices(sg.canon.encode(s, now))
    live = live_positions(s)
    drafted = [] if s.spec is None else [(rid, s.spec.drafts[rid]) for rid in live if s.spec.drafts.get(rid)]
    options = [sorted({min(a, held) for a in sg.env.accepted}) for _, held in drafted]
    out = []
    for arriving in arrivals:
        for cancelled in cancels:
            for combo in itertools.product(*options):
                c = s.copy()
                new = [Request(sg.canon.spec(len(c.requests) + k, now, cid)) for k, cid in enumerate(arriving)]
                c.requests += new
                if drafted:
                    _fed(c, {rid: a for (rid, _), a in zip(drafted, combo)})
                step(c, new, [c.requests[live[i]] for i in cancelled], now)
                out.append(c)
    return out


def _engine_successors(sg, trans, s, now) -> set[tuple]:
    return {sg.canon.encode(c, now + sg.env.step_us) for c in _engine_successor_states(sg, trans, s, now)}


@pytest.mark.parametrize("name,overrides,env", CASES, ids=IDS)
def test_the_states_the_graphs_paths_replay_to_have_its_keys_and_successors(name, overrides, env):
    policy = _policy(name, overrides)
    sg = explore(policy, env, max_states=3000, timeout_s=60)
    trans = Transition(sg.canon, sg.env)
    assert sg.states > 10
    if policy.speculative.enabled:  # some edge is the verifier's choice, and some choice accepts a draft
        chosen = [lab.choice[2] for _, _, labels in sg.graph.edges(data="labels") for lab in labels]
        assert any(a for acc in chosen for _, a in acc) and any(acc and not any(a for _, a in acc) for acc in chosen)
    for key in sg.keys:  # every key decodes to a state that encodes to it
        s, now = sg.canon.decode(key)
        assert sg.canon.encode(s, now) == key
    for node in range(0, sg.states, max(1, sg.states // 40)):
        s, now = _engine_state(sg, node)
        key = sg.canon.encode(s, now)
        successors = set(trans.successors(key))
        assert key == sg.keys[node] and _engine_successors(sg, trans, s, now) == successors, node
        assert successors == {sg.keys[v] for v in sg.graph.successors(node)} or not sg.complete


@pytest.mark.parametrize("name,overrides,env", CASES, ids=IDS)
def test_the_explorers_transitions_are_the_engines_steps_on_random_engine_states(name, overrides, env):
    """Random walks of the engine (random arrivals, cancels and acceptance counts, each request numbered as the
    engine numbers it, absolute steps and times): at each state the explorer's successors of its key are the
    engine's."""
    policy = _policy(name, overrides)
    sg = explore(policy, env, max_states=1, timeout_s=5)  # the canon and the instance's environment
    trans = Transition(sg.canon, sg.env)
    rng = random.Random(17)
    checked = 0
    for walk in range(6):
        s = SchedulerState(policy, [], num_tenants=sg.env.tenants)
        for depth in range(8):
            now = depth * sg.env.step_us
            key = sg.canon.encode(s, now)
            states = _engine_successor_states(sg, trans, s, now)
            assert {sg.canon.encode(c, now + sg.env.step_us) for c in states} == set(trans.successors(key)), \
                (walk, depth, key)
            checked += 1
            s = rng.choice(states)
    assert checked == 48


@pytest.mark.parametrize("case", [1, 4, 6], ids=[IDS[1], IDS[4], IDS[6]])
def test_memo_off_and_two_workers_give_the_same_graph(case):
    name, overrides, env = CASES[case]
    policy = _policy(name, overrides)
    a = explore(policy, env, max_states=2500)
    for other in (explore(policy, env, max_states=2500, memo=False), explore(policy, env, max_states=2500, workers=2)):
        assert a.keys == other.keys and list(a.graph.edges) == list(other.graph.edges)
        assert [a.graph[u][v]["labels"] for u, v in a.graph.edges] == \
            [other.graph[u][v]["labels"] for u, v in other.graph.edges]


def test_the_worst_case_acceptance_is_a_subgraph():
    """--accepted 0 (every draft rejected) explores the transitions of the default (0..k) that accept nothing."""
    name, overrides, env = CASES[0]
    policy = _policy(name, overrides)
    every, worst = explore(policy, env), explore(policy, replace(env, accepted=(0,)))
    assert every.complete and worst.complete and worst.edges < every.edges
    assert set(worst.keys) <= set(every.keys)
    assert worst.env.describe()[-1].endswith("in {0} (capped at the drafts scheduled)")


def test_pipeline_parallel_is_refused_by_name():
    policy = _policy("vllm_v1", ASYNC)
    deeper = policy.model_copy(update={"pipeline": policy.pipeline.model_copy(update={"in_flight": 2})})
    with pytest.raises(InputError, match="pipeline.in_flight=2"):
        explore(deeper, LivenessEnv(1, (16,), (1,)))
