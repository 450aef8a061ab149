"""The frozen record of what one scheduler step decided (cf. vLLM v1 ``SchedulerOutput``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from checker.semantics.state import Reason, Request


class StepDecision(NamedTuple):  # immutable; a tuple, so building one (every step) is cheap
    step: int
    now_us: int
    scheduled: tuple[tuple[int, int], ...]  # (rid, tokens) in scheduling order
    produced: tuple[int, ...]  # rids that produced an output token this step
    arrived: tuple[int, ...]  # rids that arrived and joined the waiting queue
    admitted: tuple[int, ...]
    preempted: tuple[int, ...]
    finished: tuple[int, ...]
    rejected: tuple[tuple[int, Reason], ...]
    cancelled: tuple[int, ...]
    released: tuple[int, ...]  # cancelled requests whose KV was freed this step
    num_prefill_tokens: int
    num_decode_seqs: int
    prefill_attention: int  # sum over prefill chunks of chunk * (context after the chunk)
    decode_kv_tokens: int  # sum over decodes of the context they read
    kv_blocks_used: int
    kv_blocks_free: int  # num_blocks - used (negative when an over-committing policy over-commits)
    num_running: int
    num_waiting: int

    @property
    def num_scheduled_tokens(self) -> int:
        return self.num_prefill_tokens + self.num_decode_seqs

    @property
    def is_quiet(self) -> bool:
        """Nothing happened: no tokens and no request changed state."""
        return not (self.scheduled or self.arrived or self.admitted or self.preempted or self.finished
                    or self.rejected or self.cancelled or self.released)


@dataclass(slots=True)
class DecisionBuilder:
    """Mutable collector the step fills in; frozen into a StepDecision at the end."""

    scheduled: dict[int, int] = field(default_factory=dict)  # rid -> tokens, insertion-ordered
    grown: dict[int, int] = field(default_factory=dict)  # rid -> blocks allocated this step
    produced: list[int] = field(default_factory=list)
    arrived: list[int] = field(default_factory=list)
    admitted: list[int] = field(default_factory=list)
    preempted: list[int] = field(default_factory=list)
    finished: list[int] = field(default_factory=list)
    rejected: list[tuple[int, Reason]] = field(default_factory=list)
    cancelled: list[int] = field(default_factory=list)
    released: list[int] = field(default_factory=list)
    preempted_for_growth: bool = False

    def schedule(self, r: Request, n: int, added_blocks: int) -> None:
        self.scheduled[r.rid] = n
        if added_blocks:
            self.grown[r.rid] = added_blocks

    def unschedule(self, r: Request) -> tuple[int, int]:
        """Roll back a request scheduled earlier in this step; return (tokens, blocks added)."""
        return self.scheduled.pop(r.rid, 0), self.grown.pop(r.rid, 0)
