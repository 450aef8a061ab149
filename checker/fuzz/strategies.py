"""Adversarial arrival sequences for a workload, as Hypothesis strategies.

A drawn trace is a list of requests ``Draw(gap_ms, cls, prompt, output, cancel_after_ms)`` whose
classes, length ranges and priorities come from a workload spec. One named strategy per stress; they
compose (``adversarial`` concatenates a few stress segments), shrink well (lists of small integers), and
are usable in a user's own tests::

    from hypothesis import given
    from checker.fuzz import strategies
    @given(strategies.adversarial(workload, policy))
    def test_my_slo(trace): ...
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from hypothesis import strategies as st

from checker.policy import Policy
from checker.semantics.state import RequestSpec
from checker.traces import RequestSet
from checker.workload import Workload


@dataclass(frozen=True)
class Draw:
    gap_ms: int  # time since the previous request of the trace
    cls: int  # class index in the workload
    prompt: int
    output: int
    cancel_after_ms: int | None = None


@dataclass(frozen=True)
class Ranges:
    """What the workload allows, per class: (low, high) prompt and output tokens, and the mean gap."""

    prompt: list[tuple[int, int]]
    output: list[tuple[int, int]]
    mean_gap_ms: list[int]
    tenants: list[int]
    priorities: list[int]


def _low(dist) -> int:
    for attr in ("low", "min", "value"):
        value = getattr(dist, attr, None)
        if value is not None:
            return value
    return min(dist.values)


def ranges(w: Workload) -> Ranges:
    gaps = []
    for c in w.classes:
        a = c.arrival
        rate = getattr(a, "rate_per_s", None)
        if rate is None and hasattr(a, "interval_ms"):
            rate = 1000.0 / a.interval_ms
        if rate is None:  # bursts
            rate = a.size * 1000.0 / a.every_ms
        gaps.append(max(1, round(1000.0 / rate)))
    tenant_index = {t: i for i, t in enumerate(w.tenants)}
    return Ranges([(_low(c.prompt_tokens), c.prompt_tokens.upper) for c in w.classes],
                  [(_low(c.output_tokens), c.output_tokens.upper) for c in w.classes], gaps,
                  [tenant_index[c.tenant] for c in w.classes], [c.priority for c in w.classes])


Stress = Callable[[Ranges, Policy, int], st.SearchStrategy[list[Draw]]]
FieldDraw = Callable[[st.DrawFn, int], int]


def _trace(n: int, pick_class: Callable[[st.DrawFn], int], gap: FieldDraw, prompt: FieldDraw,
           output: FieldDraw, cancel: FieldDraw | None = None) -> st.SearchStrategy[list[Draw]]:
    """A list of requests; each field is drawn by a function of (draw, class). Composite draws, not
    flatmap (far cheaper to generate), inside st.lists (so shrinking can delete any request)."""
    @st.composite
    def request(draw: st.DrawFn) -> Draw:
        c = pick_class(draw)
        return Draw(gap(draw, c), c, prompt(draw, c), output(draw, c), cancel(draw, c) if cancel else None)
    return st.lists(request(), min_size=1, max_size=n)


def _any_class(r: Ranges) -> Callable[[st.DrawFn], int]:
    return lambda draw: draw(st.integers(0, len(r.prompt) - 1))


def _within(bounds: list[tuple[int, int]]) -> FieldDraw:
    return lambda draw, c: draw(st.integers(*bounds[c]))


def _gap_up_to(r: Ranges, factor: float) -> FieldDraw:
    return lambda draw, c: draw(st.integers(0, max(0, int(r.mean_gap_ms[c] * factor))))


def plain(r: Ranges, policy: Policy, n: int) -> st.SearchStrategy[list[Draw]]:
    """Arrivals at about the declared rates, lengths anywhere in the declared ranges."""
    return _trace(n, _any_class(r), _gap_up_to(r, 2), _within(r.prompt), _within(r.output))


def long_prefill_bursts(r: Ranges, policy: Policy, n: int) -> st.SearchStrategy[list[Draw]]:
    """Bursts of the longest prompts the workload allows, arriving together."""
    return _trace(n, _any_class(r), lambda draw, c: draw(st.sampled_from([0, 0, 0, 1])),
                  lambda draw, c: draw(st.integers(max(r.prompt[c][0], r.prompt[c][1] * 3 // 4), r.prompt[c][1])),
                  _within(r.output))


def max_outputs(r: Ranges, policy: Policy, n: int) -> st.SearchStrategy[list[Draw]]:
    """Outputs lengthened to the limit."""
    return _trace(n, _any_class(r), _gap_up_to(r, 1), _within(r.prompt), lambda draw, c: r.output[c][1])


def tenant_skew(r: Ranges, policy: Policy, n: int) -> st.SearchStrategy[list[Draw]]:
    """Almost all requests from one tenant's classes, fast."""
    tenants = sorted(set(r.tenants))

    @st.composite
    def skewed(draw: st.DrawFn) -> list[Draw]:
        tenant = draw(st.sampled_from(tenants))
        mine = [c for c, t in enumerate(r.tenants) if t == tenant] or [0]
        return draw(_trace(n, lambda d: d(st.sampled_from(mine)), _gap_up_to(r, 0.25), _within(r.prompt),
                           _within(r.output)))
    return skewed()


def late_cancellations(r: Ranges, policy: Policy, n: int) -> st.SearchStrategy[list[Draw]]:
    """Cancels mid-prefill or just before completion (about one iteration per output token)."""
    return _trace(n, _any_class(r), _gap_up_to(r, 1), _within(r.prompt), _within(r.output),
                  lambda draw, c: draw(st.one_of(st.integers(0, 50),
                                                 st.integers(r.output[c][0] * 10, r.output[c][1] * 20))))


def kv_fragmentation(r: Ranges, policy: Policy, n: int) -> st.SearchStrategy[list[Draw]]:
    """Mixed lengths that leave partial blocks: prompts one token past a block boundary."""
    size = policy.kv.block_size

    def prompt(draw: st.DrawFn, c: int) -> int:
        lo, hi = r.prompt[c]
        blocks = draw(st.integers(max(0, (lo - 1) // size), max(0, (hi - 1) // size)))
        return min(hi, max(lo, blocks * size + 1))
    return _trace(n, _any_class(r), _gap_up_to(r, 1), prompt, _within(r.output))


def saturate_prefill(r: Ranges, policy: Policy, n: int) -> st.SearchStrategy[list[Draw]]:
    """All prefill: the longest prompts with the shortest outputs."""
    return _trace(n, _any_class(r), _gap_up_to(r, 0.5), lambda draw, c: r.prompt[c][1], lambda draw, c: r.output[c][0])


def saturate_decode(r: Ranges, policy: Policy, n: int) -> st.SearchStrategy[list[Draw]]:
    """All decode: the shortest prompts with the longest outputs."""
    return _trace(n, _any_class(r), _gap_up_to(r, 0.5), lambda draw, c: r.prompt[c][0], lambda draw, c: r.output[c][1])


def exhaust_slots(r: Ranges, policy: Policy, n: int) -> st.SearchStrategy[list[Draw]]:
    """Many short requests at once, to fill every running slot."""
    return _trace(max(n, policy.batch.max_num_seqs + 1), _any_class(r), lambda draw, c: 0,
                  lambda draw, c: r.prompt[c][0], _within(r.output))


def _upper_half(bounds: list[tuple[int, int]]) -> FieldDraw:
    return lambda draw, c: draw(st.integers(max(bounds[c][0], bounds[c][1] // 2), bounds[c][1]))


def priority_stream(r: Ranges, policy: Policy, n: int) -> st.SearchStrategy[list[Draw]]:
    """A sustained stream of the most urgent class, heavy (lengths in the upper half of its ranges, so it
    holds the server), with a few requests of the others mixed in."""
    sign = 1 if policy.queue.priority_polarity.value == "lower_first" else -1
    urgent = min(range(len(r.priorities)), key=lambda c: sign * r.priorities[c])
    others = list(range(len(r.prompt)))

    def pick(draw: st.DrawFn) -> int:
        return urgent if draw(st.integers(0, 4)) < 4 else draw(st.sampled_from(others))
    return _trace(n, pick, lambda draw, c: draw(st.integers(0, max(1, r.mean_gap_ms[urgent] // 2))),
                  _upper_half(r.prompt), _upper_half(r.output))


STRESSES: dict[str, Stress] = {f.__name__: f for f in (
    plain, long_prefill_bursts, max_outputs, tenant_skew, late_cancellations, kv_fragmentation,
    saturate_prefill, saturate_decode, exhaust_slots, priority_stream)}


def adversarial(w: Workload, policy: Policy, max_requests: int = 20,
                stresses: list[str] | None = None) -> st.SearchStrategy[list[Draw]]:
    """Up to three stress segments one after the other (each at most ``max_requests`` requests)."""
    r = ranges(w)
    chosen = [STRESSES[name] for name in (stresses or list(STRESSES))]
    segment = st.one_of(*(s(r, policy, max_requests) for s in chosen))
    return st.lists(segment, min_size=1, max_size=3).map(lambda parts: [d for part in parts for d in part][: 3 * max_requests])


def to_requests(draws: list[Draw], w: Workload, source: str = "fuzz") -> RequestSet:
    """The drawn trace as engine input (request numbers in arrival order)."""
    r = ranges(w)
    specs, t = [], 0
    for rid, d in enumerate(draws):
        t += d.gap_ms
        c = w.classes[d.cls]
        arrival = t * 1000
        specs.append(RequestSpec(rid=rid, arrival_us=arrival, prompt_len=d.prompt, output_len=d.output,
                                 max_output=max(c.max_output, d.output), priority=c.priority, tenant=r.tenants[d.cls],
                                 cls=d.cls, cancel_us=None if d.cancel_after_ms is None else arrival + d.cancel_after_ms * 1000))
    return RequestSet(specs, [c.name for c in w.classes], w.tenants, source)
