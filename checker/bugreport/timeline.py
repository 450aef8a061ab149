"""What each request did in each iteration of a run, read from the engine's step decisions.

A timeline is built from the StepDecisions the engine recorded (a counterexample replayed on the engine,
or a whole ``simulate`` run with ``record``): never from a second simulator. Per request it holds runs of
one phase (waiting, a prefill chunk, decode, admitted without tokens, cancelled but holding KV) and the
events (preempted, cancelled, finished, rejected); per iteration the KV blocks in use and the tokens
scheduled. ``x`` edges place iteration k between ``edges[k]`` and ``edges[k + 1]`` (iterations on a fixed
clock, or time).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum

from checker.policy import Policy
from checker.semantics.decision import StepDecision
from checker.requests import RequestSpec


class Phase(Enum):
    """What a request does during one iteration (its row's colour)."""

    WAITING = "waiting"
    REQUEUED = "waiting after preemption"
    PREFILL = "prefill chunk"
    DECODE = "decode"
    STALLED = "admitted, no tokens"
    HELD = "holding KV after cancel"


class Event(Enum):
    """What happens to a request at one instant (a marker on its row)."""

    PREEMPTED = "preempted"
    CANCELLED = "cancelled"
    FINISHED = "finished"
    REJECTED = "rejected"


@dataclass
class Segment:
    start: int  # first iteration
    end: int  # iteration after the last
    phase: Phase
    tokens: int = 0  # tokens scheduled in it (prefill and decode)


@dataclass(frozen=True)
class Mark:
    step: int
    event: Event
    at_end: bool  # at the end of the iteration (finished), else at its start


@dataclass
class RequestRow:
    rid: int
    label: str
    segments: list[Segment] = field(default_factory=list)
    marks: list[Mark] = field(default_factory=list)

    def at(self, k: int) -> str:
        """What the request did in iteration k, in words ('' if nothing: not arrived yet, or done)."""
        parts = [mark.event.value for mark in self.marks if mark.step == k and not mark.at_end]
        for seg in self.segments:
            if seg.start <= k < seg.end:
                tokens = f" ({seg.tokens} tokens)" if seg.phase is Phase.PREFILL else ""
                parts.append(seg.phase.value + tokens)
        parts += [mark.event.value for mark in self.marks if mark.step == k and mark.at_end]
        return ", ".join(parts)

    def add(self, k: int, phase: Phase, tokens: int = 0) -> None:
        last = self.segments[-1] if self.segments else None
        # a prefill chunk is its own segment (its tokens are labelled); other phases merge into runs
        if last is not None and last.end == k and last.phase is phase and phase is not Phase.PREFILL:
            last.end = k + 1
            last.tokens += tokens
        else:
            self.segments.append(Segment(k, k + 1, phase, tokens))


@dataclass
class ClassLatency:
    """One request class's latencies over a run: per request that got its first token, its arrival (on the
    timeline's x axis), TTFT and queue delay (ms)."""

    name: str
    arrival: list[float]
    ttft_ms: list[float]
    queue_ms: list[float]


@dataclass
class Timeline:
    title: str
    x_label: str
    edges: list[float]  # len(steps) + 1 boundaries on the x axis
    iteration_axis: bool  # x counts iterations (fixed clock), not time
    rows: list[RequestRow]
    total_requests: int
    kv_used: list[int]  # per iteration, after it
    kv_blocks: int
    prefill_tokens: list[int]
    decode_tokens: list[int]
    token_budget: int
    running: list[int]  # requests running after each iteration
    waiting: list[int]  # requests waiting after each iteration
    violation: int | None = None  # the iteration at which the property fails
    violation_label: str = ""
    cycle: tuple[int, int] | None = None  # a lasso: (first iteration of its cycle's first turn, cycle length)
    latency: list[ClassLatency] | None = None  # whole runs (simulate --plot): TTFT and queue delay over time

    @property
    def steps(self) -> int:
        return len(self.kv_used)

    @property
    def rows_capped(self) -> bool:
        return len(self.rows) < self.total_requests


class _State(Enum):
    WAITING = 1
    RUNNING = 2
    HELD = 3
    DONE = 4


def shown_requests(total: int, max_rows: int) -> list[int]:
    """All requests, or ``max_rows`` of them spread evenly over the run (in arrival order)."""
    if total <= max_rows:
        return list(range(total))
    stride = -(-total // max_rows)
    return list(range(0, total, stride))


def request_label(spec: RequestSpec, class_names: Sequence[str], priority: bool = False) -> str:
    cls = f" {class_names[spec.cls]}" if len(class_names) > 1 else ""
    prio = f", prio {spec.priority}" if priority else ""
    return f"req {spec.rid}{cls} ({spec.prompt_len} in, {spec.output_len} out{prio})"


class _DecodeClassifier:
    """Which scheduled requests decode (one token closing the gap) and which run a prefill chunk or a
    recompute. A decode is always one token for a request that has an output token; the decision counts
    its decodes (``num_decode_seqs``), which settles every case where the one-token candidates are all
    decodes; otherwise the computed tokens followed from the decisions decide (recompute clears them)."""

    def __init__(self, specs: Sequence[RequestSpec]):
        self.prompt = [s.prompt_len for s in specs]
        self.computed = [0] * len(specs)
        self.generated = [0] * len(specs)

    def decodes(self, d: StepDecision) -> set[int]:
        one_token = [rid for rid, n in d.scheduled if n == 1 and self.generated[rid] >= 1]
        if len(one_token) == d.num_decode_seqs:
            found = set(one_token)
        else:
            found = {rid for rid in one_token if self.computed[rid] + 1 == self.prompt[rid] + self.generated[rid]}
        for rid, n in d.scheduled:
            self.computed[rid] += n
        for rid in d.produced:
            self.generated[rid] += 1
        for rid in d.preempted:
            self.computed[rid] = 0
        return found


def build_timeline(policy: Policy, specs: Sequence[RequestSpec], decisions: Sequence[StepDecision],
                   edges: Sequence[float], *, title: str, x_label: str, iteration_axis: bool,
                   class_names: Sequence[str] = (), max_rows: int | None = None,
                   violation: int | None = None, violation_label: str = "") -> Timeline:
    """The timeline of a run from its decisions; ``edges`` has one boundary more than there are decisions."""
    if len(edges) != len(decisions) + 1:
        raise ValueError(f"{len(edges)} edges for {len(decisions)} iterations")
    shown = shown_requests(len(specs), max_rows if max_rows is not None else len(specs))
    priority = len({s.priority for s in specs}) > 1  # rows say each request's priority where they differ
    rows = {rid: RequestRow(rid, request_label(specs[rid], class_names, priority)) for rid in shown}
    state: dict[int, _State] = {}
    active: set[int] = set()  # shown requests that have arrived and are not done
    requeued: set[int] = set()
    holds_after_cancel = policy.cancellation.release_lag_steps > 0
    classifier = _DecodeClassifier(specs)
    kv_used, prefill, decode, running, waiting = [], [], [], [], []
    for k, d in enumerate(decisions):
        released = set(d.released)
        for rid in released:
            if state.get(rid) is _State.HELD:
                state[rid] = _State.DONE
        for rid in d.arrived:
            state[rid] = _State.WAITING
            if rid in rows:
                active.add(rid)
        marks: list[tuple[int, Event, bool]] = [(rid, Event.REJECTED, False) for rid, _ in d.rejected]
        for rid, _ in d.rejected:
            state[rid] = _State.DONE
        for rid in d.cancelled:
            marks.append((rid, Event.CANCELLED, False))
            was_running = state.get(rid) is _State.RUNNING
            state[rid] = _State.HELD if holds_after_cancel and was_running and rid not in released else _State.DONE
        for rid in d.admitted:
            state[rid] = _State.RUNNING
            requeued.discard(rid)
        for rid in d.preempted:
            state[rid] = _State.WAITING
            requeued.add(rid)
            marks.append((rid, Event.PREEMPTED, False))
        marks += [(rid, Event.FINISHED, True) for rid in d.finished]
        decoding = classifier.decodes(d)
        scheduled = dict(d.scheduled)
        for rid in active:
            row, st = rows[rid], state[rid]
            if rid in scheduled:
                row.add(k, Phase.DECODE if rid in decoding else Phase.PREFILL, scheduled[rid])
            elif st is _State.RUNNING:
                row.add(k, Phase.STALLED)
            elif st is _State.WAITING:
                row.add(k, Phase.REQUEUED if rid in requeued else Phase.WAITING)
            elif st is _State.HELD:
                row.add(k, Phase.HELD)
        for rid, event, at_end in marks:
            if rid in rows:
                rows[rid].marks.append(Mark(k, event, at_end))
        for rid in d.finished:
            state[rid] = _State.DONE
        active = {rid for rid in active if state[rid] is not _State.DONE}
        kv_used.append(d.kv_blocks_used)
        prefill.append(d.num_prefill_tokens)
        decode.append(d.num_decode_seqs)
        running.append(d.num_running)
        waiting.append(d.num_waiting)
    return Timeline(title, x_label, list(edges), iteration_axis, list(rows.values()), len(specs), kv_used,
                    policy.kv.num_blocks, prefill, decode, policy.batch.max_num_batched_tokens, running, waiting,
                    violation, violation_label)
