"""The abstract step of the any-N proof: two distinguished slots and sums over all the others.

A concrete state has N slots. An action of the step (checker/smt/encode.py: the prefix, a round of a pass, the
hand-over between passes, the completion) is shown here on an **instance**: a few slots kept whole (their fields,
parameters, per-slot step and loop variables) and a ``Rest``: what the other slots contribute to the quantities
the step reads across slots (blocks held, tokens scheduled, how many are in each status, whether one of them is a
candidate of the pass). The instance runs the **concrete code** (``SymbolicStep``), with three reads redirected:

- ``kv_used`` and ``count(...)`` add the rest's sums (``RestState``, ``RestStep.count``);
- ``first`` (the cursor of a round) selects slot 0, and records the assumption that slot 0 is a candidate
  whenever slot 1 or a rest slot is one: slot 0 *is* the cursor (the extraction);
- ``last`` (a preemption victim) selects slot 0 or slot 1, whichever is running, a free choice when both are
  (slot 1 is the victim when the victim is another slot: any running slot may be chosen, a superset of "the
  last one"); a third kept slot (a bystander: a slot of the rest kept whole, so that its facts are checked under
  the round's new globals) is never chosen, and is a victim candidate only if slot 0 or 1 is one.

What the instance leaves out is checked, not assumed (anyn.side_conditions, at every run): the concrete N-slot
action and the instance extracted from it (cursor, victim and a bystander as slots 0, 1, 2, the rest summed) agree
on every field, per-slot variable and global, and the rest's slots are untouched: proved by z3 from every state of
the proof's predicate at N = 2..5 (anyn_symbolic.py), compared on random states of N = 1..6 (anyn_conformance.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from checker.policy import Policy, PreemptMode, QueueOrder, Scheduler
from checker.semantics.state import FIELDS, Reason, Status
from checker.smt.encode import SlotParams, SlotState, SymbolicStep
from checker.smt.ops import Term, sum_terms

STATUSES = tuple(Status)


@dataclass
class Rest:
    """The slots not kept whole, as sums: blocks held, tokens scheduled in this step, the number in each status,
    and whether one of them is a candidate of the current pass (not yet served, tried or processed)."""

    blocks: Term
    sched: Term
    counts: dict[int, Term]
    cand: Term = False

    @property
    def running(self) -> Term:
        return self.counts[int(Status.RUNNING)]


def limit_choices(o, pre: dict[str, Term], post: dict[str, Term], i: int) -> dict[str, Term]:
    """The answers of ``admission_limits`` that reproduce a concrete arrival of slot i (its fields before and after
    the step's arrivals): the reason it was rejected for (a witness for the side-condition checks)."""
    rejected = o.and_(pre["status"] == int(Status.PENDING), post["status"] == int(Status.REJECTED))
    return {f"arrival_over_{i}": o.and_(rejected, post["reason"] == int(Reason.OVERLOADED)),
            f"arrival_full_{i}": o.and_(rejected, post["reason"] == int(Reason.QUEUE_FULL))}


def empty_rest() -> Rest:
    return Rest(0, 0, {int(s): 0 for s in STATUSES}, False)


@dataclass
class RestState(SlotState):
    """A SlotState whose KV in use adds the rest's blocks."""

    rest_blocks: Term = 0

    @property
    def kv_used(self) -> Term:
        return sum_terms([slot["blocks"] for slot in self.slots]) + self.rest_blocks

    @property
    def swap_used(self) -> Term:  # pragma: no cover - swap is refused (not_covered)
        raise AssertionError("any-N: swap space is not covered")


class RestStep(SymbolicStep):
    """SymbolicStep over the kept slots, reading the rest through its sums (the module docstring)."""

    def __init__(self, ops, policy: Policy, params: list[SlotParams], state: RestState, now_us: Term,
                 cancels: list[Term], rest: Rest, choose: Callable[[str], Term]):
        super().__init__(ops, policy, params, state, now_us, cancels)
        self.rest = rest
        self.choose = choose  # a free Boolean (z3) or the chosen value (ints), by name
        self.assumed: list[Term] = []  # what the extraction assumes (slot 0 is the cursor)
        c = policy.chunking
        self.threshold = c.long_prefill_token_threshold  # constant (not_covered refuses the others)

    def count(self, *statuses: Status) -> Term:
        return super().count(*statuses) + sum_terms([self.rest.counts[int(s)] for s in statuses])

    def admission_limits(self, i: int, waiting: Term, running: Term, queued_tokens: Term) -> tuple[Term, Term]:
        """Over max_inflight, queue full: any answer (they read the requests that arrived before in this step, in
        arrival order); a rejection at arrival holds nothing and runs nothing, so any answer keeps the sums' claims."""
        adm = self.p.admission
        over = False if adm.max_inflight is None else self.choose(f"arrival_over_{i}")
        full = False if adm.max_queue_len is None and adm.max_queued_tokens is None else \
            self.choose(f"arrival_full_{i}")
        return over, full

    def first(self, cand: list[Term], keys: list[tuple]) -> list[Term]:
        o = self.o
        others = o.or_(self.rest.cand, *cand[1:])
        self.assumed.append(o.or_(o.not_(others), cand[0]))
        return [cand[0]] + [False] * (self.n - 1)

    def last(self, cand: list[Term], keys: list[tuple]) -> list[Term]:
        o = self.o
        if self.n == 1:
            return [cand[0]]
        if self.n > 2:  # a bystander (a rest slot kept whole) is never the victim: one of slots 0, 1 is, if any
            self.assumed.append(o.or_(o.not_(o.or_(*cand[2:])), cand[0], cand[1]))
        pick = self.choose("victim_is_slot1")
        one = o.and_(cand[1], o.or_(pick, o.not_(cand[0])))
        return [o.and_(cand[0], o.not_(one)), one] + [False] * (self.n - 2)


def not_covered(policy: Policy) -> list[str]:
    """The policy's rules the any-N method does not cover (each reads other slots' data beyond the sums the
    instance keeps, or a state the encoding has no proof lemmas for), by name; empty when covered."""
    out = []
    if policy.scheduler is Scheduler.SGLANG:
        out.append("scheduler: sglang (not encoded in z3)")
    if policy.kv.prefix_caching.enabled:
        out.append("kv.prefix_caching.enabled (block identity: the pool is shared between slots)")
    if policy.speculative.enabled:
        out.append("speculative decoding (its drafts and the verifier's choices are encoded for the bounded check and "
                   "whole-step induction for N slots only)")
    if policy.connector.enabled:
        out.append("connector (KV transfers: holders' queue and load order across slots)")
    if policy.queue.blocked_waiting != "off":
        out.append(f"queue.blocked_waiting: {policy.queue.blocked_waiting.value} (blocked waiting states, not encoded)")
    c = policy.chunking
    if c.long_prefill_token_threshold and (c.threshold_adaptive or not c.threshold_when_alone):
        out.append("chunking.long_prefill_token_threshold adaptive or not when alone (reads the number of "
                   "eligible requests)")
    if policy.preemption.mode is PreemptMode.SWAP:
        out.append("preemption.mode: swap (swap space shared between slots)")
    return out


# ---------------------------------------------------------------------------------------------- scenes
@dataclass
class Scene:
    """What candidates read at one point: the instance's step (kept slots and step variables), the pass's loop
    variables (None at step boundaries) and the rest."""

    step: RestStep
    loop: dict | None
    sched: list[Term]
    rest: Rest
    pass_kind: str = ""  # "RunningPass", "WaitingPass", "MixedPass"; "" at step boundaries
    extra: dict = field(default_factory=dict)

    @property
    def n(self) -> int:
        return self.step.n

    @property
    def o(self):
        return self.step.o

    def slot(self, i: int) -> dict[str, Term]:
        return self.step.s.slots[i]

    def running(self, i: int) -> Term:
        return self.slot(i)["status"] == int(Status.RUNNING)

    @property
    def kv(self) -> Term:
        return self.step.s.kv_used

    @property
    def run(self) -> Term:
        return sum_terms([self.o.b2i(self.running(i)) for i in range(self.n)]) + self.rest.running

    @property
    def scheduled(self) -> Term:
        return sum_terms(list(self.sched)) + self.rest.sched

    def cand(self, i: int) -> Term:
        """Slot i is a candidate of the current pass (the pass's ``cand`` in encode.py)."""
        o, lp = self.o, self.loop
        if self.pass_kind == "RunningPass":
            return o.and_(self.running(i), o.not_(lp["processed"][i]))
        if self.pass_kind == "WaitingPass":
            return o.and_(lp["snapshot"][i], o.not_(lp["tried"][i]))
        return o.and_(lp["snapshot"][i], o.not_(lp["processed"][i]))

    def key(self, i: int) -> tuple:
        if self.pass_kind == "RunningPass":
            return (self.slot(i)["admitted_seq"],)
        return tuple(self.loop["keys"][i])

    def reached(self, i: int) -> Term:
        """Slot i's tokens were fixed when the pass first reached it, and it is still to be served."""
        if self.pass_kind not in ("RunningPass", "MixedPass"):
            return False
        o = self.o
        return o.and_(self.loop["want"][i] >= 0, self.cand(i), self.running(i))


def copy_loop(loop: dict | None) -> dict | None:
    if loop is None:
        return None
    return {k: list(v) if isinstance(v, list) else v for k, v in loop.items()}


def snapshot_step(step: RestStep) -> RestStep:
    """A copy of the instance's variables before an action mutates them."""
    copy = RestStep(step.o, step.p, step.params, step.s, step.now, step.cancels, step.rest, step.choose)
    for name in ("sched", "grown", "preempted", "admitted"):
        setattr(copy, name, list(getattr(step, name)))
    for name in ("growth_preempted", "budget", "prefill_budget", "running", "running_at_start"):
        if hasattr(step, name):
            setattr(copy, name, getattr(step, name))
    return copy


def blank_fields() -> dict[str, int]:
    blank = {f: 0 for f in FIELDS}
    blank["status"] = int(Status.PENDING)
    blank["release_step"] = -1
    return blank
