"""The frozen record of what one scheduler step decided (cf. vLLM v1 ``SchedulerOutput``)."""

from __future__ import annotations

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
    cache_hits: tuple[tuple[int, int], ...] = ()  # (rid, prompt tokens it started from) for admissions with a prefix-cache hit
    loads: tuple[int, ...] = ()  # rids admitted as asynchronous KV loads (policy.connector) this step

    @property
    def num_scheduled_tokens(self) -> int:
        return self.num_prefill_tokens + self.num_decode_seqs

    @property
    def is_quiet(self) -> bool:
        """Nothing happened: no tokens and no request changed state."""
        return not (self.scheduled or self.arrived or self.admitted or self.preempted or self.finished
                    or self.rejected or self.cancelled or self.released or self.loads)


class DecisionBuilder:
    """Mutable collector the step fills in; frozen into a StepDecision at the end."""

    __slots__ = (
        "admitted",
        "arrived",
        "cancelled",
        "finished",
        "grown",
        "hits",
        "loads",
        "preempted",
        "preempted_for_growth",
        "produced",
        "rejected",
        "released",
        "scheduled",
    )

    def __init__(self) -> None:  # by hand: a dataclass's default factories cost twice as much, every step
        self.scheduled: dict[int, int] = {}  # rid -> tokens, insertion-ordered
        self.grown: dict[int, int] = {}  # rid -> blocks allocated this step
        self.hits: list[tuple[int, int]] = []  # (rid, tokens) prefix-cache hits of this step's admissions
        self.loads: list[int] = []  # rids admitted as asynchronous loads
        self.produced: list[int] = []
        self.arrived: list[int] = []
        self.admitted: list[int] = []
        self.preempted: list[int] = []
        self.finished: list[int] = []
        self.rejected: list[tuple[int, Reason]] = []
        self.cancelled: list[int] = []
        self.released: list[int] = []
        self.preempted_for_growth = False

    def schedule(self, r: Request, n: int, added_blocks: int) -> None:
        self.scheduled[r.rid] = n
        if added_blocks:
            self.grown[r.rid] = added_blocks

    def unschedule(self, r: Request) -> tuple[int, int]:
        """Roll back a request scheduled earlier in this step; return (tokens, blocks added)."""
        return self.scheduled.pop(r.rid, 0), self.grown.pop(r.rid, 0)
