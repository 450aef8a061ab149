"""Frames: what invariants look at, one per step, in the same shape for the engine and for z3.

A frame is the state after a step (every slot's fields), what the step scheduled, produced and
preempted, and the clock. ``frame_from_engine`` reads the engine (plain ints); the verifier builds the
same frames from z3 terms. Invariants (invariants/) are written once against frames and Ops.
"""

from __future__ import annotations

from dataclasses import dataclass

from checker.policy import Policy
from checker.semantics.blockpool import PoolFacts
from checker.semantics.decision import StepDecision
from checker.semantics.state import FIELDS, SchedulerState
from checker.smt.encode import SlotParams
from checker.smt.ops import Term


@dataclass(frozen=True)
class Frame:
    slots: tuple[dict[str, Term], ...]  # per slot: FIELDS after the step
    scheduled: tuple[Term, ...]  # tokens per slot in the step
    produced: tuple[Term, ...]  # bool per slot: an output token in the step
    preempted: tuple[Term, ...]  # bool per slot: preempted in the step
    kv_used: Term
    now_us: Term  # when the step started
    counters: tuple[Term, ...] = ()  # per tenant (tenant_fair)
    pool: PoolFacts | None = None  # with block identity (prefix caching): the pool as the block tables show it
    # Under SGLang's rules with the radix cache: the tree's (evictable, protected) tokens after the step; else None
    radix: tuple[int, int] | None = None
    # Blocked waiting states (policy.queue.blocked_waiting; checker.semantics.blocked): the slots whose request the
    # step's scan found blocked (its grammar not ready): not schedulable work. Empty elsewhere. In z3's unrolling
    # (checker/verify/bmc.py) a bool term per slot instead.
    blocked: frozenset[int] | tuple[Term, ...] = frozenset()


@dataclass(frozen=True)
class TraceContext:
    """Everything an invariant may read: the policy, the slots' fixed parameters, the frames so far."""

    policy: Policy
    params: tuple[SlotParams, ...]
    frames: list[Frame]

    @property
    def num_slots(self) -> int:
        return len(self.params)


def params_from_engine(s: SchedulerState) -> tuple[SlotParams, ...]:
    """The slots' parameters as the environment gave them: the prompt length is the request's own (a scheduler
    that takes a prompt as shorter, SGLang's truncation, changes what the engine computes, not the request), as
    check-log reads them from its arrivals."""
    return tuple(SlotParams(r.arrival_us, r.spec.prompt_len, r.output_len, r.max_output, r.priority, r.tenant)
                 for r in s.requests)


def frame_from_engine(s: SchedulerState, d: StepDecision) -> Frame:
    scheduled = dict(d.scheduled)
    produced = set(d.produced)
    preempted = set(d.preempted)
    return Frame(
        slots=tuple(dict(zip(FIELDS, r.snapshot())) for r in s.requests),
        scheduled=tuple(scheduled.get(r.rid, 0) for r in s.requests),
        produced=tuple(r.rid in produced for r in s.requests),
        preempted=tuple(r.rid in preempted for r in s.requests),
        kv_used=s.kv_used, now_us=d.now_us, counters=tuple(s.tenant_counters),
        pool=None if s.pool is None else s.pool.facts(s.requests),
        radix=None if s.sglang is None or s.sglang.tree is None else (s.sglang.tree.evictable, s.sglang.tree.protected),
        blocked=frozenset() if not s.blocked else frozenset(rid for rid, ready in s.blocked.items() if ready > d.step))
