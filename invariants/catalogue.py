"""The invariant catalogue. Each invariant is a small named predicate with parameters, one property each.

An invariant is written once against ``Ops`` and a TraceContext (the policy, the slots' parameters, the
frames so far): ``check(o, ctx, t, **params)`` says whether the property holds at frame ``t``, looking
back at earlier frames where it needs to. The engine's traces evaluate it with IntOps; the verifier
evaluates the very same function on z3 terms. ``trigger`` says whether the situation the property is
about happens at frame ``t`` (used to report VACUOUS when it never can).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from checker.frames import TraceContext
from checker.policy import Allocation, Scheduler
from checker.semantics.state import Status
from checker.smt.encode import max_context
from checker.smt.ops import Term, sum_terms

Check = Callable[..., Term]


@dataclass(frozen=True)
class Invariant:
    name: str
    statement: str  # the property in one sentence
    check: Check
    trigger: Check
    defaults: dict[str, int] = field(default_factory=dict)

    def holds(self, o: Any, ctx: TraceContext, t: int, params: dict[str, int] | None = None) -> Term:
        return self.check(o, ctx, t, **{**self.defaults, **(params or {})})

    def triggered(self, o: Any, ctx: TraceContext, t: int, params: dict[str, int] | None = None) -> Term:
        return self.trigger(o, ctx, t, **{**self.defaults, **(params or {})})


def _status_in(o: Any, slot: dict[str, Term], *statuses: Status) -> Term:
    return o.or_(*(slot["status"] == int(x) for x in statuses))


def _decoding(o: Any, ctx: TraceContext, t: int, i: int) -> Term:
    slot, prm = ctx.frames[t].slots[i], ctx.params[i]
    return o.and_(slot["status"] == int(Status.RUNNING), slot["num_generated"] >= 1,
                  slot["num_computed"] + 1 == prm.prompt_len + slot["num_generated"])


def _any_slot(o: Any, ctx: TraceContext, pred: Callable[[int], Term]) -> Term:
    return o.or_(*(pred(i) for i in range(ctx.num_slots)))


def _all_slots(o: Any, ctx: TraceContext, pred: Callable[[int], Term]) -> Term:
    return o.and_(*(pred(i) for i in range(ctx.num_slots)))


HAS_WORK = (Status.WAITING, Status.SWAPPED, Status.RUNNING)


# ----------------------------------------------------------------------------------------- KV and budgets
def kv_never_overcommitted(o: Any, ctx: TraceContext, t: int, headroom: int = 0) -> Term:
    """Blocks in use, plus `headroom` blocks, never exceed the pool."""
    return ctx.frames[t].kv_used + headroom <= ctx.policy.kv.num_blocks


def _kv_fills(o: Any, ctx: TraceContext, t: int, headroom: int = 0) -> Term:
    return ctx.frames[t].kv_used + headroom >= ctx.policy.kv.num_blocks


def _lookahead_slots(ctx: TraceContext) -> int:
    """The drafter's lookahead slots a scheduled request needs past its computed tokens (0 without speculative
    decoding; checker.policy.Speculative.lookahead_slots, whatever the policy reserves)."""
    spec = ctx.policy.speculative
    return spec.lookahead_slots if spec.enabled else 0


def _kv_with_lookahead(o: Any, ctx: TraceContext, t: int) -> Term:
    """Blocks in use, plus the blocks each request scheduled in the step and still running lacks for its computed
    tokens and the drafter's lookahead slots (capped at max_model_len). Without lookahead slots: blocks in use."""
    frame, look = ctx.frames[t], _lookahead_slots(ctx)
    if not look:
        return frame.kv_used
    size, cap = ctx.policy.kv.block_size, ctx.policy.max_model_len

    def lacks(i: int) -> Term:
        s = frame.slots[i]
        need = o.ceil_div(o.min(s["num_computed"] + look, cap), size)
        short = o.and_(frame.scheduled[i] > 0, s["status"] == int(Status.RUNNING), need > s["blocks"])
        return o.ite(short, need - s["blocks"], 0)
    return frame.kv_used + sum_terms([lacks(i) for i in range(ctx.num_slots)])


def lookahead_fits(o: Any, ctx: TraceContext, t: int) -> Term:
    """Blocks in use never exceed the pool counting the lookahead slots: every request scheduled in a step that
    still runs after it counts the blocks of its computed tokens plus the drafter's lookahead slots (capped at
    max_model_len), held or not. Without lookahead slots (no speculative decoding, or n-gram drafting) it is
    kv_never_overcommitted."""
    return _kv_with_lookahead(o, ctx, t) <= ctx.policy.kv.num_blocks


def _kv_fills_with_lookahead(o: Any, ctx: TraceContext, t: int) -> Term:
    return _kv_with_lookahead(o, ctx, t) >= ctx.policy.kv.num_blocks


def token_budget(o: Any, ctx: TraceContext, t: int) -> Term:
    """The tokens scheduled in one step never exceed max_num_batched_tokens (under SGLang's rules, where that is
    the prefill chunk budget, a decode step's max_num_seqs rows may be more)."""
    return sum_terms(list(ctx.frames[t].scheduled)) <= ctx.policy.step_token_bound


def _tokens_scheduled(o: Any, ctx: TraceContext, t: int) -> Term:
    return _any_slot(o, ctx, lambda i: ctx.frames[t].scheduled[i] > 0)


def scheduled_requests_run(o: Any, ctx: TraceContext, t: int) -> Term:
    """A request given tokens in a step is running after it, or finished in it: a step never serves a request
    that it also preempts or leaves waiting. (Under SGLang's rules an aborted running request runs one more row and
    ends cancelled in that step.)"""
    frame = ctx.frames[t]
    ends = (Status.RUNNING, Status.FINISHED, Status.CANCELLED) if ctx.policy.scheduler is Scheduler.SGLANG else \
        (Status.RUNNING, Status.FINISHED)
    return _all_slots(o, ctx, lambda i: o.or_(frame.scheduled[i] == 0, _status_in(o, frame.slots[i], *ends)))


def seq_cap(o: Any, ctx: TraceContext, t: int) -> Term:
    """Running requests never exceed max_num_seqs."""
    running = sum_terms([o.b2i(s["status"] == int(Status.RUNNING)) for s in ctx.frames[t].slots])
    return running <= ctx.policy.batch.max_num_seqs


def _something_runs(o: Any, ctx: TraceContext, t: int) -> Term:
    return _any_slot(o, ctx, lambda i: ctx.frames[t].slots[i]["status"] == int(Status.RUNNING))


def prompt_fully_computed(o: Any, ctx: TraceContext, t: int) -> Term:
    """A request that produces an output token in a step has computed its whole prompt and every earlier output
    token by the end of that step (no token is sampled after a truncated prompt)."""
    frame = ctx.frames[t]
    return _all_slots(o, ctx, lambda i: o.or_(o.not_(frame.produced[i]), frame.slots[i]["num_computed"] + 1
                                              >= ctx.params[i].prompt_len + frame.slots[i]["num_generated"]))


def _something_produced(o: Any, ctx: TraceContext, t: int) -> Term:
    return _any_slot(o, ctx, lambda i: ctx.frames[t].produced[i])


def request_conservation(o: Any, ctx: TraceContext, t: int) -> Term:
    """Each request is in exactly one state and holds KV only where that state allows; the KV in use is
    the sum of what requests hold (none lost or duplicated)."""
    frame = ctx.frames[t]
    connector = ctx.policy.connector  # its holding states (checker.semantics.transfer), only with one
    top = Status.LOADING if connector.loads else Status.CANCELLED

    def ok(i: int) -> Term:
        s = frame.slots[i]
        held = [s["status"] == int(Status.RUNNING), o.and_(s["status"] == int(Status.CANCELLED), s["release_step"] != -1)]
        if connector.loads:  # a load in flight, and a loaded request not yet running
            held += [s["status"] == int(Status.LOADING), s["status"] == int(Status.WAITING)]
        if connector.pins:  # a finished request pinned until its transfer is confirmed
            held.append(o.and_(s["status"] == int(Status.FINISHED), s["release_step"] != -1))
        return o.and_(s["status"] >= int(Status.PENDING), s["status"] <= int(top),
                      o.or_(o.or_(*held), s["blocks"] == 0), s["blocks"] >= 0,
                      o.or_(s["status"] == int(Status.SWAPPED), s["swapped_blocks"] == 0))
    shared = frame.pool.shared if frame.pool is not None else 0  # a block several requests list is used once
    # SGLang's radix cache: the tree's protected pages are in use beyond what the requests hold themselves
    tree = frame.radix[1] // ctx.policy.kv.block_size if frame.radix is not None else 0
    return o.and_(_all_slots(o, ctx, ok),
                  frame.kv_used == sum_terms([s["blocks"] for s in frame.slots]) - shared + tree)


def sglang_memory_identity(o: Any, ctx: TraceContext, t: int) -> Term:
    """Under SGLang's rules with the radix cache, SGLang's memory identity: the pool's available, evictable,
    protected and held tokens make up the pool (available: free pages outside the tree, never negative; evictable
    and protected: the radix tree's tokens with lock count 0 and above; held: the pages requests hold beyond the
    tree's)."""
    frame = ctx.frames[t]
    if frame.radix is None:
        return True
    page, pool = ctx.policy.kv.block_size, ctx.policy.kv.num_blocks
    evictable, protected = frame.radix
    available = (pool - frame.kv_used) * page - evictable
    held = sum_terms([s["blocks"] for s in frame.slots]) * page
    return o.and_(available >= 0, available + evictable + protected + held == pool * page)


def _tree_holds_kv(o: Any, ctx: TraceContext, t: int) -> Term:
    radix = ctx.frames[t].radix
    return radix is not None and radix[0] + radix[1] > 0


def _arrived(o: Any, ctx: TraceContext, t: int) -> Term:
    return _any_slot(o, ctx, lambda i: ctx.frames[t].slots[i]["status"] != int(Status.PENDING))


# ----------------------------------------------------------------------------------------- the block pool
# With prefix caching the frame carries the pool as the block tables show it (checker.semantics.blockpool
# PoolFacts); without block identity there is no pool to check and these hold trivially (their situation, a
# cached block, never occurs: VACUOUS).
def block_pool_conservation(o: Any, ctx: TraceContext, t: int) -> Term:
    """Free blocks (cached free ones included) plus the blocks requests hold, a shared block counted once,
    make up the pool, and the KV in use is the blocks held."""
    frame = ctx.frames[t]
    if frame.pool is None:
        return True
    return o.and_(frame.pool.free + frame.pool.held == ctx.policy.kv.num_blocks, frame.kv_used == frame.pool.held)


def no_referenced_block_reused(o: Any, ctx: TraceContext, t: int) -> Term:
    """A block is never evicted or handed out while a request still lists it: every block's reference count
    is the number of block tables that list it, and no listed block is on the free queue."""
    frame = ctx.frames[t]
    return True if frame.pool is None else frame.pool.ref_errors == 0


def hit_only_on_identical_chain(o: Any, ctx: TraceContext, t: int) -> Term:
    """A request reuses a cached block only if the block holds the same tokens after the same prefix (an
    identical hash chain): every cached entry of a block table holds what the request's tokens say."""
    frame = ctx.frames[t]
    return True if frame.pool is None else frame.pool.chain_errors == 0


def _blocks_cached(o: Any, ctx: TraceContext, t: int) -> Term:
    frame = ctx.frames[t]
    return False if frame.pool is None else frame.pool.cached > 0


def _blocks_shared(o: Any, ctx: TraceContext, t: int) -> Term:
    frame = ctx.frames[t]
    return False if frame.pool is None else frame.pool.shared > 0


# ----------------------------------------------------------------------------------------- cancellation
def cancellation_releases(o: Any, ctx: TraceContext, t: int, steps: int = 1) -> Term:
    """A cancelled request holds no KV blocks `steps` iterations after the step that cancelled it."""
    return _released_after(o, ctx, t, steps, Status.CANCELLED)


def _released_after(o: Any, ctx: TraceContext, t: int, steps: int, status: Status) -> Term:
    """Every request in ``status`` `steps` frames ago holds no blocks now."""
    if t < steps:
        return True
    then, now = ctx.frames[t - steps], ctx.frames[t]
    return _all_slots(o, ctx, lambda i: o.or_(then.slots[i]["status"] != int(status), now.slots[i]["blocks"] == 0))


def _cancelled_while_holding(o: Any, ctx: TraceContext, t: int, steps: int = 1) -> Term:
    """A request is cancelled while it holds KV: it still holds blocks after the cancel, or it held some
    just before the step that cancelled it (a policy that frees at once)."""
    def cancelled_holding(i: int) -> Term:
        now = ctx.frames[t].slots[i]
        held_before = False if t == 0 else o.and_(ctx.frames[t - 1].slots[i]["blocks"] > 0,
                                                  ctx.frames[t - 1].slots[i]["status"] != int(Status.CANCELLED))
        return o.and_(now["status"] == int(Status.CANCELLED), o.or_(now["blocks"] > 0, held_before))
    return _any_slot(o, ctx, cancelled_holding)


def finished_releases(o: Any, ctx: TraceContext, t: int, steps: int = 1) -> Term:
    """A finished request holds no KV blocks `steps` iterations after the step that finished it (a prefill
    node's blocks pinned for the decode side included)."""
    return _released_after(o, ctx, t, steps, Status.FINISHED)


def _finished_holding(o: Any, ctx: TraceContext, t: int, steps: int = 1) -> Term:
    """A finished request still holds KV (pinned)."""
    return _any_slot(o, ctx, lambda i: o.and_(ctx.frames[t].slots[i]["status"] == int(Status.FINISHED),
                                             ctx.frames[t].slots[i]["blocks"] > 0))


def no_hold_and_wait(o: Any, ctx: TraceContext, t: int, steps: int = 8) -> Term:
    """No request holds KV blocks outside the running batch (loading, loaded and waiting, cancelled or
    finished and not yet released) for `steps` iterations in a row: it runs or releases them sooner."""
    if t < steps:
        return True

    def released_or_ran(i: int) -> Term:
        return o.or_(*(o.or_(ctx.frames[j].slots[i]["blocks"] == 0,
                             ctx.frames[j].slots[i]["status"] == int(Status.RUNNING)) for j in range(t - steps, t + 1)))
    return _all_slots(o, ctx, released_or_ran)


def _holds_outside_batch(o: Any, ctx: TraceContext, t: int, steps: int = 8) -> Term:
    return _any_slot(o, ctx, lambda i: o.and_(ctx.frames[t].slots[i]["blocks"] > 0,
                                             ctx.frames[t].slots[i]["status"] != int(Status.RUNNING)))


# ----------------------------------------------------------------------------------------- progress
def decode_progress(o: Any, ctx: TraceContext, t: int, gap: int = 1) -> Term:
    """A running request past its prefill produces a token at least every `gap` iterations, unless it is
    preempted, cancelled or finished."""
    if t < gap:
        return True
    window = range(t - gap + 1, t + 1)

    def ok(i: int) -> Term:
        stayed = o.and_(_decoding(o, ctx, t - gap, i),
                        *(ctx.frames[j].slots[i]["status"] == int(Status.RUNNING) for j in window))
        return o.or_(o.not_(stayed), *(ctx.frames[j].produced[i] for j in window))
    return _all_slots(o, ctx, ok)


def _someone_decodes(o: Any, ctx: TraceContext, t: int, gap: int = 1) -> Term:
    return _any_slot(o, ctx, lambda i: _decoding(o, ctx, t, i))


def bounded_starvation(o: Any, ctx: TraceContext, t: int, steps: int = 8) -> Term:
    """Every arrived request is admitted (first scheduled), rejected or cancelled within `steps`
    iterations of its arrival."""
    if t < steps:
        return True
    start = ctx.frames[t - steps].now_us
    now = ctx.frames[t]
    return _all_slots(o, ctx, lambda i: o.or_(
        ctx.params[i].arrival_us > start, now.slots[i]["admitted_seq"] > 0,
        _status_in(o, now.slots[i], Status.REJECTED, Status.CANCELLED)))


def _someone_waits(o: Any, ctx: TraceContext, t: int, steps: int = 8) -> Term:
    return _any_slot(o, ctx, lambda i: ctx.frames[t].slots[i]["status"] == int(Status.WAITING))


def no_deadlock(o: Any, ctx: TraceContext, t: int, steps: int = 2) -> Term:
    """If requests wait or run for `steps` iterations in a row, some token is scheduled in one of them (a request
    whose grammar is not ready, a blocked waiting state, is not counted as waiting)."""
    if t < steps - 1:
        return True
    window = range(t - steps + 1, t + 1)
    # a request whose grammar is not ready (frame.blocked) is no work the step could schedule
    busy = o.and_(*(_any_slot(o, ctx, lambda i, j=j: _unless_blocked(
        o, ctx.frames[j], i, lambda: _status_in(o, ctx.frames[j].slots[i], *HAS_WORK))) for j in window))
    worked = o.or_(*(_any_slot(o, ctx, lambda i, j=j: ctx.frames[j].scheduled[i] > 0) for j in window))
    return o.or_(o.not_(busy), worked)


def _unless_blocked(o: Any, frame: Any, i: int, term: Callable[[], Term]) -> Term:
    """``term()`` unless slot i's request was in a blocked waiting state in the frame's step (its grammar not ready):
    then False. frame.blocked is the set of such slots on an engine trace, a bool term per slot in z3's unrolling."""
    blocked = frame.blocked
    if isinstance(blocked, frozenset):
        return False if i in blocked else term()
    return o.and_(o.not_(blocked[i]), term())


def _work_exists(o: Any, ctx: TraceContext, t: int, steps: int = 2) -> Term:
    return _any_slot(o, ctx, lambda i: _status_in(o, ctx.frames[t].slots[i], *HAS_WORK))


def work_conserving(o: Any, ctx: TraceContext, t: int) -> Term:
    """A step never leaves a free slot, unused budget and free KV blocks, as the scheduler saw them (requests
    finishing in the step still hold their slot and blocks), while a request that arrived before it waits
    and would fit them (its whole sequence's blocks, and its whole prompt when chunking is off); a request
    preempted in the step is not counted as waiting, nor one whose grammar is not ready (a blocked waiting state),
    and a step that preempted is not excused."""
    frame, p = ctx.frames[t], ctx.policy
    finishing = [o.and_(s["status"] == int(Status.FINISHED), frame.produced[i]) for i, s in enumerate(frame.slots)]
    running = sum_terms([o.b2i(s["status"] == int(Status.RUNNING)) for s in frame.slots] + [o.b2i(f) for f in finishing])
    used = sum_terms(list(frame.scheduled))
    finishing_blocks = sum_terms([o.ite(f, _blocks_when_scheduled(o, ctx, t, i), 0) for i, f in enumerate(finishing)])
    free = p.kv.num_blocks - frame.kv_used - finishing_blocks - p.kv.watermark_blocks

    def idle_for(i: int) -> Term:  # not a request whose grammar is not ready: it could not be admitted
        return _unless_blocked(o, frame, i, lambda: idle(i))

    def idle(i: int) -> Term:
        s, prm = frame.slots[i], ctx.params[i]
        tokens = prm.prompt_len + s["num_generated"]
        need_budget = tokens if not p.chunking.enabled else 1
        return o.and_(s["status"] == int(Status.WAITING), o.not_(frame.preempted[i]), prm.arrival_us <= frame.now_us,
                      o.ceil_div(tokens, p.kv.block_size) <= free, used + need_budget <= p.batch.max_num_batched_tokens)
    return o.or_(running >= p.batch.max_num_seqs, o.not_(_any_slot(o, ctx, idle_for)))


def _blocks_when_scheduled(o: Any, ctx: TraceContext, t: int, i: int) -> Term:
    """The blocks a request that finished in step t held while the step was scheduled (freed at completion):
    those of the tokens it computed, or its whole reservation under full reservation."""
    p, s, prm = ctx.policy, ctx.frames[t].slots[i], ctx.params[i]
    blocks = o.ceil_div(s["num_computed"], p.kv.block_size)
    if p.kv.allocation is Allocation.FULL_RESERVATION:
        reserved = o.ceil_div(max_context(o, p, prm.prompt_len, prm.max_output), p.kv.block_size)
        blocks = o.max(blocks, reserved)
    return blocks


def _slot_free_while_waiting(o: Any, ctx: TraceContext, t: int) -> Term:
    frame = ctx.frames[t]
    running = sum_terms([o.b2i(s["status"] == int(Status.RUNNING)) for s in frame.slots])
    return o.and_(running < ctx.policy.batch.max_num_seqs, _someone_waits(o, ctx, t))


def bounded_preemptions(o: Any, ctx: TraceContext, t: int, times: int = 2) -> Term:
    """No request is preempted more than `times` times."""
    return _all_slots(o, ctx, lambda i: ctx.frames[t].slots[i]["num_preemptions"] <= times)


def _someone_preempted(o: Any, ctx: TraceContext, t: int, times: int = 2) -> Term:
    return _any_slot(o, ctx, lambda i: ctx.frames[t].preempted[i])


def bounded_preemptions_per_step(o: Any, ctx: TraceContext, t: int, p: int = 1) -> Term:
    """No step preempts more than `p` requests (a preemption cascade: a step that takes many requests back to the
    queue to make room for one)."""
    return sum_terms([o.b2i(x) for x in ctx.frames[t].preempted]) <= p


def _preempted_in_step(o: Any, ctx: TraceContext, t: int, **_: int) -> Term:
    return _any_slot(o, ctx, lambda i: ctx.frames[t].preempted[i])


def preemption_frees_capacity(o: Any, ctx: TraceContext, t: int) -> Term:
    """A request preempted in a step holds no KV blocks after it unless the step admitted it again: its blocks went
    back to the pool within the step (swap: out to swap space), usable by the step's later allocations, not fenced
    until a later step."""
    frame = ctx.frames[t]
    return _all_slots(o, ctx, lambda i: o.or_(o.not_(frame.preempted[i]), frame.slots[i]["blocks"] == 0,
                                             frame.slots[i]["status"] == int(Status.RUNNING)))


# ----------------------------------------------------------------------------------------- ordering
def _urgency(ctx: TraceContext, i: int) -> Term:
    from checker.policy import Polarity

    prio = ctx.params[i].priority
    return prio if ctx.policy.queue.priority_polarity is Polarity.LOWER_FIRST else -prio


def _admitted_in(o: Any, ctx: TraceContext, t: int, i: int) -> Term:
    now = ctx.frames[t].slots[i]["admitted_seq"]
    before = ctx.frames[t - 1].slots[i]["admitted_seq"] if t > 0 else 0
    return now != before


def priority_inversion(o: Any, ctx: TraceContext, t: int, bound: int = 0) -> Term:
    """No request is admitted while a request more urgent by more than `bound` priority levels
    (in the policy's polarity) keeps waiting."""
    frame = ctx.frames[t]

    def ok(i: int) -> Term:
        waits = _status_in(o, frame.slots[i], Status.WAITING, Status.SWAPPED)
        return o.or_(o.not_(waits), _all_slots(o, ctx, lambda j: o.or_(
            o.not_(_admitted_in(o, ctx, t, j)), _urgency(ctx, j) - _urgency(ctx, i) <= bound)))
    return _all_slots(o, ctx, ok)


def _admission_with_waiters(o: Any, ctx: TraceContext, t: int, bound: int = 0) -> Term:
    frame = ctx.frames[t]
    return o.and_(_any_slot(o, ctx, lambda j: _admitted_in(o, ctx, t, j)),
                  _any_slot(o, ctx, lambda i: _status_in(o, frame.slots[i], Status.WAITING, Status.SWAPPED)))


def _service(o: Any, ctx: TraceContext, t: int, tenant: int, w_in: int, w_out: int) -> Term:
    """Service received by a tenant's requests up to frame t: prompt tokens of requests that produced a
    token, and output tokens produced, weighted as in VTC."""
    frame = ctx.frames[t]
    total: Term = 0
    for i in range(ctx.num_slots):
        s, prm = frame.slots[i], ctx.params[i]
        mine = prm.tenant == tenant
        served = o.ite(s["num_generated"] >= 1, w_in * prm.prompt_len, 0) + w_out * s["num_generated"]
        total = total + o.ite(mine, served, 0)
    return total


def _backlogged(o: Any, ctx: TraceContext, t: int, tenant: int) -> Term:
    return _any_slot(o, ctx, lambda i: o.and_(ctx.params[i].tenant == tenant, _status_in(
        o, ctx.frames[t].slots[i], Status.WAITING, Status.SWAPPED)))


def tenant_fairness(o: Any, ctx: TraceContext, t: int, bound: int = 1000, tenants: int = 2,
                    w_in: int = 1, w_out: int = 2) -> Term:
    """Over any stretch of iterations in which two tenants are both backlogged, the service they receive
    (w_in per prompt token, w_out per output token) differs by at most `bound`."""
    clauses = []
    for start in range(t):
        both = [o.and_(*(o.and_(_backlogged(o, ctx, j, a), _backlogged(o, ctx, j, b)) for j in range(start, t + 1)))
                for a in range(tenants) for b in range(a + 1, tenants)]
        pairs = [(a, b) for a in range(tenants) for b in range(a + 1, tenants)]
        for (a, b), backlog in zip(pairs, both):
            gained_a = _service(o, ctx, t, a, w_in, w_out) - _service(o, ctx, start, a, w_in, w_out)
            gained_b = _service(o, ctx, t, b, w_in, w_out) - _service(o, ctx, start, b, w_in, w_out)
            diff = gained_a - gained_b
            clauses.append(o.or_(o.not_(backlog), o.and_(diff <= bound, -diff <= bound)))
    return o.and_(*clauses) if clauses else True


class TenantFairnessSteps:
    """tenant_fairness evaluated step by step on concrete frames (check-log), in constant time a step and pair:
    the same verdict as ``tenant_fairness(IntOps, ctx, t)`` on the whole history, which compares every earlier
    start (quadratic in the steps, times the requests). With D(j) the service difference S_a(j) - S_b(j) at
    step j (``_service``), the clause for a start s is |D(t) - D(s)| <= bound when a and b are both backlogged
    at every step s..t (``_backlogged``); those starts are the steps of the current stretch before t, so the
    invariant holds at t iff D(t) is within ``bound`` of the least and the greatest D over them. ``holds`` must
    see every step, in order, from the first (tests/unit/test_checklog_stream.py compares the two)."""

    def __init__(self, bound: int = 1000, tenants: int = 2, w_in: int = 1, w_out: int = 2):
        self.bound, self.w_in, self.w_out = bound, w_in, w_out
        self.pairs = [(a, b) for a in range(tenants) for b in range(a + 1, tenants)]
        self.stretch: dict[tuple[int, int], tuple[int, int] | None] = dict.fromkeys(self.pairs)  # (least, greatest D)

    def holds(self, o: Any, ctx: TraceContext, t: int) -> bool:
        """The verdict at step t; ``ctx.frames[t]`` is that step's frame (earlier frames are not read)."""
        ok = True
        tenants = {x for pair in self.pairs for x in pair}
        backlogged = {x: bool(_backlogged(o, ctx, t, x)) for x in tenants}
        service: dict[int, int] = {}
        for a, b in self.pairs:
            if not (backlogged[a] and backlogged[b]):
                self.stretch[a, b] = None
                continue
            for x in (a, b):
                if x not in service:
                    service[x] = int(_service(o, ctx, t, x, self.w_in, self.w_out))
            d = service[a] - service[b]
            seen = self.stretch[a, b]
            if seen is None:
                self.stretch[a, b] = (d, d)
                continue
            least, greatest = seen
            ok = ok and d - least <= self.bound and greatest - d <= self.bound
            self.stretch[a, b] = (min(least, d), max(greatest, d))
        return ok


def _two_tenants_backlogged(o: Any, ctx: TraceContext, t: int, tenants: int = 2, **_: int) -> Term:
    return o.or_(*(o.and_(_backlogged(o, ctx, t, a), _backlogged(o, ctx, t, b))
                   for a in range(tenants) for b in range(a + 1, tenants)))


# ----------------------------------------------------------------------------------------- degradation order
def _less_urgent_runs(o: Any, ctx: TraceContext, t: int, protected: int) -> Term:
    return _any_slot(o, ctx, lambda i: o.and_(_urgency(ctx, i) > protected,
                                             ctx.frames[t].slots[i]["status"] == int(Status.RUNNING)))


def degradation_order(o: Any, ctx: TraceContext, t: int, gap: int = 1, protected: int = 0) -> Term:
    """While a request less urgent than priority `protected` is running, every running request at least as
    urgent that has started decoding produces a token at least every `gap` iterations (being preempted is
    no excuse; being cancelled or finishing is), and KV blocks in use never exceed the pool."""
    kv_ok = kv_never_overcommitted(o, ctx, t)
    if t < gap:
        return kv_ok
    window = range(t - gap + 1, t + 1)
    background = _less_urgent_runs(o, ctx, t - gap, protected)

    def ok(i: int) -> Term:
        decoding = o.and_(_urgency(ctx, i) <= protected, _decoding(o, ctx, t - gap, i))
        ended = _status_in(o, ctx.frames[t].slots[i], Status.CANCELLED, Status.FINISHED)
        return o.or_(o.not_(decoding), ended, *(ctx.frames[j].produced[i] for j in window))
    return o.and_(kv_ok, o.or_(o.not_(background), _all_slots(o, ctx, ok)))


def _protected_decodes_beside_background(o: Any, ctx: TraceContext, t: int, gap: int = 1, protected: int = 0) -> Term:
    return o.and_(_less_urgent_runs(o, ctx, t, protected),
                  _any_slot(o, ctx, lambda i: o.and_(_urgency(ctx, i) <= protected, _decoding(o, ctx, t, i))))


# ----------------------------------------------------------------------------------------- the catalogue
def invariant(check: Check, trigger: Check, **defaults: int) -> Invariant:
    """An invariant from its check (its name and docstring become the invariant's name and statement),
    the trigger used for vacuity, and default parameters."""
    return Invariant(check.__name__, " ".join((check.__doc__ or "").split()), check, trigger, defaults)


CATALOGUE: dict[str, Invariant] = {inv.name: inv for inv in (
    invariant(kv_never_overcommitted, _kv_fills, headroom=0),
    invariant(lookahead_fits, _kv_fills_with_lookahead),
    invariant(token_budget, _tokens_scheduled),
    invariant(seq_cap, _something_runs),
    invariant(scheduled_requests_run, _tokens_scheduled),
    invariant(request_conservation, _arrived),
    invariant(sglang_memory_identity, _tree_holds_kv),
    invariant(prompt_fully_computed, _something_produced),
    invariant(block_pool_conservation, _blocks_cached),
    invariant(no_referenced_block_reused, _blocks_cached),
    invariant(hit_only_on_identical_chain, _blocks_shared),
    invariant(cancellation_releases, _cancelled_while_holding, steps=1),
    invariant(finished_releases, _finished_holding, steps=1),
    invariant(no_hold_and_wait, _holds_outside_batch, steps=8),
    invariant(decode_progress, _someone_decodes, gap=1),
    invariant(bounded_starvation, _someone_waits, steps=8),
    invariant(no_deadlock, _work_exists, steps=2),
    invariant(bounded_preemptions, _someone_preempted, times=2),
    invariant(bounded_preemptions_per_step, _preempted_in_step, p=1),
    invariant(preemption_frees_capacity, _preempted_in_step),
    invariant(work_conserving, _slot_free_while_waiting),
    invariant(priority_inversion, _admission_with_waiters, bound=0),
    invariant(tenant_fairness, _two_tenants_backlogged, bound=1000, tenants=2, w_in=1, w_out=2),
    invariant(degradation_order, _protected_decodes_beside_background, gap=1, protected=0),
)}


def get(name: str) -> Invariant:
    return CATALOGUE[name]
