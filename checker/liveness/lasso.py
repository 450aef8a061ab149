"""Lassos in the state graph: strongly connected components of the edges a property allows.

A violation of a liveness property is a lasso: a path from the empty system to a state, then a cycle
back to that state that the system can repeat forever. Each property says which iterations may lie on
the cycle (``allows``) and, for no_livelock, which one must (tokens scheduled):

- eventually_served: the oldest live request of the source is still live after the iteration. Live
  requests keep their arrival order and new ones queue behind, so a request stays live forever on a
  cycle exactly when the oldest one does (docs/liveness.md).
- no_livelock: nobody finishes and no client cancels; some iteration on the cycle schedules tokens.
  (On such a cycle no request produces a token either: its output count would grow.)
- no_deadlock: requests are live, no token is scheduled and no client cancels.
- no_hold_and_wait (KV connectors): from every reachable state, a state in which no request holds KV blocks
  outside the running batch (a load, a loaded request waiting, a cancelled or pinned request holding blocks) is
  reachable, with the environment's help (it may stop arrivals, cancel). A violation is a reachable state from
  which no such state can be reached: every state after it has a holder, and the lasso is a cycle among them.

The starvation bound is the longest path in the graph of (state, request) pairs where the request has
arrived and waits for its first admission: a DAG when no request can wait forever.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import networkx as nx

from checker.liveness.canon import (ADMITTED_AT, BLOCKS_AT, FIELDS_PER_REQUEST, RUNNING, STATUS_AT, WAITING,
                                    holding_count, live_field)
from checker.liveness.explore import Choice, Label, StateGraph

EVENTUALLY_SERVED = "eventually_served"
NO_LIVELOCK = "no_livelock"
NO_DEADLOCK = "no_deadlock"
NO_HOLD_AND_WAIT = "no_hold_and_wait"
PROPERTIES = (EVENTUALLY_SERVED, NO_LIVELOCK, NO_DEADLOCK)  # checked by default on every policy
ALL_PROPERTIES = PROPERTIES + (NO_HOLD_AND_WAIT,)  # no_hold_and_wait: by default with a KV connector


def default_properties(policy) -> tuple[str, ...]:
    """The properties checked when none is chosen: the three, and no_hold_and_wait with a KV connector."""
    return ALL_PROPERTIES if policy.connector.enabled else PROPERTIES

STATEMENTS = {
    EVENTUALLY_SERVED: "Every request that arrives eventually finishes, is rejected or is cancelled, whatever "
                       "the environment does (a violation: a request stays live on a cycle the system can repeat).",
    NO_LIVELOCK: "No cycle the system can repeat schedules tokens while no request finishes and no client cancels "
                 "(recompute thrash).",
    NO_DEADLOCK: "No cycle the system can repeat leaves live requests without any token scheduled while no client "
                 "cancels (the unbounded form of no_deadlock(steps) for every steps).",
    NO_HOLD_AND_WAIT: "From every reachable state, a state in which no request holds KV blocks outside the running "
                      "batch (a load, a loaded request waiting, a cancelled or pinned request) is reachable (a "
                      "violation: a state after which some request holds blocks outside the batch forever, whatever "
                      "the environment does).",
}


def holds_outside(key: tuple, timed: bool) -> bool:
    """Some request of the state holds KV blocks outside the running batch: a live request that is not running
    with blocks (a load, a loaded request waiting), or a request holding KV after it left (cancelled, pinned)."""
    for i in range(key[0]):
        if live_field(key, i, STATUS_AT) != RUNNING and live_field(key, i, BLOCKS_AT):
            return True
    return holding_count(key, timed) > 0


def _never_free(sg: StateGraph) -> set[int]:
    """The states from which no state without a holder outside the batch is reachable (closed under successors).
    States the exploration did not expand (no successor: a cut graph's frontier) count as ones that may reach it."""
    graph = sg.graph
    timed = sg.canon.timed
    free = [u for u in range(sg.states) if not holds_outside(sg.keys[u], timed) or not graph.succ[u]]
    reach = set(free)
    stack = list(free)
    while stack:
        v = stack.pop()
        for u in graph.pred[v]:
            if u not in reach:
                reach.add(u)
                stack.append(u)
    return set(range(sg.states)) - reach


def _allows(prop: str, sg: StateGraph) -> Callable[[int, Label], bool]:
    if prop == EVENTUALLY_SERVED and sg.canon.blocking:
        return lambda u, lab: _unblocked_stays(sg, u, lab)
    if prop == EVENTUALLY_SERVED:
        return lambda u, lab: sg.live_count(u) > 0 and not lab.gone & 1
    if prop == NO_LIVELOCK:
        return lambda u, lab: not lab.finished and not lab.cancelled
    if prop == NO_HOLD_AND_WAIT:
        never = _never_free(sg)
        return lambda u, lab: u in never
    if sg.canon.blocking:  # requests the environment keeps blocked do not count as waiting for a token
        return lambda u, lab: _oldest_unblocked(sg, u, lab) is not None and lab.tokens == 0 and not lab.cancelled
    return lambda u, lab: sg.live_count(u) > 0 and lab.tokens == 0 and not lab.cancelled


def _oldest_unblocked(sg: StateGraph, u: int, lab: Label) -> int | None:
    """The live position of the oldest request of the source not blocked in the iteration (its grammar ready
    before, or made ready by the label's readiness choice), or None."""
    flags = sg.canon.blocked_flags(sg.keys[u])
    ready = lab.choice[3] if len(lab.choice) > 3 else ()
    return next((i for i, f in enumerate(flags) if not f or i in ready), None)


def _unblocked_stays(sg: StateGraph, u: int, lab: Label) -> bool:
    """eventually_served with blocked waiting states: the oldest live request of the source that is not blocked in
    the iteration (its grammar ready before, or made ready by the environment's readiness choice) is still live
    after it. A request the environment keeps blocked forever is excluded (it can never be served); on a cycle of
    such edges the request followed can only change to an older one, so one request whose grammar is ready stays
    live forever (docs/liveness.md, "Blocked waiting states")."""
    i = _oldest_unblocked(sg, u, lab)
    return i is not None and not lab.gone >> i & 1


@dataclass
class Lasso:
    prop: str
    prefix: list[tuple[int, Choice]]  # (source node, choice) per iteration, from the empty system
    cycle: list[tuple[int, Choice]]  # (source node, choice) per iteration; ends where it starts

    @property
    def start(self) -> int:
        return self.cycle[0][0]


def _allowed_subgraph(sg: StateGraph, allows) -> nx.DiGraph:
    h = nx.DiGraph()
    for u, v, labels in sg.graph.edges(data="labels"):
        for lab in labels:
            if allows(u, lab):
                h.add_edge(u, v, label=lab)
                break
    return h


def _shortest_path(h: nx.DiGraph, source: int, target: int, within: set[int]) -> list[int]:
    """Nodes of a shortest path source -> target inside ``within`` (BFS)."""
    parent = {source: None}
    queue = deque([source])
    while queue:
        u = queue.popleft()
        if u == target:
            break
        for v in h.successors(u):
            if v in within and v not in parent:
                parent[v] = u
                queue.append(v)
    path = [target]
    while path[-1] != source:
        path.append(parent[path[-1]])
    return path[::-1]


def find_lasso(sg: StateGraph, prop: str) -> Lasso | None:
    """A lasso violating the property with the shortest prefix to its cycle, or None."""
    allows = _allows(prop, sg)
    h = _allowed_subgraph(sg, allows)
    best: tuple[int, int, int] | None = None  # (depth of the entry, entry node, first cycle node after it)
    best_scc: set[int] = set()
    for scc in nx.strongly_connected_components(h):
        nodes = set(scc)
        for u in nodes:
            for v, data in h[u].items():
                if v not in nodes:
                    continue
                if prop == NO_LIVELOCK and not _scheduling_edge(sg, u, v, allows):
                    continue
                if best is None or sg.depth[u] < best[0]:
                    best, best_scc = (sg.depth[u], u, v), nodes
    if best is None:
        return None
    _, u, v = best
    if prop == NO_LIVELOCK:
        first = next(lab for lab in sg.graph[u][v]["labels"] if allows(u, lab) and lab.tokens > 0)
    else:
        first = h[u][v]["label"]
    back = _shortest_path(h, v, u, best_scc) if v != u else [u]
    cycle = [(u, first.choice)] + [(a, h[a][b]["label"].choice) for a, b in zip(back, back[1:])]
    return Lasso(prop, sg.path_to(u), cycle)


def _scheduling_edge(sg: StateGraph, u: int, v: int, allows) -> bool:
    return any(allows(u, lab) and lab.tokens > 0 for lab in sg.graph[u][v]["labels"])


# ----------------------------------------------------------------------------------------- starvation bound
@dataclass
class StarvationBound:
    iterations: int | None  # the longest wait for a first admission, in iterations (None: unbounded)
    witness: list[tuple[int, Choice]]  # (source node, choice) per iteration up to the last waiting state
    arrival_iteration: int  # the iteration in which the witness request arrives
    position: int  # the witness request's position (arrival order) in the last waiting state


def _never_admitted_waiting(key: tuple, i: int) -> bool:
    return live_field(key, i, STATUS_AT) == WAITING and live_field(key, i, ADMITTED_AT) == 0


def starvation_bound(sg: StateGraph) -> StarvationBound:
    """The longest time a request waits for its first admission, from the graph of (state, request)
    pairs; its witness is a path that makes some request wait that long."""
    keys = sg.keys
    pairs = nx.DiGraph()
    blocking = sg.canon.blocking  # a request waits from the first state in which its grammar is ready
    for u in range(sg.states):
        flags = sg.canon.blocked_flags(keys[u]) if blocking else ()
        for i in range(keys[u][0]):
            if _never_admitted_waiting(keys[u], i) and not (blocking and flags[i]):
                pairs.add_node((u, i))
    for u, v, labels in sg.graph.edges(data="labels"):
        waiting = [i for i in range(keys[u][0]) if (u, i) in pairs]
        for lab in labels:
            for i in waiting:
                if lab.gone >> i & 1:
                    continue
                j = i - bin(lab.gone & ((1 << i) - 1)).count("1")
                if (v, j) in pairs:
                    pairs.add_edge((u, i), (v, j), choice=lab.choice)
    if pairs.number_of_nodes() == 0:
        return StarvationBound(0, [], 0, 0)
    if not nx.is_directed_acyclic_graph(pairs):
        return StarvationBound(None, [], 0, 0)
    path = nx.dag_longest_path(pairs)
    head = path[0][0]
    witness = sg.path_to(head) + [(a[0], pairs[a][b]["choice"]) for a, b in zip(path, path[1:])]
    return StarvationBound(len(path), witness, sg.depth[head] - 1, path[-1][1])
