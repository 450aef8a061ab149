"""The liveness properties as checks on a replayed lasso, in the shape of the invariant catalogue.

A lasso file is replayed as its prefix plus two turns of its cycle (checker/verify/replay.py). The check
holds at every iteration but the last; at the last one it fails exactly when the replay shows the lasso:
the canonical state at the start of the cycle, after one turn and after two turns is the same, and both
turns do what the property forbids (eventually_served: the oldest live request at the start of the cycle
is live throughout; no_livelock: tokens are scheduled in each turn while nobody finishes and no client
cancels; no_deadlock: requests are live and no token is scheduled while no client cancels; no_hold_and_wait: some
request holds KV blocks outside the running batch throughout; the graph shows that no continuation ends it).

With prefix caching the frames carry the pool's counts but not its block tables, so the canonical state read
here leaves the pool's content out (and the prompt identities): the liveness check itself compares the whole
key, pool content included, on the engine's states before it saves a lasso (checker/liveness/check.py).
"""

from __future__ import annotations

from typing import Any

from checker.frames import TraceContext
from checker.liveness.canon import CANCELLED, LIVE, Canon
from checker.liveness.lasso import ALL_PROPERTIES, EVENTUALLY_SERVED, NO_HOLD_AND_WAIT, NO_LIVELOCK, STATEMENTS
from checker.semantics.state import FIELDS, Reason, Request, Status
from checker.requests import RequestSpec
from invariants.catalogue import Invariant

FINISHED, RUNNING = int(Status.FINISHED), int(Status.RUNNING)


def frame_key(canon: Canon, ctx: TraceContext, t: int) -> tuple:
    """The canonical key of the state after iteration t (t = -1: the empty system before the first)."""
    tenants = canon.tenants
    if t < 0:
        return canon.encode_requests([], 0, 0, (0,) * tenants)
    frame = ctx.frames[t]
    requests = []
    for i, slot in enumerate(frame.slots):
        prm = ctx.params[i]
        r = Request(RequestSpec(i, prm.arrival_us, prm.prompt_len, prm.output_len, prm.max_output, prm.priority,
                                prm.tenant))
        for name in FIELDS:
            setattr(r, name, slot[name])
        r.status, r.reason = Status(slot["status"]), Reason(slot["reason"])
        requests.append(r)
    step_us = ctx.frames[1].now_us - ctx.frames[0].now_us
    key = canon.encode_requests(requests, frame.now_us + step_us, t + 1, tuple(frame.counters) or (0,) * tenants)
    return key if frame.pool is None else key + tuple(frame.pool)  # with the cache: the pool's counts


def _live(ctx: TraceContext, t: int) -> list[int]:
    if t < 0:
        return []
    return [i for i, slot in enumerate(ctx.frames[t].slots) if slot["status"] in LIVE]


def _entered(ctx: TraceContext, t: int, status: int) -> bool:
    """Some request entered ``status`` in iteration t."""
    before = ctx.frames[t - 1].slots if t > 0 else ()
    return any(slot["status"] == status and (i >= len(before) or before[i]["status"] != status)
               for i, slot in enumerate(ctx.frames[t].slots))


def _holds_outside(ctx: TraceContext, t: int) -> bool:
    """After iteration t some request holds KV blocks and is not running (a load, a loaded request waiting, a
    cancelled or pinned request)."""
    return any(slot["blocks"] and slot["status"] != RUNNING for slot in ctx.frames[t].slots)


def _tokens(ctx: TraceContext, t: int) -> int:
    return sum(ctx.frames[t].scheduled)


def lasso_closes(ctx: TraceContext, prefix: int, cycle: int) -> bool:
    priorities = tuple(p.priority for p in ctx.params) or (0,)
    tenants = max(len(ctx.frames[0].counters), 1 + max((p.tenant for p in ctx.params), default=0))
    # frames carry no block tables: with prefix caching, the key without the pool's content (the liveness check
    # compares the whole key on the engine's states when it finds the lasso: checker.liveness.check)
    canon = Canon(ctx.policy, ctx.frames[1].now_us - ctx.frames[0].now_us, priorities, tenants, block_identity=False)
    k0, k1, k2 = (frame_key(canon, ctx, prefix - 1 + j * cycle) for j in range(3))
    return k0 == k1 == k2


def _violated(prop: str, ctx: TraceContext, prefix: int, cycle: int) -> bool:
    if not lasso_closes(ctx, prefix, cycle):
        return False
    turns = range(prefix, prefix + 2 * cycle)
    if prop == EVENTUALLY_SERVED:
        live = _live(ctx, prefix - 1)
        return bool(live) and all(ctx.frames[t].slots[live[0]]["status"] in LIVE for t in turns)
    if prop == NO_HOLD_AND_WAIT:  # some request holds KV blocks outside the running batch throughout
        return all(_holds_outside(ctx, t) for t in turns)
    no_cancel = not any(_entered(ctx, t, CANCELLED) for t in turns)
    if prop == NO_LIVELOCK:
        first, second = (sum(_tokens(ctx, t) for t in range(prefix + j * cycle, prefix + (j + 1) * cycle))
                         for j in range(2))
        return no_cancel and first > 0 and second > 0 and not any(_entered(ctx, t, FINISHED) for t in turns)
    return (no_cancel and all(_live(ctx, t - 1) for t in turns) and not any(_tokens(ctx, t) for t in turns))


def _check(prop: str):
    def check(o: Any, ctx: TraceContext, t: int, prefix: int = 0, cycle: int = 1) -> bool:
        if t != prefix + 2 * cycle - 1:
            return True
        return not _violated(prop, ctx, prefix, cycle)
    return check


def _trigger(o: Any, ctx: TraceContext, t: int, prefix: int = 0, cycle: int = 1) -> bool:
    return bool(_live(ctx, t))


LIVENESS: dict[str, Invariant] = {
    name: Invariant(name, STATEMENTS[name], _check(name), _trigger, {"prefix": 0, "cycle": 1})
    for name in ALL_PROPERTIES
}
