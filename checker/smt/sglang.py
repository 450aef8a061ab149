"""SGLang's step (policy ``scheduler: sglang``, checker/semantics/sglang.py) as a data-oblivious function over N
request slots, for z3 — the radix cache off.

It mirrors checker.semantics.sglang rule by rule: the phases before the schedule are the vLLM encoding's
(checker/smt/encode.py: arrival with SGLang's prompt limit and max-output cap, the queue timeout), a running
request's abort ends after its next row; then SGLang's loop: a prefill batch whenever one forms (the chunked request
continued first, the waiting queue in fcfs / lof / priority order through the prefill adder), else the running batch
decodes, retract_decode freeing victims (fewest output tokens, longest prompt among equals, the latest in the running
list among equal keys) until the next pages fit, the last one aborted when even it does not fit. Allocation is
page-granular (a request holds ceil(tokens / page) pages).

The new-token ratio is a float in the engine. Here it is exact (``ratio``: the exact rational the engine's float
would be if every float operation were exact, held as an integer count of 1/unit, ratio_unit: linear integer
arithmetic only) with ``age``, a bound on the float operations since the
ratio was last exact (the engine's float differs from ``ratio`` by at most ``age`` x 2^-53: a decay step adds one
rounding, the re-estimate after a retraction is one rounding from the exact quotient, min and max add none; the reset
and a quotient >= 1 are exact). The prefill adder's float budget (the running requests' reservations, clipped remaining
output times the ratio, summed, and the page-ceiled extends added) then differs from its exact value by at most
``ERR``: zero when the ratio is exactly 1 or no running request reserves anything (integers only), else
(C x (age + 1) + K x B) x 2^-53 for C the most reserved tokens, K the float additions and B the largest magnitude.
Each comparison of the budget (budget_state, PrefillBudget.check_prefill, the chunk limit's int()) whose exact
operands are within that bound of each other is *ambiguous*: the step's ``inexact`` term says one was reached, and
verify's SGLang driver (checker/verify/sglang_bmc.py) never decides a verdict through one (docs/semantics.md,
"SGLang in z3").

Not encoded, refused by name (exit 2): the radix cache (sglang.radix_cache), priority preemption
(preemption.triggers priority_inversion), speculative decoding, async scheduling; and a request with ignore_eos has
no slot parameter (the environment never makes one).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from fractions import Fraction
from math import lcm

from checker.errors import InputError, Problem
from checker.policy import Policy, QueueOrder, Scheduler, SGLangQueue, Victim
from checker.semantics import blocked
from checker.semantics.sglang import INPUT_MARGIN, max_request_len
from checker.semantics.state import Reason, Status
from checker.smt.encode import (SlotParams, SlotState, StepResult, SymbolicStep, blank_slot, require_no_pipeline,
                                require_no_speculative)
from checker.smt.ops import Term, scale, scaled_quotient, sum_terms

# Per-slot fields beside FIELDS: the waiting queue's entry stamp (SGLangState.entry), the place in s.running (its
# index, normalised at the end of each step) and the abort mark (SGLangState.aborting, 0/1).
SGLANG_FIELDS = ("entry", "rpos", "aborting")
ULP = Fraction(1, 2**53)  # a float operation's relative rounding error on values of magnitude <= 1


@dataclass
class SGLangGlobals:
    """SGLangState's scalars: the chunked slot (-1: none), batch_is_full, the last step's filter flag (shrunk),
    whether the last step ran a batch, the exact ratio and its age, the next entry stamp."""

    chunked: Term = -1
    full: Term = False
    shrunk: Term = False
    ran_batch: Term = False
    ratio: Term = 0
    age: Term = 0
    next_entry: Term = 0


@dataclass
class SGLangSlotState(SlotState):
    g: SGLangGlobals | None = None

    def copy(self) -> SGLangSlotState:
        return replace(self, slots=[dict(s) for s in self.slots], counters=list(self.counters), g=replace(self.g))


@dataclass
class SGLangStepResult(StepResult):
    inexact: Term = False  # a float comparison of the prefill adder was within its error bound (see above)


def require_sglang_encodable(policy: Policy) -> None:
    """Refuse (exit 2) what the SGLang encoding does not cover, by name."""
    if policy.scheduler is not Scheduler.SGLANG:
        raise InputError(Problem("scheduler", policy.scheduler.value, "sglang for the SGLang encoding"))
    if policy.sglang.radix_cache:
        raise InputError(Problem("sglang.radix_cache", True, "false for the z3 encoding: the radix cache (longest "
                                 "prefix matches, lpm / dfs-weight over the tree, eviction) is not encoded in z3; "
                                 "`verify --cache-method explicit` checks it on the engine"))
    if policy.preempts_on_inversion:
        raise InputError(Problem("preemption.triggers", "priority_inversion", "[kv_growth_fails] for the z3 encoding: "
                                 "SGLang's priority preemption is not encoded in z3; `verify --cache-method explicit` "
                                 "checks it on the engine"))
    require_no_speculative(policy)
    require_no_pipeline(policy)
    blocked.refuse(policy, "the SGLang z3 encoding")  # blocked waiting states: encoded under the vLLM rules only


def sglang_blank_slot(policy: Policy) -> dict[str, int]:
    return {**blank_slot(policy), **{f: 0 for f in SGLANG_FIELDS}}


def ratio_unit(policy: Policy, num_slots: int, most_output: int) -> int:
    """The ratio's unit: the ratio is held as an integer count of 1/unit, exact for every value it can take (the
    floats init, decay and min are dyadic, 2^K covers them and the rounding bound 2^-53; a re-estimate is a quotient
    by at most num_slots x most_output + 1, which lcm(1..that) divides). Integers only: linear integer arithmetic for
    the solver, no reals."""
    rules = policy.sglang
    bits = max(Fraction(x).denominator.bit_length() for x in (rules.init_ratio, rules.ratio_decay, rules.min_ratio))
    return 2 ** max(64, bits + 2) * lcm(*range(1, quotient_bound(policy, num_slots, most_output) + 1))


def quotient_bound(policy: Policy, num_slots: int, most_output: int) -> int:
    return num_slots * output_bound(policy, most_output) + 1


def scaled(value, unit: int) -> int:
    """An exact rational (a float at its binary value) in units of 1/unit."""
    v = Fraction(value) * unit
    assert v.denominator == 1, value
    return int(v)


def initial_globals(policy: Policy, unit: int) -> SGLangGlobals:
    return SGLangGlobals(ratio=scaled(policy.sglang.init_ratio, unit))


def arrival_cap(o, policy: Policy, prompt: Term) -> Term:
    """sglang.arrival's cap on max_new_tokens (what is left of max_req_len, and what an empty pool holds beside the
    page-ceiled prompt and one page)."""
    page = policy.kv.block_size
    capacity = policy.kv.num_blocks * page
    return o.max(0, o.min(max_request_len(policy) - prompt - 1, capacity - o.ceil_div(prompt, page) * page - page - 1))


def capped_params(o, policy: Policy, params: list[SlotParams]) -> list[SlotParams]:
    """The slots' parameters as the engine holds them once arrived (sglang.arrival lowers max_output and output_len
    to the cap; a capped value is its own cap, so a captured state's parameters pass unchanged)."""
    out = []
    for prm in params:
        cap = arrival_cap(o, policy, prm.prompt_len)
        over = prm.max_output > cap
        out.append(replace(prm, max_output=o.ite(over, cap, prm.max_output),
                           output_len=o.ite(over, o.min(prm.output_len, cap), prm.output_len)))
    return out


def output_bound(policy: Policy, most: int) -> int:
    """The largest max_output an arrived request can have: the environment's ``most``, and the arrival cap."""
    page = policy.kv.block_size
    return max(0, min(most, max_request_len(policy) - 2, policy.kv.num_blocks * page - 2 * page - 1))


def error_terms(policy: Policy, num_slots: int, clip_bound: int) -> tuple[Fraction, Fraction]:
    """ERR = (age + 1) x the first + the second: C x 2^-53 for C the most reserved tokens, K x B x 2^-53 for K float
    additions of magnitude at most B."""
    page = policy.kv.block_size
    cmax = num_slots * clip_bound
    magnitude = (policy.kv.num_blocks * page + cmax
                 + (num_slots + 1) * (-(-policy.max_model_len // page) * page + page + clip_bound) + num_slots)
    return cmax * ULP, (2 * num_slots + 4) * magnitude * ULP


def statically_exact(policy: Policy, num_slots: int, depth: int, longest_prompt_tokens: int, most_output: int) -> bool:
    """Whether no step within ``depth`` iterations can be inexact, by arithmetic: no retraction can happen (even
    num_slots requests of the longest prompt, each a token further every iteration, fit the pool), so the ratio is
    one of the decay sequence's values (or exactly 1), and none of them times any reserved total lies within the
    error bound of an integer (the budget comparisons' other operands are integers)."""
    page = policy.kv.block_size
    if num_slots * -(-(longest_prompt_tokens + depth) // page) > policy.kv.num_blocks:
        return False
    rules = policy.sglang
    clip_bound = min(rules.clip_max_new_tokens, output_bound(policy, most_output))
    per_age, fixed = error_terms(policy, num_slots, clip_bound)
    bound = (depth + 1) * per_age + fixed
    init, decay, floor = Fraction(rules.init_ratio), Fraction(rules.ratio_decay), Fraction(rules.min_ratio)
    values = {max(init - k * decay, floor) for k in range(depth + 1)} - {Fraction(1)}  # 1 is exact (age 0)
    for v in values:
        for c in range(1, num_slots * clip_bound + 1):
            x = c * v
            if min(x - (x.numerator // x.denominator), (x.numerator // x.denominator) + 1 - x) <= bound:
                return False
    return True


class SGLangStep(SymbolicStep):
    """One SGLang step over the slots (``most_output``: the largest max_output any slot may have, which bounds the
    case splits of the ratio's products)."""

    def __init__(self, ops, policy: Policy, params: list[SlotParams], state: SGLangSlotState, now_us: Term,
                 cancels: list[Term], most_output: int):
        require_sglang_encodable(policy)
        self.o, self.p, self.now, self.cancels = ops, policy, now_us, cancels
        self.spec = False  # SymbolicStep's speculative fields: refused above (require_no_speculative)
        self.params = capped_params(ops, policy, params)
        self.s = state.copy()
        self.g = self.s.g
        self.n = n = len(params)
        self.sched: list[Term] = [0] * n
        self.grown: list[Term] = [0] * n
        self.preempted: list[Term] = [False] * n
        self.admitted: list[Term] = [False] * n
        self.loads: list[Term] = [False] * n
        self.order: list[Term] = [-1] * n
        self.pool = None
        self.con = policy.connector
        self.holders_q = False
        self.queued = (Status.WAITING, Status.SWAPPED)
        self.page = policy.kv.block_size
        rules = policy.sglang
        self.rules = rules
        self.out_bound = output_bound(policy, most_output)
        self.clip_bound = min(rules.clip_max_new_tokens, self.out_bound)
        self.unit = ratio_unit(policy, n, most_output)
        self.inexact: Term = False
        self.err: Term = 0  # the adder's float error bound in this step (set when the adder starts)
        self.remade: Term = False  # the prefill batch becomes the running batch object (mixed, or none was running)

    # ------------------------------------------------------------------ helpers
    def slot(self, i: int) -> dict[str, Term]:
        return self.s.slots[i]

    def running(self, i: int) -> Term:
        return self.st(i) == int(Status.RUNNING)

    def waiting(self, i: int) -> Term:
        return self.st(i) == int(Status.WAITING)

    def in_batch(self, i: int) -> Term:
        """In the running batch: running, and not the chunked request."""
        return self.o.and_(self.running(i), self.g.chunked != i)

    def free_pages(self) -> Term:
        return self.p.kv.num_blocks - sum_terms([sl["blocks"] for sl in self.s.slots])

    def on_boundary(self, i: int) -> Term:
        """The request's KV ends on a page boundary: its next token needs a new page."""
        c = self.slot(i)["num_computed"]
        return c - self.o.floor_div(c, self.page) * self.page == 0

    def pages_to_decode(self, members: list[Term]) -> Term:
        return sum_terms([self.o.b2i(self.o.and_(members[i], self.on_boundary(i))) for i in range(self.n)])

    def ceil_page(self, tokens: Term) -> Term:
        return self.o.ceil_div(tokens, self.page) * self.page

    def float_less(self, lhs: Term, rhs: Term, active: Term) -> Term:
        """lhs < rhs, where the engine computes lhs (or rhs) in floats within self.err of its exact value: marks the
        step inexact where that bound makes the comparison ambiguous."""
        o = self.o
        d = rhs - lhs
        self.inexact = o.or_(self.inexact, o.and_(active, self.err > 0, d <= self.err, -d <= self.err))
        return lhs < rhs

    # ------------------------------------------------------------------ the step
    def run(self) -> SGLangStepResult:
        self.arrive()
        self.cancel()
        self.expire()
        self.schedule()
        before = [self.st(i) for i in range(self.n)]
        produced = self.complete()
        self.end_aborted(produced, before)
        self.normalise_positions()
        return SGLangStepResult(self.s, self.sched, produced, self.preempted, self.loads, inexact=self.inexact)

    def arrive(self) -> None:
        """Phase 2 with SGLang's prompt limit (a prompt of max_req_input_len tokens or more is PROMPT_TOO_LONG, as one
        of max_model_len), then the accepted ones enter the queue in slot order."""
        o, p = self.o, self.p
        before = [self.st(i) == int(Status.PENDING) for i in range(self.n)]
        self.p = p.model_copy(update={"max_model_len": min(p.max_model_len, max_request_len(p) - INPUT_MARGIN)})
        try:
            super().arrive()
        finally:
            self.p = p
        for i in range(self.n):
            self.enter_queue(i, o.and_(before[i], self.waiting(i)))

    def enter_queue(self, i: int, cond: Term) -> None:
        g = self.g
        self.set(i, "entry", cond, g.next_entry + 1)
        g.next_entry = g.next_entry + self.o.b2i(cond)

    def cancel(self) -> None:
        """A waiting request leaves at once; the chunked one is torn down now; any other running one is marked and
        ends when its next row is computed (sglang.abort_running)."""
        o, g = self.o, self.g
        for i in range(self.n):
            c = self.cancels[i]
            now = o.and_(c, o.or_(self.waiting(i), o.and_(self.running(i), g.chunked == i)))
            g.chunked = o.ite(o.and_(now, g.chunked == i), -1, g.chunked)
            self.set(i, "aborting", o.and_(c, self.running(i), o.not_(now)), 1)
            self.set(i, "blocks", now, 0)
            self.set(i, "reason", now, int(Reason.ABORTED))
            self.set(i, "status", now, int(Status.CANCELLED))

    # ------------------------------------------------------------------ schedule (sglang.schedule)
    def schedule(self) -> None:
        o, g = self.o, self.g
        g.full = o.ite(g.shrunk, False, g.full)
        formed = self.prefill()
        batch = [self.in_batch(i) for i in range(self.n)]
        self.decode(o.and_(o.not_(formed), o.or_(*batch)), batch)
        ran = o.or_(*(x > 0 for x in self.sched))
        idle = o.and_(o.not_(ran), o.not_(g.ran_batch),
                      *(o.not_(self.is_(i, Status.RUNNING, Status.WAITING)) for i in range(self.n)))
        g.ratio = o.ite(idle, scaled(self.rules.init_ratio, self.unit), g.ratio)
        g.age = o.ite(idle, 0, g.age)
        g.ran_batch = ran

    def queue_key(self, i: int, now: Term | None = None) -> tuple:
        """_sort_queue's order: (priority, then) lof's max_new_tokens descending, then entry."""
        sl, prm = self.slot(i), self.params[i]
        key: tuple = ()
        if self.p.queue.order is QueueOrder.PRIORITY:
            key = (self.norm_priority(i),)
        if self.rules.schedule_policy is SGLangQueue.LOF:
            key += (-prm.max_output,)
        return key + (sl["entry"],)

    def retract_key(self, i: int) -> tuple:
        """retraction_key (the largest is kept longest)."""
        sl, prm = self.slot(i), self.params[i]
        key = (sl["num_generated"], -prm.prompt_len)
        if self.p.preemption.victim is Victim.LOWEST_PRIORITY:
            key = (-self.norm_priority(i),) + key
        return key

    # ------------------------------------------------------------------ the prefill adder
    def adder_error(self, batch: list[Term], reserved: list[Term]) -> Term:
        """ERR (module docstring): the bound on the float budget's distance from its exact value."""
        o, g, n = self.o, self.g, self.n
        exact = o.or_(o.and_(g.age == 0, g.ratio == self.unit),
                      o.not_(o.or_(*(o.and_(batch[i], reserved[i] > 0) for i in range(n)))))
        per_age, fixed = error_terms(self.p, n, self.clip_bound)
        return o.ite(exact, 0, (g.age + 1) * scaled(per_age, self.unit) + scaled(fixed, self.unit))

    def prefill(self) -> Term:
        """_prefill: whether a prefill batch formed (its rows scheduled)."""
        o, p, g, n, page = self.o, self.p, self.g, self.n, self.page
        batch = [self.in_batch(i) for i in range(n)]
        nb = sum_terms([o.b2i(b) for b in batch])
        g.full = o.ite(nb == 0, False, g.full)
        has_chunked = g.chunked >= 0
        any_waiting = o.or_(*(self.waiting(i) for i in range(n)))
        go = o.not_(o.and_(o.or_(g.full, o.not_(any_waiting)), o.not_(has_chunked)))
        max_running = p.batch.max_num_seqs
        at_cap = o.and_(go, max_running - nb <= 0, o.not_(has_chunked))
        g.full = o.ite(at_cap, True, g.full)
        go = o.and_(go, o.not_(at_cap))
        mixed = self.rules.mixed_chunk and p.chunking.enabled
        mixed_rows = nb if mixed else 0
        clip = self.rules.clip_max_new_tokens
        unit = self.unit
        available = self.free_pages() * page * unit  # the float budget's quantities in units of 1/unit
        reserved = [o.min(self.params[i].max_output - self.slot(i)["num_generated"], clip) for i in range(n)]
        self.err = self.adder_error(batch, reserved)
        a = {"total": mixed_rows * unit + sum_terms([o.ite(batch[i], scale(o, reserved[i], g.ratio, self.clip_bound), 0)
                                                     for i in range(n)]),
             "current": mixed_rows, "input": self.rules.max_prefill_tokens - mixed_rows,
             "chunk": p.batch.max_num_batched_tokens - mixed_rows if p.chunking.enabled else None, "can": 0}
        ext: list[Term] = [0] * n  # tokens each slot computes in the prefill batch
        idx: list[Term] = [0] * n  # its place in can_run
        new_chunked: Term = -1

        def reserve(cond: Term, e: Term, max_new: Term) -> None:
            whole = self.ceil_page(e)
            a["total"] = a["total"] + o.ite(cond, (whole + page + max_new) * unit, 0)
            a["current"] = a["current"] + o.ite(cond, whole + page, 0)
            a["input"] = a["input"] - o.ite(cond, whole, 0)
            if a["chunk"] is not None:
                a["chunk"] = a["chunk"] - o.ite(cond, whole, 0)

        def state(active: Term) -> tuple[Term, Term]:
            """budget_state: (NO_TOKEN, OTHER)."""
            tokens = o.not_(o.and_(self.float_less(a["total"], available, active),
                                   available - a["current"] * unit > 0))
            other = a["input"] <= 0
            if a["chunk"] is not None:
                other = o.or_(other, a["chunk"] <= 0)
            return tokens, o.and_(o.not_(tokens), other)

        # the chunked request's next chunk first (add_chunked: it always makes progress)
        continued: Term = False
        if a["chunk"] is not None:
            cond = o.and_(go, has_chunked)
            sel = [g.chunked == i for i in range(n)]
            r = self.selected(sel)
            rest = available - a["total"]
            whole = o.floor_div(rest, unit)  # int(): the chunk limit
            near = o.or_(rest - whole * unit <= self.err, (whole + 1) * unit - rest <= self.err)
            self.inexact = o.or_(self.inexact, o.and_(cond, self.err > 0, near, whole <= a["chunk"]))
            limit = o.ite(whole >= 1, o.min(a["chunk"], whole), a["chunk"])
            gap = r["prompt_len"] + r["num_generated"] - r["num_computed"]
            truncated = gap > limit
            take = o.min(gap, limit)
            reserve(cond, take, o.ite(truncated, 0, o.min(r["max_output"], clip)))
            for i in range(n):
                ext[i] = o.ite(o.and_(cond, sel[i]), take, ext[i])
            g.chunked = o.ite(o.and_(cond, o.not_(truncated)), -1, g.chunked)
            a["can"] = o.b2i(cond)
            continued = cond
        # the waiting queue in order
        keys = [self.queue_key(i) for i in range(n)]
        tried = [False] * n
        stopped = o.not_(go)
        for _ in range(n):
            cand = [o.and_(self.waiting(i), o.not_(tried[i])) for i in range(n)]
            sel = self.first(cand, keys)
            active = o.and_(o.not_(stopped), o.or_(*cand))
            _, other = state(active)
            active = o.and_(active, o.not_(other))
            g.full = o.ite(o.and_(active, a["can"] >= max_running - nb), True, g.full)
            stop_full = o.and_(active, g.full)
            active = o.and_(active, o.not_(g.full))
            r = self.selected(sel)
            extend = r["prompt_len"] + r["num_generated"]
            max_new = o.min(o.max(r["max_output"] - r["num_generated"], 0), clip)
            fits = self.float_less((extend + max_new + page) * unit, available - a["total"], active)
            whole = self.ceil_page(extend)
            refused = o.not_(fits)  # NO_TOKEN
            other_now: Term = False
            if a["chunk"] is None:  # without chunking only the first request may exceed the input cap
                other_now = o.and_(fits, a["can"] > 0, whole >= a["input"])
                admit, take, max_new = o.and_(active, fits, o.not_(other_now)), extend, o.min(r["max_output"], clip)
                cut = False
            else:
                cut = whole > a["chunk"]
                cut_to = o.floor_div(o.max(a["chunk"], 0), page) * page
                other_now = o.and_(fits, cut, cut_to <= 0)
                admit = o.and_(active, fits, o.not_(other_now))
                take = o.ite(cut, cut_to, extend)
                max_new = o.ite(cut, 0, o.min(r["max_output"], clip))
            for i in range(n):
                hit = o.and_(admit, sel[i])
                ext[i] = o.ite(hit, take, ext[i])
                idx[i] = o.ite(hit, a["can"], idx[i])
                tried[i] = o.or_(tried[i], o.and_(active, sel[i]))
                new_chunked = o.ite(o.and_(hit, cut), i, new_chunked)
            reserve(admit, take, max_new)
            a["can"] = a["can"] + o.b2i(admit)
            after_tokens, after_other = state(admit)
            no_token = o.or_(o.and_(active, refused), o.and_(admit, after_tokens))
            g.full = o.ite(no_token, o.or_(a["can"] > 0, nb > 0), g.full)
            stopped = o.or_(stopped, o.and_(o.not_(stopped), other), stop_full, no_token,
                            o.and_(active, other_now), o.and_(admit, after_other))
        formed = o.and_(go, a["can"] > 0)
        self.commit_prefill(formed, batch, ext, idx, continued, new_chunked, mixed)
        return formed

    def commit_prefill(self, formed: Term, batch: list[Term], ext: list[Term], idx: list[Term], continued: Term,
                       new_chunked: Term, mixed: bool) -> None:
        """The prefill batch: admitted requests run (admission sequence in can_run order), every row's pages are
        allocated, with mixed chunk the running batch decodes inside it when its pages fit; the running list's order."""
        o, g, n, s = self.o, self.g, self.n, self.s
        rows = [o.and_(formed, ext[i] > 0) for i in range(n)]
        g.chunked = o.ite(o.and_(formed, new_chunked >= 0), new_chunked, g.chunked)
        first_new = o.b2i(continued)
        fresh = 0
        for i in range(n):
            sl = self.slot(i)
            newly = o.and_(rows[i], self.waiting(i))
            self.set(i, "admitted_seq", newly, s.next_seq + idx[i] - first_new)
            fresh = fresh + o.b2i(newly)
            self.set(i, "status", rows[i], int(Status.RUNNING))
            target = self.blocks_for(sl["num_computed"] + ext[i])
            self.set(i, "blocks", rows[i], o.max(sl["blocks"], target))
            self.sched[i] = o.ite(rows[i], ext[i], self.sched[i])
            self.admitted[i] = newly
        s.next_seq = s.next_seq + fresh
        nb = sum_terms([o.b2i(b) for b in batch])
        decoding: Term = False
        if mixed:
            decoding = o.and_(formed, nb > 0, self.free_pages() >= self.pages_to_decode(batch))
            for i in range(n):
                grow = o.and_(decoding, batch[i])
                self.set(i, "blocks", o.and_(grow, self.on_boundary(i)), self.slot(i)["blocks"] + 1)
                self.sched[i] = o.ite(grow, 1, self.sched[i])
        self.remade = o.and_(formed, o.or_(decoding, nb == 0))
        # s.running = (batch + rows, or rows + batch when mixed) + [chunked]: keys, normalised at the step's end
        big = 4 * n + 4
        for i in range(n):
            chunk = o.and_(formed, g.chunked == i)
            row_key = o.ite(decoding, idx[i], n + 1 + idx[i])
            batch_key = o.ite(decoding, 2 * n + 2 + self.slot(i)["rpos"], self.slot(i)["rpos"])
            key = o.ite(chunk, big, o.ite(o.and_(rows[i], o.not_(batch[i])), row_key, batch_key))
            self.set(i, "rpos", formed, key)

    # ------------------------------------------------------------------ decode (sglang._decode, _retract)
    def decode(self, cond: Term, batch: list[Term]) -> None:
        o, g, n, rules = self.o, self.g, self.n, self.rules
        fits = self.free_pages() >= self.pages_to_decode(batch)
        retracting = o.and_(cond, o.not_(fits))
        keep = list(batch)
        count = sum_terms([o.b2i(b) for b in batch])
        initial = count
        victim_keys = [self.retract_key(i) + (-self.slot(i)["rpos"],) for i in range(n)]
        old_keys = [self.retract_key(i) for i in range(n)]
        old_rpos = [self.slot(i)["rpos"] for i in range(n)]
        popping = retracting
        for k in range(n - 1):
            again: Term = True if k == 0 else self.free_pages() < self.pages_to_decode(keep)
            pop = o.and_(popping, count > 1, again)
            sel = self.first(keep, victim_keys)
            for i in range(n):
                hit = o.and_(pop, sel[i])
                sl = self.slot(i)
                self.set(i, "num_preemptions", hit, sl["num_preemptions"] + 1)
                self.set(i, "num_computed", hit, 0)
                self.set(i, "blocks", hit, 0)
                self.set(i, "status", hit, int(Status.WAITING))
                self.enter_queue(i, hit)
                self.preempted[i] = o.or_(self.preempted[i], hit)
                keep[i] = o.and_(keep[i], o.not_(hit))
            count = count - o.b2i(pop)
            popping = pop
        oom = o.and_(retracting, count <= 1, self.free_pages() < self.pages_to_decode(keep))
        for i in range(n):
            hit = o.and_(oom, keep[i])
            self.set(i, "blocks", hit, 0)
            self.set(i, "reason", hit, int(Reason.OUT_OF_MEMORY))
            self.set(i, "status", hit, int(Status.CANCELLED))
            keep[i] = o.and_(keep[i], o.not_(oom))
        count = o.ite(oom, 0, count)
        # the ratio: re-estimated after a retraction (exact but for one rounding), else one decay step
        generated = sum_terms([o.ite(keep[i], self.slot(i)["num_generated"], 0) for i in range(n)])
        most = sum_terms([o.ite(keep[i], self.params[i].max_output, 0) for i in range(n)]) + 1
        unit = self.unit
        estimate = scaled_quotient(o, generated + rules.retract_decode_steps * count, most, n * self.out_bound + 1, unit)
        floor = scaled(rules.min_ratio, unit)
        if rules.ratio_decay:
            decayed, decayed_age = o.max(g.ratio - scaled(rules.ratio_decay, unit), floor), g.age + 1
        else:
            decayed, decayed_age = o.max(g.ratio, floor), g.age
        over = generated + rules.retract_decode_steps * count >= most
        g.ratio = o.ite(retracting, o.ite(over, unit, estimate), o.ite(cond, decayed, g.ratio))
        g.age = o.ite(retracting, o.ite(over, 0, 1), o.ite(cond, decayed_age, g.age))
        g.full = o.ite(o.and_(cond, count < initial), False, g.full)
        for i in range(n):
            run = o.and_(cond, keep[i])
            self.set(i, "blocks", o.and_(run, self.on_boundary(i)), self.slot(i)["blocks"] + 1)
            self.sched[i] = o.ite(run, 1, self.sched[i])
            # after a retraction the running list is the keep order (descending key, the older place among equals)
            ahead = sum_terms([o.b2i(o.and_(keep[j], o.or_(self.lex_lt(old_keys[i], old_keys[j]),
                                                            o.and_(*(a == b for a, b in zip(old_keys[i], old_keys[j])),
                                                                   old_rpos[j] < old_rpos[i]))))
                               for j in range(n) if j != i])
            self.set(i, "rpos", o.and_(retracting, keep[i]), ahead)

    # ------------------------------------------------------------------ after the rows
    def end_aborted(self, produced: list[Term], before: list[Term]) -> None:
        """sglang.end_aborted and after_step: a marked request that produced a token ends aborted; the next step's
        filter flag."""
        o, g, n = self.o, self.g, self.n
        finished = []
        for i in range(n):
            ending = o.and_(self.slot(i)["aborting"] == 1, produced[i])
            finished.append(o.and_(self.st(i) == int(Status.FINISHED), before[i] == int(Status.RUNNING),
                                   o.not_(ending)))
            self.set(i, "aborting", ending, 0)
            self.set(i, "blocks", ending, 0)
            self.set(i, "reason", ending, int(Reason.ABORTED))
            self.set(i, "status", ending, int(Status.CANCELLED))
            finished.append(ending)  # released after its row (in out.released and out.scheduled)
        chunk_ran = o.or_(*(o.and_(g.chunked == i, self.sched[i] > 0) for i in range(n)))
        g.shrunk = o.or_(self.remade, chunk_ran, *finished)

    def normalise_positions(self) -> None:
        o, n = self.o, self.n
        keys = [self.slot(i)["rpos"] for i in range(n)]
        run = [self.running(i) for i in range(n)]
        for i in range(n):
            ahead = sum_terms([o.b2i(o.and_(run[j], keys[j] < keys[i])) for j in range(n) if j != i])
            self.set(i, "rpos", True, o.ite(run[i], ahead, 0))


def sglang_step(ops, policy: Policy, params: list[SlotParams], state: SGLangSlotState, now_us: Term,
                cancels: list[Term], most_output: int) -> SGLangStepResult:
    return SGLangStep(ops, policy, params, state, now_us, cancels, most_output).run()
