"""Concrete invariant predicates over (state after a step, the step's decision)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from checker.semantics.decision import StepDecision
from checker.semantics.state import SchedulerState, Status

Predicate = Callable[[SchedulerState, StepDecision], bool]


@dataclass(frozen=True)
class Invariant:
    name: str
    statement: str
    holds: Predicate


def kv_never_overcommitted(s: SchedulerState, d: StepDecision) -> bool:
    """Blocks in use never exceed the pool."""
    return s.kv_used <= s.policy.kv.num_blocks


def token_budget(s: SchedulerState, d: StepDecision) -> bool:
    """The tokens scheduled in one step never exceed max_num_batched_tokens."""
    return sum(n for _, n in d.scheduled) <= s.policy.batch.max_num_batched_tokens


def seq_cap(s: SchedulerState, d: StepDecision) -> bool:
    """Running requests never exceed max_num_seqs."""
    return len(s.running) <= s.policy.batch.max_num_seqs


def request_conservation(s: SchedulerState, d: StepDecision) -> bool:
    """Each request is in exactly one state and queue; none is lost or duplicated, and the KV
    counters are the sums of what requests hold."""
    running = [r.rid for r in s.running]
    waiting = [r.rid for r in s.waiting]
    if len(set(running)) != len(running) or len(set(waiting)) != len(waiting) or set(running) & set(waiting):
        return False
    run_set, wait_set = set(running), set(waiting)
    for r in s.requests:
        if (r.rid in run_set) != (r.status is Status.RUNNING):
            return False
        if (r.rid in wait_set) != (r.status in (Status.WAITING, Status.SWAPPED)):
            return False
        if r.status in (Status.PENDING, Status.WAITING, Status.FINISHED, Status.REJECTED) and r.blocks:
            return False
    return (s.kv_used == sum(r.blocks for r in s.requests)
            and s.swap_used == sum(r.swapped_blocks for r in s.requests))


CATALOGUE: dict[str, Invariant] = {
    inv.__name__: Invariant(inv.__name__, (inv.__doc__ or "").strip(), inv)
    for inv in (kv_never_overcommitted, token_budget, seq_cap, request_conservation)
}


def get(name: str) -> Invariant:
    return CATALOGUE[name]
