"""The scheduler step as a data-oblivious function over N request slots, for z3.

This mirrors checker/semantics/step.py phase by phase. Control flow that depends on data becomes
``ite``; loops run over slots or a fixed number of rounds; "the request at the cursor" is a one-hot
selector over the slots. The same code runs on ints (IntOps) and on z3 terms (Z3Ops), and
tests/conformance pins both to the engine's step on generated states, field by field.

Assumption shared with the engine: slots are numbered in arrival order (rid order = arrival order),
so requests that arrive in the same step are taken in slot order.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import ClassVar

from checker.policy import (
    Allocation,
    BlockedWaiting,
    ReleaseRule,
    HeadOfLine,
    PhaseMode,
    Polarity,
    Policy,
    PreemptMode,
    QueueOrder,
    Requeue,
    Scheduler,
    Victim,
)
from checker.errors import InputError, Problem
from checker.semantics.state import FIELDS, NEVER, PAST_TRANSFER, Reason, Status
from checker.semantics import blocked
from checker.smt.ops import Term, sum_terms
from checker.smt.pool import Pool, chained_code, hash_code


@dataclass(frozen=True)
class SlotParams:
    """What the environment fixes for a slot (symbolic in verification, pinned in conformance)."""

    arrival_us: Term
    prompt_len: Term
    output_len: Term
    max_output: Term
    priority: Term
    tenant: Term
    identity: Term = 0  # prefix caching only: the prompt's identity (checker.smt.pool.IDENTITIES)
    # A KV connector only (policy.connector; RequestSpec's fields, None as -1): tokens the external tier holds,
    # the load's latency, the send's confirmation delay
    external_tokens: Term = 0
    load_steps: Term = 1
    send_steps: Term = 0
    # Blocked waiting states only (policy.queue.blocked_waiting): the steps the request's grammar compiles after its
    # arrival (RequestSpec.grammar_steps; checker/semantics/blocked.py)
    grammar_steps: Term = 0


# Per-slot fields of the encoding with a KV connector, beside FIELDS: the step in whose output the slot's transfer
# is reported (Request.transfer_step), and its place in the holders' queue (0: none; SchedulerState.holders in
# load_seq order, numbered from SlotState.next_load).
CONNECTOR_FIELDS = ("transfer_step", "load_seq")
# Per-slot fields with speculative decoding (policy.speculative): the draft tokens the request holds
# (SpecState.drafts: 0, or num_tokens after a step that left it decoding).
SPEC_FIELDS = ("drafts",)
# Per-slot field with blocked waiting states (policy.queue.blocked_waiting): the step whose waiting scan first finds
# the request's grammar ready (arrival step + grammar_steps; 0 before it arrives): blocked while step < ready_step
# (SchedulerState.blocked, whose entries the engine drops once found ready: the same predicate).
BLOCKED_FIELDS = ("ready_step",)


def blocks_waiting(policy: Policy) -> bool:
    """Whether the policy has blocked waiting states (off: not one term of the encoding changes)."""
    return policy.queue.blocked_waiting is not BlockedWaiting.OFF


def slot_fields(policy: Policy) -> tuple[str, ...]:
    """The per-slot fields of the encoded state for this policy (FIELDS, CONNECTOR_FIELDS with a connector,
    SPEC_FIELDS with speculative decoding)."""
    return (FIELDS + (CONNECTOR_FIELDS if policy.connector.enabled else ())
            + (SPEC_FIELDS if policy.speculative.enabled else ()) + (BLOCKED_FIELDS if blocks_waiting(policy) else ()))


def blank_slot(policy: Policy) -> dict[str, int]:
    """A slot before its request arrives."""
    blank = {f: 0 for f in slot_fields(policy)}
    blank["status"] = int(Status.PENDING)
    blank["release_step"] = -1
    if policy.connector.enabled:
        blank["transfer_step"] = -1
    return blank


@dataclass
class SlotState:
    """Per-slot mutable fields (checker.semantics.state.FIELDS) and the globals."""

    slots: list[dict[str, Term]]
    next_seq: Term
    step: Term
    counters: list[Term]
    pool: Pool | None = None  # prefix caching: the block pool with block identity (checker/smt/pool.py)
    next_load: Term = 1  # a KV connector's holders' queue: the load_seq of the next load started

    @property
    def kv_used(self) -> Term:
        """Blocks in use: the sum of what the slots hold (one fact, stored once); with prefix caching the
        distinct blocks held (a shared block counted once)."""
        if self.pool is not None:
            return self.pool.held()
        return sum_terms([slot["blocks"] for slot in self.slots])

    @property
    def swap_used(self) -> Term:
        return sum_terms([slot["swapped_blocks"] for slot in self.slots])

    def copy(self) -> SlotState:
        pool = None if self.pool is None else self.pool.copy()
        return replace(self, slots=[dict(s) for s in self.slots], counters=list(self.counters), pool=pool)


@dataclass
class StepResult:
    state: SlotState
    scheduled: list[Term]  # tokens per slot this step
    produced: list[Term]  # bool per slot
    preempted: list[Term] = field(default_factory=list)  # bool per slot
    loads: list[Term] = field(default_factory=list)  # bool per slot: admitted as an asynchronous KV load
    # Speculative decoding only (empty otherwise), per slot: whether its row verified drafts of its own (not a padded
    # decode's placeholders: those take no entry of its accepted list), and the drafts accepted there
    verified: list[Term] = field(default_factory=list)
    accepted: list[Term] = field(default_factory=list)


WAITING_STATES = (Status.WAITING, Status.SWAPPED)


def max_context(o, policy: Policy, prompt_len: Term, max_output: Term) -> Term:
    """Most tokens of KV a request can ever hold (mirrors kv.max_context): it stops at max_model_len or at
    its declared max output."""
    return o.min(prompt_len + max_output, policy.max_model_len) - 1


def require_encodable(policy: Policy) -> None:
    """Refuse (exit 2) a policy with a rule the encoding does not cover yet, rather than check a different one."""
    if policy.kv.prefix_caching.enabled:
        raise InputError(Problem("kv.prefix_caching.enabled", True, "false for proofs (induction): they do not "
                                 "use the z3 encoding of the block pool (checker/smt/pool.py) yet; `verify` and "
                                 "`diff` check a caching policy within bounds, and simulate, fuzz and check-log run "
                                 "the engine with the cache"))


def require_vllm_rules(policy: Policy) -> None:
    """The encoding is of the vLLM rules: refuse (exit 2) a policy under SGLang's (checker/semantics/sglang.py),
    which no z3 term encodes yet, rather than check a different scheduler."""
    if policy.scheduler is Scheduler.SGLANG:
        raise InputError(Problem("scheduler", "sglang", "vllm for the z3 encoding: SGLang's rules are not encoded in "
                                 "z3 yet; `verify` checks an sglang policy by explicit-state search on the engine, and "
                                 "simulate, fuzz and check-log run the engine"))


def require_no_speculative(policy: Policy) -> None:
    """Speculative decoding is encoded for a step given the verifier's choices (``accepted``: verify's bounded search
    and whole-step induction, the conformance suites); a step without them (action-wise induction, any N, diff's
    product) is refused (exit 2) rather than checked without the drafts."""
    spec = policy.speculative
    if spec.enabled:
        raise InputError(Problem("speculative.method", spec.method.value, "none for this z3 check: speculative "
                                 "decoding is encoded for verify's bounded search and whole-step induction for N slots "
                                 "only (action-wise induction, any N and diff do not cover its drafts and the "
                                 "verifier's choices yet); simulate, fuzz and check-log run the engine with it"))


def require_no_pipeline(policy: Policy) -> None:
    """Async scheduling (checker/semantics/inflight.py: a batch in flight, its placeholders and deferred finishes) has
    no z3 terms yet: refuse (exit 2) rather than check the synchronous scheduler instead."""
    depth = policy.pipeline.in_flight
    if depth:
        raise InputError(Problem("pipeline.in_flight", depth, "0 for the z3 encoding: async scheduling (a batch in "
                                 "flight, its output placeholders, finishes resolved a step later) is not encoded in "
                                 "z3 yet; simulate, fuzz and check-log run the engine with it"))


def require_connector_state(policy: Policy, state: SlotState) -> None:
    """A KV connector needs its slot fields in the state (the bounded unrolling has them); a proof's symbolic
    state (induction) does not: refuse (exit 2) rather than prove a different system."""
    c = policy.connector
    if not c.enabled:
        return
    if state.pool is not None:
        raise InputError(Problem("connector.kind", c.kind.value, "none with kv.prefix_caching.enabled for the z3 "
                                 "encoding (loads into the block pool are not encoded yet): `verify` checks it by "
                                 "explicit-state search on the engine"))
    if any("transfer_step" not in slot for slot in state.slots):
        refuse_proof_with_connector(policy)


def refuse_proof_with_connector(policy: Policy) -> None:
    """Unbounded proofs (induction, action-wise induction) have no lemmas for a KV connector's states yet."""
    c = policy.connector
    if c.enabled:
        raise InputError(Problem("--unbounded", True, f"no proof method covers KV connector states (connector.kind "
                                 f"{c.kind.value}) yet: a bounded check only (drop --unbounded)"))


class SymbolicStep:
    blocking = False  # blocked waiting states (set per policy below; SGLangStep has none: refused there)

    def __init__(self, ops, policy: Policy, params: list[SlotParams], state: SlotState, now_us: Term,
                 cancels: list[Term], accepted: list[Term] | None = None):
        """``accepted``: with speculative decoding, the drafts the verifier accepts per slot in this step (the
        environment's choice, clamped to the drafts scheduled as the engine clamps its accepted list's entry)."""
        require_vllm_rules(policy)
        spec = policy.speculative
        if accepted is None or any("drafts" not in slot for slot in state.slots):
            require_no_speculative(policy)
        require_no_pipeline(policy)
        self.blocking = blocks_waiting(policy)
        if self.blocking and any("ready_step" not in slot for slot in state.slots):
            blocked.refuse(policy, "this z3 check (induction, any N)")  # a proof's state: no ready_step
        blocked.refuse(policy, "the z3 encoding", encoded=True)  # loads that may fail: not encoded
        if state.pool is None:
            require_encodable(policy)  # a caching policy needs the pool in the state
        require_connector_state(policy, state)
        self.o = ops
        self.p = policy
        self.params = params
        self.s = state.copy()
        self.now = now_us
        self.cancels = cancels
        self.n = len(params)
        self.sched: list[Term] = [0] * self.n
        self.grown: list[Term] = [0] * self.n
        self.preempted: list[Term] = [False] * self.n
        self.admitted: list[Term] = [False] * self.n
        self.growth_preempted: Term = False
        self.pool = self.s.pool
        self.order: list[Term] = [-1] * self.n  # when each slot was scheduled in this step (the release order)
        self.scheduled_count: Term = 0
        con = policy.connector
        self.con = con
        self.holders_q = con.loads and con.holders_first  # transfer.uses_holders_queue
        self.queued = WAITING_STATES + (Status.LOADING,) if con.loads else WAITING_STATES  # s.waiting + s.holders
        self.loads: list[Term] = [False] * self.n
        # speculative decoding (checker/semantics/speculative.py): k drafts, lookahead slots allocated with the
        # scheduled tokens, extra budget slots per scheduled request
        self.spec = spec.enabled
        self.k, self.look, self.slot = spec.num_tokens, spec.reserved_slots, spec.budget_slots
        self.accepted = list(accepted) if self.spec else []
        self.verified: list[Term] = [False] * self.n if self.spec else []
        self.taken: list[Term] = [0] * self.n if self.spec else []
        if self.holders_q and policy.queue.order is QueueOrder.TENANT_FAIR:
            raise InputError(Problem("queue.order", "tenant_fair", "another order with connector.holders_first for "
                                     "the z3 encoding: the engine keeps the holders' queue sorted by tenant counters "
                                     "that change while it waits (no vLLM counterpart); use the engine's checks"))

    # ------------------------------------------------------------------ helpers
    def st(self, i: int) -> Term:
        return self.s.slots[i]["status"]

    def is_(self, i: int, *statuses: Status) -> Term:
        return self.o.or_(*(self.st(i) == int(x) for x in statuses))

    def set(self, i: int, name: str, cond: Term, value: Term) -> None:
        slot = self.s.slots[i]
        slot[name] = self.o.ite(cond, value, slot[name])

    def in_waiting_list(self, i: int) -> Term:
        """In the engine's s.waiting: queued, and not in the holders' queue (transfer.queue_of)."""
        queued = self.is_(i, *self.queued)
        return self.o.and_(queued, self.s.slots[i]["blocks"] == 0) if self.holders_q else queued

    def in_holders(self, i: int) -> Term:
        """In the engine's s.holders (a KV connector with holders_first): queued and holding blocks."""
        if not self.holders_q:
            return False
        return self.o.and_(self.is_(i, *self.queued), self.s.slots[i]["blocks"] > 0)

    def count(self, *statuses: Status) -> Term:
        return sum_terms([self.o.b2i(self.is_(i, *statuses)) for i in range(self.n)])

    def select(self, sel: list[Term], values: list[Term]) -> Term:
        return sum_terms([self.o.ite(sel[i], values[i], 0) for i in range(self.n)])

    def lex_lt(self, a: tuple, b: tuple) -> Term:
        o = self.o
        if len(a) == 1:
            return a[0] < b[0]
        return o.or_(a[0] < b[0], o.and_(a[0] == b[0], self.lex_lt(a[1:], b[1:])))

    def first(self, cand: list[Term], keys: list[tuple]) -> list[Term]:
        """One-hot selector of the candidate with the smallest key (keys are distinct)."""
        o = self.o
        return [o.and_(cand[i], *(o.or_(o.not_(cand[j]), self.lex_lt(keys[i], keys[j]))
                                  for j in range(self.n) if j != i)) for i in range(self.n)]

    def last(self, cand: list[Term], keys: list[tuple]) -> list[Term]:
        o = self.o
        return [o.and_(cand[i], *(o.or_(o.not_(cand[j]), self.lex_lt(keys[j], keys[i]))
                                  for j in range(self.n) if j != i)) for i in range(self.n)]

    def blocks_for(self, tokens: Term) -> Term:
        return self.o.ceil_div(tokens, self.p.kv.block_size)

    def view(self, i: int) -> dict[str, Term]:
        """Slot i's fields and parameters under one name space (what the arithmetic below reads)."""
        prm = self.params[i]
        return {**self.s.slots[i], "prompt_len": prm.prompt_len, "output_len": prm.output_len,
                "max_output": prm.max_output, "sched": self.sched[i], "grown": self.grown[i]}

    def selected(self, sel: list[Term], extra: dict[str, list[Term]] | None = None) -> dict[str, Term]:
        """The fields of the slot a one-hot selector picks, read once (arithmetic then runs once per
        round on these, instead of once per slot: far fewer divisions for the solver)."""
        views = [self.view(i) for i in range(self.n)]
        names = ("num_computed", "num_generated", "blocks", "prompt_len", "max_output", "sched") + \
            (SPEC_FIELDS if self.spec else ())
        out = {name: self.select(sel, [v[name] for v in views]) for name in names}
        for name, values in (extra or {}).items():
            out[name] = self.select(sel, values)
        return out

    def max_context(self, r: dict[str, Term]) -> Term:
        return max_context(self.o, self.p, r["prompt_len"], r["max_output"])

    def in_prefill(self, r: dict[str, Term]) -> Term:
        return self.o.or_(r["num_generated"] == 0, r["num_computed"] + 1 < r["prompt_len"] + r["num_generated"])

    def target_blocks(self, r: dict[str, Term], n: Term) -> Term:
        tokens = r["num_computed"] + n
        if self.spec and self.look:  # speculative.lookahead_tokens: the drafter's slots come with scheduled tokens
            tokens = self.o.ite(n > 0, self.o.min(tokens + self.look, self.p.max_model_len), tokens)
        need = self.blocks_for(tokens)
        if self.p.kv.allocation is Allocation.FULL_RESERVATION:
            need = self.o.max(need, self.blocks_for(self.max_context(r)))
        return need

    def new_blocks(self, r: dict[str, Term], n: Term) -> Term:
        return self.o.max(0, self.target_blocks(r, n) - r["blocks"])

    def norm_priority(self, i: int) -> Term:
        prio = self.params[i].priority
        return prio if self.p.queue.priority_polarity is Polarity.LOWER_FIRST else -prio

    def tenant_counter(self, i: int) -> Term:
        tenant = self.params[i].tenant
        return sum_terms([self.o.ite(tenant == t, c, 0) for t, c in enumerate(self.s.counters)])

    def queue_key(self, i: int, now: Term | None = None) -> tuple:
        o, q, sl, prm = self.o, self.p.queue, self.s.slots[i], self.params[i]
        now = self.now if now is None else now
        if q.preempted_requeue is Requeue.FRONT:
            requeued = sl["requeue_seq"] > 0
            head = (o.ite(requeued, 0, 1), o.ite(requeued, -sl["requeue_seq"], 0))
        else:
            head = (1, 0)
        if q.order is QueueOrder.FCFS:
            body: tuple = ()
        elif q.order is QueueOrder.PRIORITY:
            body = (self.norm_priority(i),)
        elif q.order is QueueOrder.PRIORITY_AGING:
            waited = o.floor_div(now - prm.arrival_us, q.aging_interval_ms * 1000)
            body = (self.norm_priority(i) - waited,)
        elif q.order is QueueOrder.SHORTEST_PROMPT_FIRST:
            body = (prm.prompt_len,)
        else:
            body = (self.tenant_counter(i),)
        return head + body + (prm.arrival_us, i)

    def holder_key(self, i: int) -> tuple:
        """A request's place in the holders' queue (transfer.start_load): under fcfs the order the loads started
        in (load_seq), else the queue's key as it is at time 0 (fixed while the request holds: the list is kept
        sorted by it)."""
        if self.p.queue.order is QueueOrder.FCFS:
            return (self.s.slots[i]["load_seq"],) + self.queue_key(i)
        return (0,) + self.queue_key(i, 0)

    def waiting_key(self, i: int) -> tuple:
        """The waiting pass's order: the queue order; with a KV connector's holders' queue, its requests first, in
        their order (step._waiting_pass scans s.holders, then s.waiting)."""
        if not self.holders_q:
            return self.queue_key(i)
        o, holder = self.o, self.in_holders(i)
        queued = (0,) + self.queue_key(i)
        return (o.ite(holder, 0, 1),) + tuple(o.ite(holder, h, q) for h, q in zip(self.holder_key(i), queued))

    def victim_key(self, i: int) -> tuple:
        sl, prm = self.s.slots[i], self.params[i]
        v = self.p.preemption.victim
        if v is Victim.LAST_ADMITTED:
            return (sl["admitted_seq"],)
        if v is Victim.LOWEST_PRIORITY:
            return (self.norm_priority(i), prm.arrival_us, i)
        return (-sl["num_generated"], prm.prompt_len, i)

    # ------------------------------------------------------------------ the step
    def run(self) -> StepResult:
        """The step as the actions action-wise induction checks one by one (checker/verify/actions.py): the
        prefix, each pass's rounds with a hand-over (the next pass's start) between passes, the completion."""
        passes = self.passes()
        loop = self.prefix(passes)
        for k, pass_ in enumerate(passes):
            for _ in range(pass_.rounds_per_slot * self.n):
                pass_.round(self, loop)
            if k + 1 < len(passes):
                loop = passes[k + 1].start(self)
        produced = self.complete()
        return StepResult(self.s, self.sched, produced, self.preempted, self.loads, self.verified, self.taken)

    def prefix(self, passes: list[Pass]) -> dict:
        """The phases before the schedule, the schedule's start and the first pass's start (its loop)."""
        self.release()
        self.arrive()
        self.cancel()
        self.expire()
        self.begin_schedule()
        return passes[0].start(self)

    def release(self) -> None:
        o, s = self.o, self.s
        for i in range(self.n):
            sl = s.slots[i]
            held = self.is_(i, Status.CANCELLED, Status.FINISHED) if self.con.pins else \
                self.st(i) == int(Status.CANCELLED)  # a prefill node's pinned requests are held too
            rel = o.and_(held, sl["release_step"] != -1, sl["release_step"] <= s.step)
            if self.pool is not None:  # in slot order: the engine's holding list order (one lag, rid order)
                self.pool.release([(i, rel, sl["blocks"], 0)])
            self.set(i, "blocks", rel, 0)
            self.set(i, "release_step", rel, -1)

    def arrive(self) -> None:
        o, p = self.o, self.p
        adm = p.admission
        running = self.count(Status.RUNNING)
        waiting = self.count(*self.queued)  # s.waiting and s.holders
        queued_tokens = sum_terms([o.ite(self.in_waiting_list(i), self.params[i].prompt_len, 0)
                                   for i in range(self.n)])  # s.waiting only
        for i in range(self.n):
            prm = self.params[i]
            arriving = o.and_(self.st(i) == int(Status.PENDING), prm.arrival_us <= self.now)
            too_long = prm.prompt_len >= p.max_model_len
            never = False
            if adm.reject_never_fits:
                never = self.blocks_for(self.max_context(self.view(i))) > p.kv.num_blocks
            over, full = self.admission_limits(i, waiting, running, queued_tokens)
            reject = o.or_(too_long, never, over, full)
            reason = o.ite(too_long, int(Reason.PROMPT_TOO_LONG), o.ite(never, int(Reason.NEVER_FITS),
                           o.ite(over, int(Reason.OVERLOADED), int(Reason.QUEUE_FULL))))
            accepted = o.and_(arriving, o.not_(reject))
            if p.queue.order is QueueOrder.TENANT_FAIR:
                self.lift_counter(i, accepted)
            self.set(i, "reason", o.and_(arriving, reject), reason)
            self.set(i, "status", arriving, o.ite(reject, int(Status.REJECTED), int(Status.WAITING)))
            if self.blocking:  # blocked.arrive: its grammar is ready in the scan of step + grammar_steps
                self.set(i, "ready_step", accepted, self.s.step + prm.grammar_steps)
            waiting = waiting + o.b2i(accepted)
            queued_tokens = queued_tokens + o.ite(accepted, prm.prompt_len, 0)

    def admission_limits(self, i: int, waiting: Term, running: Term, queued_tokens: Term) -> tuple[Term, Term]:
        """Whether slot i, arriving now, finds the server over max_inflight, and the queue full (max_queue_len,
        max_queued_tokens), given the requests waiting and running and the tokens queued before it."""
        o, adm = self.o, self.p.admission
        over = False if adm.max_inflight is None else waiting + running >= adm.max_inflight
        full = False if adm.max_queue_len is None else waiting >= adm.max_queue_len
        if adm.max_queued_tokens is not None:
            full = o.or_(full, queued_tokens + self.params[i].prompt_len > adm.max_queued_tokens)
        return over, full

    def lift_counter(self, i: int, accepted: Term) -> None:
        """VTC counter lift (mirrors step._lift_counter)."""
        o, s = self.o, self.s
        if self.con.loads:  # s.waiting and s.running (not the holders' queue)
            holds = [o.or_(self.in_waiting_list(j), self.st(j) == int(Status.RUNNING)) for j in range(self.n)]
        else:
            holds = [self.is_(j, Status.WAITING, Status.SWAPPED, Status.RUNNING) for j in range(self.n)]
        active = [o.or_(*(o.and_(holds[j], self.params[j].tenant == t) for j in range(self.n)))
                  for t in range(len(s.counters))]
        mine = self.params[i].tenant
        lowest: Term = 0
        found: Term = False
        for t, counter in enumerate(s.counters):
            lowest = o.ite(o.and_(active[t], o.or_(o.not_(found), counter < lowest)), counter, lowest)
            found = o.or_(found, active[t])
        mine_active = o.or_(*(o.and_(active[t], mine == t) for t in range(len(active))))
        lift = o.and_(accepted, o.not_(mine_active), found)
        s.counters = [o.ite(o.and_(lift, mine == t), o.max(c, lowest), c) for t, c in enumerate(s.counters)]

    def cancel(self) -> None:
        o, s = self.o, self.s
        lag = self.p.cancellation.release_lag_steps
        for i in range(self.n):
            sl = s.slots[i]
            cancelling = o.and_(self.cancels[i], self.is_(i, Status.WAITING, Status.SWAPPED, Status.RUNNING,
                                                          *((Status.LOADING,) if self.con.loads else ())))
            self.set(i, "swapped_blocks", cancelling, 0)
            holds = o.and_(cancelling, sl["blocks"] > 0)
            if self.con.loads:  # an aborted load: its own release rule (transfer.abort_load), not the lag
                loading = o.and_(cancelling, self.st(i) == int(Status.LOADING))
                self.abort_load(i, loading)
                holds = o.and_(holds, o.not_(loading))
            if lag > 0:
                if self.con.loads:  # a load of its past: its report is no release (step._cancel, report_phase)
                    self.set(i, "transfer_step", o.and_(holds, sl["transfer_step"] >= 0), PAST_TRANSFER)
                self.set(i, "release_step", holds, s.step + lag)
            else:
                if self.pool is not None:
                    self.pool.release([(i, holds, sl["blocks"], 0)])
                self.set(i, "blocks", holds, 0)
            self.set(i, "reason", cancelling, int(Reason.ABORTED))
            self.set(i, "status", cancelling, int(Status.CANCELLED))

    def abort_load(self, i: int, loading: Term) -> None:
        """transfer.abort_load: freed now (release immediate, or the load already reported), else held until the
        report (the end-of-step report phase) or the deadline (the release phase)."""
        o, s, c = self.o, self.s, self.con
        sl = s.slots[i]
        now = True if c.release is ReleaseRule.IMMEDIATE else sl["transfer_step"] < s.step
        self.set(i, "blocks", o.and_(loading, now), 0)
        later = s.step + c.release_deadline_steps if c.release is ReleaseRule.DEADLINE else NEVER
        self.set(i, "release_step", o.and_(loading, o.not_(now)), later)

    def expire(self) -> None:
        limit_ms = self.p.timeouts.queue_timeout_ms
        if limit_ms is None:
            return
        o = self.o
        for i in range(self.n):
            sl, prm = self.s.slots[i], self.params[i]
            e = o.and_(self.is_(i, *WAITING_STATES), sl["admitted_seq"] == 0,
                       self.now - prm.arrival_us > limit_ms * 1000)
            if self.con.loads:  # a request holding blocks (a load done, not yet running) does not expire
                e = o.and_(e, sl["blocks"] == 0)
            self.set(i, "reason", e, int(Reason.TIMEOUT))
            self.set(i, "status", e, int(Status.REJECTED))

    # ------------------------------------------------------------------ schedule
    def begin_schedule(self) -> None:
        """What the schedule phase starts from: the step's budgets and the running count."""
        b = self.p.batch
        self.budget = b.max_num_batched_tokens - (self.slot if self.spec else 0)  # step.Budget: one slot short
        self.prefill_budget = b.prefill_token_cap
        self.running = self.count(Status.RUNNING)
        self.running_at_start = self.running
        self.threshold = self.step_threshold()

    def step_threshold(self) -> Term:
        """The long-prefill threshold of this step (mirrors step.step_threshold; 0: no cap)."""
        o, p = self.o, self.p
        c = p.chunking
        threshold = c.long_prefill_token_threshold
        if not threshold or (c.threshold_when_alone and not c.threshold_adaptive):
            return threshold
        eligible = self.running + self.count(*self.queued)
        cap: Term = threshold
        if c.threshold_adaptive:  # max(threshold, budget // eligible), eligible in 1..n as a chain (linear)
            budget = p.batch.max_num_batched_tokens
            share: Term = budget  # eligible <= 1: max(eligible, 1) == 1
            for k in range(2, self.n + 1):
                share = o.ite(eligible == k, budget // k, share)
            cap = o.max(threshold, share)
        if not c.threshold_when_alone:
            cap = o.ite(eligible <= 1, 0, cap)
        return cap

    def passes(self) -> list[Pass]:
        """The passes of the policy's phase mode, in order (each a loop of rounds over the slots)."""
        mode = self.p.batch.phase_mode
        if mode is PhaseMode.DECODE_FIRST:
            return [RunningPass(), WaitingPass()]
        if mode is PhaseMode.STATIC:
            return [RunningPass(), WaitingPass(enable=lambda step: step.running_at_start == 0)]  # batch done
        if mode is PhaseMode.PREFILL_FIRST:
            return [RunningPass(prefill_only=True), WaitingPass(),
                    RunningPass(enable=lambda step: step.o.not_(step.o.or_(*(x > 0 for x in step.sched))))]
        return [MixedPass()]

    def num_new_tokens(self, r: dict[str, Term]) -> Term:
        o, p = self.o, self.p
        gap = r["prompt_len"] + r["num_generated"] - r["num_computed"]
        n = o.min(gap + r["drafts"] if self.spec else gap, self.budget)  # speculative.wanted: its drafts too
        if p.chunking.long_prefill_token_threshold:
            c, threshold = p.chunking, self.threshold
            if c.threshold_when_alone and not c.threshold_adaptive:  # the policy's threshold, every step
                n = o.min(n, threshold)
            else:  # 0 in a step with a lone request: no cap
                n = o.ite(threshold > 0, o.min(n, threshold), n)
        n = o.ite(self.in_prefill(r), o.min(n, self.prefill_budget), n)
        if not p.chunking.enabled:
            n = o.ite(n < gap, 0, n)
        if self.spec:  # speculative.cap_len
            n = o.min(n, p.max_model_len - r["num_computed"] - 1)
        return o.max(n, 0)

    def charge(self, sel: list[Term], r: dict[str, Term], n: Term, cond: Term) -> None:
        """Schedule n tokens for the selected slot r (cond guards it): allocate blocks, charge budget."""
        o = self.o
        added = self.new_blocks(r, n)
        pool = self.pool
        if pool is not None:  # kv.allocate: the blocks from the pool, then the full blocks scheduled are cached
            pool.take(sel, r["blocks"], added, cond)
            codes, truths = pool.codes(self.select(sel, [prm.identity for prm in self.params]), r["prompt_len"],
                                       self.select(sel, list(range(self.n))))
            pool.cache(sel, codes, truths, o.min(r["num_computed"] + n, r["prompt_len"] + r["num_generated"]), cond)
            for i in range(self.n):
                self.order[i] = o.ite(o.and_(cond, sel[i]), self.scheduled_count, self.order[i])
            self.scheduled_count = self.scheduled_count + o.b2i(cond)
        for i in range(self.n):
            c = o.and_(cond, sel[i])
            self.set(i, "blocks", c, self.s.slots[i]["blocks"] + added)
            self.grown[i] = o.ite(c, added, self.grown[i])
            self.sched[i] = o.ite(c, n, self.sched[i])
        self.budget = self.budget - o.ite(cond, n + (self.slot if self.spec else 0), 0)
        self.prefill_budget = self.prefill_budget - o.ite(o.and_(cond, self.in_prefill(r)), n, 0)

    def preempt(self, victim: list[Term], cond: Term) -> None:
        o, s = self.o, self.s
        swap = self.p.preemption.mode is PreemptMode.SWAP
        refund = refund_prefill = 0
        for i in range(self.n):
            sl = s.slots[i]
            v = o.and_(cond, victim[i])
            refund = refund + o.ite(v, self.sched[i], 0)
            if self.spec and self.slot:  # Budget.refund: a victim given tokens gets its slot back too
                refund = refund + o.ite(o.and_(v, self.sched[i] > 0), self.slot, 0)
            if self.spec:  # speculative.drop
                self.set(i, "drafts", v, 0)
            refund_prefill = refund_prefill + o.ite(o.and_(v, self.in_prefill(self.view(i))), self.sched[i], 0)
            keep = sl["blocks"] - self.grown[i]
            swapped = o.and_(v, s.swap_used + keep <= self.p.kv.swap_blocks) if swap else False
            if self.pool is not None:  # recompute only with the cache: every block freed, hashes kept
                self.pool.release([(i, v, sl["blocks"], 0)])
            self.set(i, "swapped_blocks", swapped, keep)
            self.set(i, "num_computed", o.and_(v, o.not_(swapped)), 0)
            self.set(i, "blocks", v, 0)
            self.set(i, "status", v, o.ite(swapped, int(Status.SWAPPED), int(Status.WAITING)))
            self.set(i, "num_preemptions", v, sl["num_preemptions"] + 1)
            self.set(i, "requeue_seq", v, s.next_seq)
            self.sched[i] = o.ite(v, 0, self.sched[i])
            self.grown[i] = o.ite(v, 0, self.grown[i])
            self.preempted[i] = o.or_(self.preempted[i], v)
        self.budget = self.budget + refund
        self.prefill_budget = self.prefill_budget + refund_prefill
        self.running = self.running - o.b2i(cond)
        s.next_seq = s.next_seq + o.b2i(cond)

    def serve_running(self, sel: list[Term], active: Term, want: list[Term], prefill_only: bool = False) -> Term:
        """One round of serving the selected running request (mirrors step._serve_running): schedule
        it, skip it, let it stall, or preempt one victim for it. Returns whether it is done."""
        o, p = self.o, self.p
        n_slots = self.n
        cur = self.selected(sel, {"want": want})
        skip = cur["sched"] > 0
        if prefill_only:
            skip = o.or_(skip, o.not_(self.in_prefill(cur)))
        n = o.ite(cur["want"] >= 0, cur["want"], self.num_new_tokens(cur))
        skip = o.or_(skip, n == 0)
        fits = True if not p.kv.check_allocation else self.new_blocks(cur, n) <= p.kv.num_blocks - self.s.kv_used
        go = o.and_(active, o.not_(skip))
        do_schedule = o.and_(go, fits)
        do_preempt = o.and_(go, o.not_(fits)) if p.preempts_on_growth else False
        done = o.or_(o.and_(active, skip), do_schedule, o.and_(go, o.not_(fits), not p.preempts_on_growth))
        for i in range(n_slots):
            want[i] = o.ite(o.and_(active, sel[i]), n, want[i])
        self.charge(sel, cur, n, do_schedule)
        if p.preempts_on_growth:
            running = [self.st(i) == int(Status.RUNNING) for i in range(n_slots)]
            victim = self.last(running, [self.victim_key(i) for i in range(n_slots)])
            self.preempt(victim, do_preempt)
            self.growth_preempted = o.or_(self.growth_preempted, do_preempt)
        return done

    def try_admit(self, sel: list[Term], active: Term) -> tuple[Term, Term]:
        """One round of admitting the selected waiting request (mirrors step._try_admit): admit it,
        preempt one running request for it (priority inversion), or give up. Returns (admitted, failed)."""
        o, p = self.o, self.p
        n_slots = self.n
        load_done: Term = False
        load_failed: Term = False
        if self.blocking:  # blocked.passes_over: a request whose grammar is not ready is passed over or stops the scan
            waits = o.and_(active, o.or_(*(o.and_(sel[i], self.s.step < self.s.slots[i]["ready_step"])
                                           for i in range(n_slots))))
            active = o.and_(active, o.not_(waits))
            if self.p.queue.blocked_waiting is BlockedWaiting.SKIP:
                load_done = waits
            else:
                load_failed = waits
        if self.con.loads:  # a LOADING request: passed over until its load is reported, then promoted
            passed = self.promote(sel, active)
            active = o.and_(active, o.not_(passed))
        cur = self.selected(sel)
        if self.con.loads:  # an asynchronous load: it takes no tokens, and preempts nobody
            ext = self.select(sel, [self.external_tokens(i) for i in range(n_slots)])
            is_load = ext > 0
            fits_load = o.and_(self.running < p.batch.max_num_seqs, self.can_start_load(cur, ext))
            started = o.and_(active, is_load, fits_load)
            self.start_load(sel, cur, ext, started)
            load_done = o.or_(load_done, passed, started)
            load_failed = o.or_(load_failed, o.and_(active, is_load, o.not_(fits_load)))
            active = o.and_(active, o.not_(is_load))
        hit = None
        if self.pool is not None:  # kv.prefix_hit, looked up in every round (after each preemption too)
            cur, hit, held = self.prefix_hit(sel, cur)
        n = self.num_new_tokens(cur)
        pad_fail: Term = False
        if self.spec:  # uniform-decode padding (speculative.pad)
            n, pad_fail = self.pad(cur, n)
            active_pad = active
            active = o.and_(active, o.not_(pad_fail))
        free = p.kv.num_blocks - self.s.kv_used - o.ite(self.running > 0, p.kv.watermark_blocks, 0)
        fits_kv = self.new_blocks(cur, n) <= free if hit is None else self.target_blocks(cur, n) - held <= free
        if p.admission.reserve_full_prompt:
            whole = o.max(self.target_blocks(cur, 0), self.blocks_for(cur["prompt_len"] + cur["num_generated"])) \
                - (cur["blocks"] if hit is None else held)
            fits_kv = o.and_(fits_kv, whole <= free)
        fits = o.and_(n > 0, self.running < p.batch.max_num_seqs, fits_kv)
        do_admit = o.and_(active, fits)
        victim_exists: Term = False
        if p.preempts_on_inversion:
            running = [o.and_(self.st(i) == int(Status.RUNNING), o.not_(self.admitted[i])) for i in range(n_slots)]
            victim = self.last(running, [self.victim_key(i) for i in range(n_slots)])
            margin = self.select(victim, [self.norm_priority(i) for i in range(n_slots)]) - \
                self.select(sel, [self.norm_priority(i) for i in range(n_slots)])
            victim_exists = o.and_(o.or_(*running), margin > p.preemption.priority_inversion_threshold)
        do_preempt = o.and_(active, n > 0, o.not_(fits), victim_exists)
        do_fail = o.and_(active_pad if self.spec else active, o.not_(do_admit), o.not_(do_preempt))
        self.admit(sel, cur, n, do_admit, hit)
        if p.preempts_on_inversion:
            self.preempt(victim, do_preempt)
        if self.con.loads or self.blocking:
            return o.or_(do_admit, load_done), o.or_(do_fail, load_failed)
        return do_admit, do_fail

    def pad(self, r: dict[str, Term], n: Term) -> tuple[Term, Term]:
        """speculative.pad for the selected waiting request: (n, or 1 + k when it is padded to a uniform decode;
        whether the pass gives up on it because 1 + k does not fit the budget)."""
        o, p, k = self.o, self.p, self.k
        gap = r["prompt_len"] + r["num_generated"] - r["num_computed"]
        ran = [o.and_(self.sched[i] > 0, o.not_(self.admitted[i])) for i in range(self.n)]
        ran_prefill = o.or_(*(o.and_(ran[i], self.in_prefill(self.view(i))) for i in range(self.n)))
        wants = o.and_(n > 0, gap == 1, o.not_(ran_prefill), o.or_(r["num_computed"] != 0, *ran),
                       r["num_computed"] + k + 2 <= p.max_model_len)
        fail = o.and_(wants, 1 + k > self.budget)
        return o.ite(wants, 1 + k, n), fail

    # ------------------------------------------------------------------ a KV connector's loads (transfer.py)
    def external_tokens(self, i: int) -> Term:
        """transfer.external_tokens: what a load would bring (only a request that has had no transfer asks)."""
        o, sl, ext = self.o, self.s.slots[i], self.params[i].external_tokens
        return o.ite(o.and_(sl["transfer_step"] == -1, ext > 0), o.max(0, ext - sl["num_computed"]), 0)

    def promote(self, sel: list[Term], active: Term) -> Term:
        """_try_admit's first lines: a selected LOADING request whose load was reported in an earlier step's
        output is promoted (transfer.promote: WAITING, a full-prompt load recomputing its last token); one whose
        load is not reported is passed over (returned: the round is done with it)."""
        o, s = self.o, self.s
        passed: Term = False
        for i in range(self.n):
            sl, prm = s.slots[i], self.params[i]
            loading = o.and_(active, sel[i], self.st(i) == int(Status.LOADING))
            reported = sl["transfer_step"] < s.step
            passed = o.or_(passed, o.and_(loading, o.not_(reported)))
            up = o.and_(loading, reported)
            tokens = prm.prompt_len + sl["num_generated"]
            self.set(i, "num_computed", o.and_(up, sl["num_computed"] >= tokens), tokens - 1)
            self.set(i, "status", up, int(Status.WAITING))
        return passed

    def inflight_reserved(self) -> Term:
        """transfer.inflight_reserved: blocks the loads in flight and the running requests still in their prefill
        (after the tokens scheduled so far in this step) need to hold their whole sequence."""
        o, p, s = self.o, self.p, self.s
        total: Term = 0
        for i in range(self.n):
            sl, prm = s.slots[i], self.params[i]
            tokens = prm.prompt_len + sl["num_generated"]
            need = o.max(0, self.blocks_for(o.min(tokens, p.max_model_len)) - sl["blocks"])
            computed = sl["num_computed"] + self.sched[i]
            prefilling = o.and_(self.st(i) == int(Status.RUNNING), computed < tokens,
                                o.or_(sl["num_generated"] == 0, computed + 1 < tokens))
            total = total + o.ite(o.or_(self.st(i) == int(Status.LOADING), prefilling), need, 0)
        return total

    def can_start_load(self, r: dict[str, Term], ext: Term) -> Term:
        """transfer.can_start_load (no block pool: the request holds ``r["blocks"]``)."""
        o, p = self.o, self.p
        free = p.kv.num_blocks - self.s.kv_used - o.ite(self.running > 0, p.kv.watermark_blocks, 0)
        held = r["blocks"]
        ok: Term = True
        if p.admission.reserve_full_prompt:
            ok = self.blocks_for(r["prompt_len"] + r["num_generated"]) - held <= free
        reserved = self.inflight_reserved() if self.con.reserve_inflight else 0
        return o.and_(ok, self.blocks_for(r["num_computed"] + ext) - held <= free - reserved)

    def start_load(self, sel: list[Term], r: dict[str, Term], ext: Term, cond: Term) -> None:
        """transfer.start_load: the loaded tokens' blocks taken and held while LOADING; reported in the output of
        step ``step + load_steps - 1`` (never, for -1); with holders_first it joins the holders' queue last."""
        o, s = self.o, self.s
        tokens = r["num_computed"] + ext
        blocks = self.blocks_for(tokens)
        for i in range(self.n):
            c = o.and_(cond, sel[i])
            steps = self.params[i].load_steps
            self.set(i, "blocks", c, blocks)
            self.set(i, "num_computed", c, tokens)
            self.set(i, "transfer_step", c, o.ite(steps < 0, NEVER, s.step + steps - 1))
            self.set(i, "status", c, int(Status.LOADING))
            if self.holders_q:
                self.set(i, "load_seq", c, s.next_load)
            self.loads[i] = o.or_(self.loads[i], c)
        if self.holders_q:
            s.next_load = s.next_load + o.b2i(cond)

    def admission_blocked(self) -> Term:
        if self.p.preemption.block_admission_after_preempt:
            return self.growth_preempted
        return False

    def running_round(self, loop: dict, prefill_only: bool) -> None:
        """One round of phase A: serve, skip or stall the first unprocessed running request, or preempt
        one victim for it."""
        o = self.o
        n_slots = self.n
        processed = loop["processed"]
        cand = [o.and_(self.st(i) == int(Status.RUNNING), o.not_(processed[i])) for i in range(n_slots)]
        active = o.and_(loop["enabled"], self.budget > 0, o.or_(*cand))
        sel = self.first(cand, [(self.s.slots[i]["admitted_seq"],) for i in range(n_slots)])
        done = self.serve_running(sel, active, loop["want"], prefill_only)
        loop["processed"] = [o.or_(processed[i], o.and_(done, sel[i])) for i in range(n_slots)]

    def waiting_round(self, loop: dict) -> None:
        """One round of phase B over the queue snapshot in key order: admit or give up on the first
        untried request, or preempt one running request for it (priority inversion)."""
        o, p = self.o, self.p
        n_slots = self.n
        snapshot, tried = loop["snapshot"], loop["tried"]
        inversion = p.preempts_on_inversion
        cand = [o.and_(snapshot[i], o.not_(tried[i])) for i in range(n_slots)]
        room = o.and_(self.budget > 0, True if inversion else self.running < p.batch.max_num_seqs)
        any_cand = o.or_(*cand)
        stopped = o.or_(loop["stopped"], o.and_(any_cand, o.not_(room)))
        active = o.and_(o.not_(stopped), any_cand)
        sel = self.first(cand, loop["keys"])
        admitted, failed = self.try_admit(sel, active)
        loop["tried"] = [o.or_(tried[i], o.and_(sel[i], o.or_(admitted, failed))) for i in range(n_slots)]
        if p.queue.head_of_line is HeadOfLine.STRICT:
            stopped = o.or_(stopped, failed)
        loop["stopped"] = stopped

    def mixed_round(self, loop: dict) -> None:
        """One round of Orca's single pass: serve or admit the first unprocessed request in queue order,
        or preempt one victim."""
        o, p = self.o, self.p
        n_slots = self.n
        snapshot, processed, admitting = loop["snapshot"], loop["processed"], loop["admitting"]
        inversion = p.preempts_on_inversion
        strict = p.queue.head_of_line is HeadOfLine.STRICT
        cand = [o.and_(snapshot[i], o.not_(processed[i])) for i in range(n_slots)]
        any_cand = o.or_(*cand)
        stopped = o.or_(loop["stopped"], o.and_(any_cand, self.budget <= 0))
        active = o.and_(o.not_(stopped), any_cand)
        sel = self.first(cand, loop["keys"])
        is_running = o.or_(*(o.and_(sel[i], self.st(i) == int(Status.RUNNING)) for i in range(n_slots)))
        was_preempted = o.or_(*(o.and_(sel[i], self.preempted[i]) for i in range(n_slots)))
        run_done = self.serve_running(sel, o.and_(active, is_running), loop["want"])
        waiting = o.and_(active, o.not_(is_running))
        may_admit = o.and_(waiting, admitting, o.not_(was_preempted), o.not_(self.admission_blocked()))
        seq_full = False if inversion else o.and_(may_admit, self.running >= p.batch.max_num_seqs)
        admitted, failed = self.try_admit(sel, o.and_(may_admit, o.not_(seq_full)))
        passed_over = o.and_(waiting, o.not_(may_admit))
        done = o.or_(run_done, passed_over, seq_full, admitted, failed)
        loop["processed"] = [o.or_(processed[i], o.and_(done, sel[i])) for i in range(n_slots)]
        loop["admitting"] = o.and_(admitting, o.not_(seq_full), o.not_(failed) if strict else True)
        loop["stopped"] = stopped

    def prefix_hit(self, sel: list[Term], cur: dict[str, Term]) -> tuple[dict[str, Term], tuple, Term]:
        """The selected waiting request's prefix-cache hit (kv.prefix_hit; none unless nothing is computed):
        its fields as the admission check reads them (the chunk starts after the hit; kv.adopt's blocks), the
        hit (length, chosen records) and the blocks admission counts as held (kv.can_admit)."""
        o, p = self.o, self.p
        size = p.kv.block_size
        tokens = cur["prompt_len"] + cur["num_generated"]
        codes, _ = self.pool.codes(self.select(sel, [prm.identity for prm in self.params]), cur["prompt_len"],
                                   self.select(sel, list(range(self.n))))
        limit = o.ite(cur["num_computed"] == 0, o.floor_div(tokens - 1, size), 0)
        length, chosen, evictable = self.pool.hit(codes, limit)
        held = cur["blocks"] + length - (evictable if p.kv.prefix_caching.count_evictable_hits else 0)
        cur = {**cur, "num_computed": cur["num_computed"] + length * size,
               "blocks": o.ite(length > 0, length, cur["blocks"])}
        return cur, (length, chosen), held

    def admit(self, sel: list[Term], r: dict[str, Term], n: Term, cond: Term, hit: tuple | None = None) -> None:
        o, s = self.o, self.s
        if hit is not None:  # kv.adopt: the hit's blocks are the request's first, its tokens computed
            length, chosen = hit
            self.pool.adopt(sel, chosen, length, cond)
            for i in range(self.n):
                c = o.and_(cond, sel[i], length > 0)
                self.set(i, "num_computed", c, r["num_computed"])
                self.set(i, "blocks", c, r["blocks"])
        for i in range(self.n):
            c = o.and_(cond, sel[i])
            self.set(i, "swapped_blocks", c, 0)
            self.set(i, "status", c, int(Status.RUNNING))
            self.set(i, "admitted_seq", c, s.next_seq)
            self.admitted[i] = o.or_(self.admitted[i], c)
        s.next_seq = s.next_seq + o.b2i(cond)
        self.running = self.running + o.b2i(cond)
        self.charge(sel, r, n, cond)

    # ------------------------------------------------------------------ complete
    def complete(self) -> list[Term]:
        o, p, s = self.o, self.p, self.s
        fair = p.queue.order is QueueOrder.TENANT_FAIR
        weights = p.queue.vtc_weights
        produced_all = []
        holders = []  # finished requests free their blocks in the order they were scheduled (pool only)
        for i in range(self.n):
            sl, prm = s.slots[i], self.params[i]
            n = self.sched[i]
            scheduled = n > 0
            prefill = self.in_prefill(self.view(i))
            total = prm.prompt_len + sl["num_generated"]
            computed = sl["num_computed"] + n
            produced = o.and_(scheduled, computed == total)
            generated = sl["num_generated"] + o.b2i(produced)
            finish = o.and_(produced, o.or_(generated >= prm.output_len, total + 1 >= p.max_model_len))
            if fair:
                gain = o.ite(o.and_(scheduled, prefill), weights.input_weight * n, 0) + \
                    o.ite(produced, weights.output_weight, 0)
            if self.spec:  # a row verifying drafts (speculative.verify): 1 + a tokens kept, the rest rolled back
                verifying, m = self.verify(i, n, total)
                computed = o.ite(verifying, sl["num_computed"] + m, computed)
                generated = o.ite(verifying, sl["num_generated"] + m, generated)
                finish = o.ite(verifying, o.or_(generated >= prm.output_len, total + m >= p.max_model_len), finish)
                produced = o.or_(produced, verifying)
                if fair:
                    gain = o.ite(verifying, weights.output_weight * m, gain)
            if fair:
                s.counters = [c + o.ite(prm.tenant == t, gain, 0) for t, c in enumerate(s.counters)]
            self.set(i, "num_computed", scheduled, computed)
            self.set(i, "num_generated", produced, generated)
            self.set(i, "reason", finish, o.ite(generated >= prm.output_len, int(Reason.STOPPED),
                                                 int(Reason.LENGTH_CAPPED)))
            self.set(i, "status", finish, int(Status.FINISHED))
            holders.append((i, finish, sl["blocks"]))
            if self.con.pins:  # transfer.pin: held until the send is confirmed or the deadline passes
                self.pin(i, finish)
            else:
                self.set(i, "blocks", finish, 0)
            produced_all.append(produced)
        if self.pool is not None:
            self.pool.release([(i, finish, blocks, sum_terms([o.b2i(o.and_(f, self.order[q] < self.order[i]))
                                                              for q, f, _ in holders if q != i]))
                               for i, finish, blocks in holders])
        if self.con.enabled:
            self.report_phase()
        if self.spec:
            self.propose(produced_all)
        s.step = s.step + 1
        return produced_all

    def verify(self, i: int, n: Term, total: Term) -> tuple[Term, Term]:
        """speculative.verify for slot i given n tokens: (whether its row verifies drafts, the output tokens it
        keeps). A row admitted in this step verifies only a padded decode's placeholders (it held no drafts): none
        accepted, and no entry of its accepted list taken; any other takes the environment's choice, clamped to the
        drafts scheduled. Records both in ``self.verified`` / ``self.taken``."""
        o, sl, prm = self.o, self.s.slots[i], self.params[i]
        drafts = n - (total - sl["num_computed"])
        verifying = o.and_(n > 0, drafts > 0)
        padded = self.admitted[i]
        a = o.ite(padded, 0, o.max(0, o.min(self.accepted[i], drafts)))
        self.verified[i] = o.and_(verifying, o.not_(padded))
        self.taken[i] = o.ite(self.verified[i], a, 0)
        m = o.min(o.min(1 + a, prm.output_len - sl["num_generated"]), self.p.max_model_len - total)
        return verifying, m

    def propose(self, produced: list[Term]) -> None:
        """speculative.propose: the scheduled requests' drafts consumed; k new ones for each that produced a token
        and still runs."""
        o = self.o
        for i in range(self.n):
            slot = self.s.slots[i]
            runs = slot["status"] == int(Status.RUNNING)
            slot["drafts"] = o.ite(o.and_(produced[i], runs), self.k, o.ite(self.sched[i] > 0, 0, slot["drafts"]))

    def pin(self, i: int, finish: Term) -> None:
        """transfer.pin: confirmed in the output of step ``step + 1 + send_steps`` (never, for -1)."""
        o, s, c = self.o, self.s, self.con
        steps = self.params[i].send_steps
        self.set(i, "transfer_step", finish, o.ite(steps < 0, NEVER, s.step + 1 + steps))
        self.set(i, "release_step", finish,
                 s.step + c.release_deadline_steps if c.release is ReleaseRule.DEADLINE else NEVER)

    def report_phase(self) -> None:
        """transfer.report_phase: held requests whose transfer is reported in this step's output are freed."""
        o, s = self.o, self.s
        for i in range(self.n):
            sl = s.slots[i]
            due = o.and_(self.is_(i, Status.CANCELLED, Status.FINISHED), sl["release_step"] != -1,
                         sl["transfer_step"] >= 0, sl["transfer_step"] <= s.step)
            self.set(i, "blocks", due, 0)
            self.set(i, "release_step", due, -1)


class Pass:
    """A phase of the schedule: its loop variables at the start, and one round (a slot's worth of work).
    The step runs ``rounds_per_slot`` rounds per slot; verification also runs single rounds from symbolic
    loop variables (checker/verify/actions.py)."""

    rounds_per_slot = 2
    loop_kinds: ClassVar[dict[str, str]] = {}  # loop variable -> "bool", "bools", "ints" (per slot) or "keys"

    def __init__(self, enable: Callable[[SymbolicStep], Term] | None = None):
        self.enable = enable  # whether the pass runs, read from the step when the pass starts

    def enabled(self, step: SymbolicStep) -> Term:
        return True if self.enable is None else self.enable(step)

    def start(self, step: SymbolicStep) -> dict:
        raise NotImplementedError

    def round(self, step: SymbolicStep, loop: dict) -> None:
        raise NotImplementedError


class RunningPass(Pass):
    loop_kinds: ClassVar[dict[str, str]] = {"enabled": "bool", "processed": "bools", "want": "ints"}

    def __init__(self, prefill_only: bool = False, **kw):
        super().__init__(**kw)
        self.prefill_only = prefill_only

    def start(self, step: SymbolicStep) -> dict:
        # want: tokens fixed when a request is first reached (as in the engine)
        return {"enabled": self.enabled(step), "processed": [False] * step.n, "want": [-1] * step.n}

    def round(self, step: SymbolicStep, loop: dict) -> None:
        step.running_round(loop, self.prefill_only)


class WaitingPass(Pass):
    loop_kinds: ClassVar[dict[str, str]] = {"snapshot": "bools", "keys": "keys", "tried": "bools", "stopped": "bool"}

    def start(self, step: SymbolicStep) -> dict:
        o, n = step.o, step.n
        enabled = o.and_(self.enabled(step), o.not_(step.admission_blocked()))
        return {"snapshot": [o.and_(step.is_(i, *step.queued), o.not_(step.preempted[i])) for i in range(n)],
                "keys": [step.waiting_key(i) for i in range(n)], "tried": [False] * n, "stopped": o.not_(enabled)}

    def round(self, step: SymbolicStep, loop: dict) -> None:
        step.waiting_round(loop)


class MixedPass(Pass):
    rounds_per_slot = 3
    loop_kinds: ClassVar[dict[str, str]] = {"keys": "keys", "snapshot": "bools", "processed": "bools", "want": "ints",
                                            "admitting": "bool", "stopped": "bool"}

    def start(self, step: SymbolicStep) -> dict:
        n = step.n
        return {"keys": [step.queue_key(i) for i in range(n)],  # the order is fixed when the pass starts
                "snapshot": [step.is_(i, Status.RUNNING, *WAITING_STATES) for i in range(n)],
                "processed": [False] * n, "want": [-1] * n, "admitting": True, "stopped": False}

    def round(self, step: SymbolicStep, loop: dict) -> None:
        step.mixed_round(loop)


def symbolic_step(ops, policy: Policy, params: list[SlotParams], state: SlotState, now_us: Term,
                  cancels: list[Term], accepted: list[Term] | None = None) -> StepResult:
    return SymbolicStep(ops, policy, params, state, now_us, cancels, accepted).run()
