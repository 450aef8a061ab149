"""Canonical states, the explorer and the lasso search (checker/liveness)."""

from __future__ import annotations

import pytest

from checker.api import apply_overrides, load_policy
from checker.errors import InputError
from checker.liveness.canon import Canon
from checker.liveness.check import NO_COUNTEREXAMPLE, VIOLATED, check_liveness, concrete_trace
from checker.liveness.explore import LivenessEnv, Transition, explore
from checker.liveness.lasso import find_lasso, starvation_bound
from checker.semantics.state import SchedulerState
from checker.requests import RequestSpec
from checker.semantics.step import step
from tests.helpers import POLICIES

SMALL_POOL = ["kv.num_blocks=8"]


def _policy(name: str, overrides=()):
    return apply_overrides(load_policy(POLICIES / f"{name}.yaml"), list(overrides))


@pytest.mark.parametrize("name,overrides,env", [
    ("vllm_v1", SMALL_POOL, LivenessEnv(2, (16, 48), (1, 3))),
    ("priority_aging", ["batch.max_num_seqs=1"], LivenessEnv(2, (16,), (1, 2), (0, 1), step_us=250_000)),
    ("vtc_fair", ["batch.max_num_seqs=1"], LivenessEnv(2, (16,), (1,), tenants=2)),
    ("tgi_router", [], LivenessEnv(2, (16,), (1, 2), cancellations=True)),
])
def test_every_key_decodes_to_a_state_with_the_same_key_and_the_same_successors(name, overrides, env):
    sg = explore(_policy(name, overrides), env, max_states=400)
    trans = Transition(sg.canon, env)
    assert sg.states > 3
    for key in sg.keys:
        s, now = sg.canon.decode(key)
        assert sg.canon.encode(s, now) == key
    for node in range(0, sg.states, 7):  # a path to the node replays to the node
        path = sg.path_to(node)
        specs = concrete_trace(sg, path + [(node, ((), ()))])
        assert len(specs) >= sg.keys[node][0]
    assert set(trans.successors(sg.keys[0])) == set(sg.keys[v] for v in sg.graph.successors(0))


def _two_requests(policy, offset_us: int, earlier: int) -> tuple[SchedulerState, int]:
    """Two requests arriving 10 ms apart at `offset_us`, after `earlier` requests that finished before,
    stepped for three iterations."""
    specs = [RequestSpec(i, 10_000 * i, 16, 1, 1) for i in range(earlier)]
    specs += [RequestSpec(earlier + i, offset_us + 10_000 * i, 16, 5, 5) for i in range(2)]
    s = SchedulerState(policy, specs)
    times = sorted({r.arrival_us for r in s.requests})
    for now in times + [offset_us + 20_000]:
        step(s, [r for r in s.requests if r.arrival_us == now], [], now)
    return s, offset_us + 30_000


def test_keys_forget_absolute_time_request_numbers_and_sequence_numbers():
    policy = _policy("vllm_v1", SMALL_POOL)
    canon = Canon(policy, 10_000)
    first = _two_requests(policy, 0, 0)
    later = _two_requests(policy, 5_000_000, 3)  # other numbers, other admission sequence numbers
    assert later[0].requests[-1].admitted_seq != first[0].requests[-1].admitted_seq
    key = canon.encode(*first)
    assert key == canon.encode(*later) and key[0] == 2


def test_aging_keys_cap_ages_but_keep_their_phase():
    policy = _policy("priority_aging")
    canon = Canon(policy, 250_000, (0, 1))  # period 4 iterations, cap (1 - 0) * 4
    assert [canon._cap(x) for x in (0, 3, 4, 5, 8, 9, 13)] == [0, 3, 4, 5, 4, 5, 5]
    with pytest.raises(InputError, match="a divisor of the aging interval"):
        Canon(policy, 300_000)


def test_a_never_fitting_head_under_aging_is_a_finite_deadlock():
    # without the age cap the waiting request's age would grow forever and the graph would never close
    report = check_liveness(_policy("priority_aging", ["kv.num_blocks=4"]), None,
                            LivenessEnv(1, (100,), (1,), step_us=250_000), ["no_deadlock"])
    assert report.graph.complete and [r.verdict for r in report.results] == [VIOLATED]


def test_a_cut_off_graph_gives_no_counterexample_never_proved():
    report = check_liveness(_policy("vllm_v1", SMALL_POOL), None, LivenessEnv(3, (16, 48), (1, 3)), None,
                            max_states=50)
    assert not report.graph.complete and "state limit (50) reached" in report.graph_line()
    assert {r.verdict for r in report.results} == {NO_COUNTEREXAMPLE} and report.bound is None
    assert int(report.exit_code()) == 3


def test_fcfs_with_room_for_everyone_has_no_lasso_and_bound_zero():
    sg = explore(_policy("vllm_v1"), LivenessEnv(2, (16,), (1, 2)))
    assert sg.complete
    assert [find_lasso(sg, p) for p in ("eventually_served", "no_livelock", "no_deadlock")] == [None] * 3
    assert starvation_bound(sg).iterations == 0


def test_symmetry_reduction_merges_identical_requests():
    # two identical requests arriving together are one state, whichever slot each one took
    sg = explore(_policy("vllm_v1", SMALL_POOL), LivenessEnv(2, (48,), (3,)))
    both = [k for k in sg.keys if k[0] == 2]
    assert len(both) == len(set(both))
    assert sg.states < 20


def test_environment_values_are_checked():
    with pytest.raises(InputError, match=r"--prompts=0 \(expected token counts >= 1\)"):
        LivenessEnv(1, (0,), (1,))
    with pytest.raises(InputError, match=r"--requests=0 \(expected >= 1\)"):
        LivenessEnv(0, (1,), (1,))


@pytest.mark.parametrize("name,overrides,env", [
    ("vllm_v1", SMALL_POOL, LivenessEnv(3, (16, 48), (1, 3), cancellations=True)),
    ("priority_aging", ["kv.num_blocks=6"], LivenessEnv(2, (16, 48), (1, 3), (0, 1), cancellations=True,
                                                        step_us=250_000)),
    ("vtc_fair", ["batch.max_num_seqs=1"], LivenessEnv(2, (16,), (1,), tenants=2)),
    ("vllm_v0_no_chunking", SMALL_POOL, LivenessEnv(3, (16, 48), (1, 2), cancellations=True)),
    ("tiered_shedding", ["timeouts.queue_timeout_ms=30", "kv.num_blocks=4"],
     LivenessEnv(2, (16, 48), (1, 2), (0, 1), cancellations=True)),
    ("vllm_v0_no_chunking", [*SMALL_POOL, "preemption.mode=swap", "kv.swap_blocks=4"], LivenessEnv(3, (16, 48), (1, 3))),
    ("sarathi_serve", SMALL_POOL, LivenessEnv(3, (16, 48), (1, 2))),
])
def test_the_schedule_memo_gives_the_graph_of_whole_steps(name, overrides, env):
    """Phases 5-6 memoized by the canonical key after phases 1-4 (queue timeouts, cancels with a release lag,
    requeues at the front, tenant counters, aging) give the same states, edges, labels and BFS tree."""
    def dump(sg):
        edges = sorted((sg.keys[u], sg.keys[v], labels) for u, v, labels in sg.graph.edges(data="labels"))
        return sg.keys, sg.depth, sg.parent, edges
    policy = _policy(name, overrides)
    memo, whole = explore(policy, env, max_states=600), explore(policy, env, max_states=600, memo=False)
    assert memo.steps_run < whole.steps_run == whole.choices_run == memo.choices_run
    assert dump(memo) == dump(whole)


@pytest.mark.parametrize("max_states", [10_000, 150])
def test_worker_processes_give_the_graph_of_one_process(max_states):
    def dump(sg):
        edges = sorted((sg.keys[u], sg.keys[v], labels) for u, v, labels in sg.graph.edges(data="labels"))
        return sg.keys, sg.depth, sg.parent, edges, sg.complete, sg.stop_reason
    policy = _policy("vllm_v1", SMALL_POOL)
    env = LivenessEnv(3, (16, 48), (1, 3), cancellations=True)
    one, two = explore(policy, env, max_states=max_states), explore(policy, env, max_states=max_states, workers=2)
    assert dump(two) == dump(one)
    assert one.complete == (max_states > one.states)


def test_the_graph_is_the_one_add_edges_from_builds():
    """explore() hands its adjacency dicts to networkx directly: the same nodes, edges, data and orders as
    add_edges_from over the edges in the order they were found, and networkx's algorithms agree."""
    import networkx as nx

    sg = explore(_policy("vllm_v1", SMALL_POOL), LivenessEnv(3, (16, 48), (1, 3)))
    found = [(u, v, data) for u in range(sg.states) for v, data in sg.graph.succ[u].items()]
    built = nx.DiGraph()
    built.add_node(0)
    built.add_edges_from(found)
    assert list(sg.graph.nodes) == list(built.nodes) == list(range(sg.states))
    assert list(sg.graph.edges(data=True)) == list(built.edges(data=True))
    assert all(list(sg.graph.pred[v].items()) == list(built.pred[v].items()) for v in built.nodes)
    assert sg.graph.number_of_edges() == sg.edges == len(found)
    assert sorted(map(sorted, nx.strongly_connected_components(sg.graph))) == \
        sorted(map(sorted, nx.strongly_connected_components(built)))
    sg.graph.add_edge(0, 1, labels=())  # still a working networkx graph
    assert sg.graph.has_edge(0, 1)
