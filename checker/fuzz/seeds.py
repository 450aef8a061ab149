"""A real trace as the fuzzer's seed corpus (docs/fuzz.md, "Seeding from a real trace").

The trace (after the trace options: window, load scale, class rule) is cut into windows of at most
``max_requests`` consecutive requests; the busiest windows (prompt plus output tokens arriving per
second) come first. Each becomes a list of ``Draw`` on the workload's classes: a trace class named like a
workload class maps to it; requests of an unnamed class (``default``, the only class of a trace without a
class rule, or a ``--class-by-prompt`` bucket) go to the workload class whose prompt range is nearest their
prompt length (the first listed on a tie); any other class name is an input error. Lengths are clamped
into the mapped class's ranges, and the clamping is reported.

Hypothesis runs the windows as explicit examples, before it generates; it does not shrink a failing
explicit example, so :func:`shrink` does (requests removed, then each field lowered toward its class's
floor), judging every candidate with the same judge.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from checker.errors import InputError, Problem
from checker.fuzz.strategies import Draw, Ranges, ranges
from checker.traces import RequestSet
from checker.workload import Workload

UNNAMED = "default"  # the class of every request of a trace read without a class rule
SHRINK_CALLS = 2_000  # judge calls one seed shrink may spend


@dataclass
class SeedCorpus:
    windows: list[list[Draw]]  # the windows to run, busiest first
    total_windows: int  # windows the trace was cut into
    requests: int  # requests of the trace after the options
    clamped: int  # requests of the chosen windows whose prompt or output was clamped
    mapping: dict[str, str] = field(default_factory=dict)  # trace class -> workload class or "by prompt length"

    def notes(self, source: str) -> list[str]:
        seeded = sum(len(w) for w in self.windows)
        classes = ", ".join(f"{k} -> {v}" for k, v in self.mapping.items())
        lines = [f"seed trace {source}: {self.requests} requests cut into {self.total_windows} windows; the "
                 f"{len(self.windows)} busiest (tokens arriving per second) run first as explicit examples",
                 f"seed classes: {classes}"]
        if self.clamped:
            lines.append(f"seed lengths: {self.clamped} of {seeded} seed requests had a prompt or output outside "
                         "their workload class's range and were clamped into it")
        return lines


def _distance(value: int, low: int, high: int) -> int:
    return 0 if low <= value <= high else min(abs(value - low), abs(value - high))


def _class_map(rs: RequestSet, w: Workload, source: str) -> tuple[list[int | None], dict[str, str]]:
    """Per trace class: the workload class index, or None for 'by prompt length'; and the mapping, in
    words, of the classes the trace's requests use."""
    names = [c.name for c in w.classes]
    used = {s.cls for s in rs.specs}
    out: list[int | None] = []
    mapping: dict[str, str] = {}
    for ci, name in enumerate(rs.class_names):
        if name in names:
            out.append(names.index(name))
        elif name == UNNAMED or _is_bucket(name):
            out.append(None)
        elif ci in used:
            raise InputError(Problem("class", name, "a class of the workload (" + ", ".join(names) + "), or a "
                                     "trace without class names, whose requests map by prompt length"), source)
        else:
            out.append(None)
        if ci in used:
            mapping[name] = name if out[-1] is not None else "by prompt length"
    return out, mapping


def _is_bucket(name: str) -> bool:
    return name.startswith("prompt<") or name.startswith("prompt>=") or "<=prompt<" in name


def _nearest(prompt: int, r: Ranges) -> int:
    return min(range(len(r.prompt)), key=lambda c: (_distance(prompt, *r.prompt[c]), c))


def _clamp(value: int, bounds: tuple[int, int]) -> int:
    return min(bounds[1], max(bounds[0], value))


def seed_corpus(rs: RequestSet, w: Workload, max_requests: int, max_windows: int, source: str) -> SeedCorpus:
    """The trace's busiest windows of at most ``max_requests`` requests, as Draw lists on ``w``'s classes."""
    r = ranges(w)
    class_of, mapping = _class_map(rs, w, source)
    specs = rs.specs
    chunks = [specs[i:i + max_requests] for i in range(0, len(specs), max_requests)]

    def busy(chunk) -> float:
        span_ms = max(1.0, (chunk[-1].arrival_us - chunk[0].arrival_us) / 1000)
        return sum(s.prompt_len + s.output_len for s in chunk) / span_ms

    order = sorted(range(len(chunks)), key=lambda i: (-busy(chunks[i]), i))[:max_windows]
    windows, clamped = [], 0
    for i in order:
        draws, previous_ms = [], round(chunks[i][0].arrival_us / 1000)
        for s in chunks[i]:
            c = class_of[s.cls]
            if c is None:
                c = _nearest(s.prompt_len, r)
            prompt, output = _clamp(s.prompt_len, r.prompt[c]), _clamp(s.output_len, r.output[c])
            clamped += (prompt, output) != (s.prompt_len, s.output_len)
            at_ms = round(s.arrival_us / 1000)
            cancel = None if s.cancel_us is None else round((s.cancel_us - s.arrival_us) / 1000)
            draws.append(Draw(at_ms - previous_ms, c, prompt, output, cancel))
            previous_ms = at_ms
        windows.append(draws)
    return SeedCorpus(windows, len(chunks), len(specs), clamped, mapping)


Fails = Callable[[list[Draw]], "tuple[bool, object]"]


def shrink(trace: list[Draw], fails: Fails, r: Ranges, deadline: float | None = None,
           max_calls: int = SHRINK_CALLS) -> tuple[list[Draw], object, int]:
    """A smaller failing trace: greedily remove runs of requests (halving the run length down to one), then
    lower each request's gap, prompt and output toward 0 / its class's floors (binary search), and drop
    cancellations; repeat until nothing changes or the budget (calls, deadline) is spent. Returns the
    trace, the judge's verdict on it, and the judge calls spent."""
    calls = 0
    ok, verdict = fails(trace)
    assert ok, "shrink() needs a failing trace"

    def attempt(candidate: list[Draw]) -> bool:
        nonlocal calls, verdict
        if calls >= max_calls or (deadline is not None and time.monotonic() > deadline) or not candidate:
            return False
        calls += 1
        failed, v = fails(candidate)
        if failed:
            verdict = v
        return failed

    def lower(i: int, name: str, floor: int) -> None:
        nonlocal trace
        low, high = floor, getattr(trace[i], name)  # high fails; find the least value in [low, high] that fails
        while low < high:
            mid = (low + high) // 2
            candidate = trace[:i] + [trace[i]._replace(**{name: mid})] + trace[i + 1:]
            if attempt(candidate):
                trace, high = candidate, mid
            else:
                low = mid + 1

    changed = True
    while changed:
        before = list(trace)
        run = max(1, len(trace) // 2)
        while run >= 1:
            i = 0
            while i < len(trace):
                candidate = trace[:i] + trace[i + run:]
                if not attempt(candidate):
                    i += run
                else:
                    trace = candidate
            run //= 2
        for i in range(len(trace)):
            if trace[i].cancel_after_ms is not None:
                candidate = trace[:i] + [trace[i]._replace(cancel_after_ms=None)] + trace[i + 1:]
                if attempt(candidate):
                    trace = candidate
            lower(i, "gap_ms", 0)
            lower(i, "prompt", r.prompt[trace[i].cls][0])
            lower(i, "output", r.output[trace[i].cls][0])
        changed = trace != before
    return trace, verdict, calls
