"""Adversarial arrival sequences for a workload, as Hypothesis strategies.

A drawn trace is a list of requests ``Draw(gap_ms, cls, prompt, output, cancel_after_ms)`` whose
classes, length ranges and priorities come from a workload spec. One named strategy per stress; they
compose (``adversarial`` concatenates a few stress segments), shrink well (a list of one small byte record
per request: the shrinker deletes requests and lowers each field toward its simplest value), and are usable
in a user's own tests::

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


Stress = Callable[[Ranges, Policy, int, int], st.SearchStrategy[list[Draw]]]  # (ranges, policy, max, min requests)
Decode = Callable[[bytes], Draw]

# How a request is drawn: one fixed-width byte record per request (one Hypothesis choice, not one per
# field), decoded into the stress's fields. Hypothesis's per-choice bookkeeping, not the random numbers,
# is what generation costs, so a 20-request trace costs 20 records (and the list's 20 "one more?"
# choices) instead of 80-100 integer draws. Shrinking keeps working per request and per field: the list
# deletes whole records; the bytes shrinker lowers each byte toward 0, and every field is a monotone
# function of its bytes whose 0 is the field's simplest value (the class listed first, gap 0, the shortest
# lengths, the earliest cancel).
CLS, GAP, PROMPT, OUTPUT, CANCEL = 0, 1, 3, 5, 7  # byte offsets: class 1 byte, the others 2 bytes each


def _scaled(v: int, bits: int, lo: int, hi: int) -> int:
    """v (0 .. 2**bits - 1) onto lo .. hi, monotone, 0 -> lo; about 1/32 of the values land on each bound,
    so the extremes (the longest prompt, a gap of 0) come up often, as with Hypothesis's own integers."""
    if hi <= lo:
        return lo
    span = hi - lo + 1
    edge = span // 32 + 1
    x = ((v * (span + 2 * edge)) >> bits) - edge
    return lo + (0 if x < 0 else span - 1 if x >= span else x)


def _u16(b: bytes, at: int) -> int:
    return (b[at] << 8) | b[at + 1]


def _pick(b: bytes, at: int, n: int) -> int:
    """One of n choices from one byte (0 -> the first)."""
    return (b[at] * n) >> 8


def _records(width: int, min_size: int, max_size: int, decode: Decode) -> st.SearchStrategy[list[Draw]]:
    record = st.binary(min_size=width, max_size=width)
    return st.lists(record, min_size=min_size, max_size=max(min_size, max_size)).map(
        lambda recs: [decode(b) for b in recs])


def _field(b: bytes, at: int, bounds: tuple[int, int]) -> int:
    return _scaled(_u16(b, at), 16, bounds[0], bounds[1])


def _simple(r: Ranges, n: int, min_size: int, gap_factor: float, prompt: Callable[[bytes, int], int],
            output: Callable[[bytes, int], int], width: int = CANCEL) -> st.SearchStrategy[list[Draw]]:
    """Any class; gap up to gap_factor times the class's mean gap; prompt and output by the functions."""
    classes = len(r.prompt)
    gaps = [max(0, int(m * gap_factor)) for m in r.mean_gap_ms]

    def decode(b: bytes) -> Draw:
        c = _pick(b, CLS, classes)
        return Draw(_scaled(_u16(b, GAP), 16, 0, gaps[c]), c, prompt(b, c), output(b, c))
    return _records(width, min_size, n, decode)


def _within(bounds: list[tuple[int, int]], at: int) -> Callable[[bytes, int], int]:
    return lambda b, c: _field(b, at, bounds[c])


def _fixed(values: list[int]) -> Callable[[bytes, int], int]:
    return lambda b, c: values[c]


def plain(r: Ranges, policy: Policy, n: int, min_size: int = 1) -> st.SearchStrategy[list[Draw]]:
    """Arrivals at about the declared rates, lengths anywhere in the declared ranges."""
    return _simple(r, n, min_size, 2, _within(r.prompt, PROMPT), _within(r.output, OUTPUT))


def long_prefill_bursts(r: Ranges, policy: Policy, n: int, min_size: int = 1) -> st.SearchStrategy[list[Draw]]:
    """Bursts of the longest prompts the workload allows, arriving together (gap 0, now and then 1 ms)."""
    classes = len(r.prompt)
    long = [(max(lo, hi * 3 // 4), hi) for lo, hi in r.prompt]

    def decode(b: bytes) -> Draw:
        c = _pick(b, CLS, classes)
        return Draw(int(b[GAP] >= 192), c, _field(b, PROMPT, long[c]), _field(b, OUTPUT, r.output[c]))
    return _records(CANCEL, min_size, n, decode)


def max_outputs(r: Ranges, policy: Policy, n: int, min_size: int = 1) -> st.SearchStrategy[list[Draw]]:
    """Outputs lengthened to the limit."""
    return _simple(r, n, min_size, 1, _within(r.prompt, PROMPT), _fixed([hi for _, hi in r.output]), OUTPUT)


def tenant_skew(r: Ranges, policy: Policy, n: int, min_size: int = 1) -> st.SearchStrategy[list[Draw]]:
    """Almost all requests from one tenant's classes, fast."""
    gaps = [max(0, int(m * 0.25)) for m in r.mean_gap_ms]

    def segment(tenant: int) -> st.SearchStrategy[list[Draw]]:
        mine = [c for c, t in enumerate(r.tenants) if t == tenant] or [0]

        def decode(b: bytes) -> Draw:
            c = mine[_pick(b, CLS, len(mine))]
            return Draw(_scaled(_u16(b, GAP), 16, 0, gaps[c]), c, _field(b, PROMPT, r.prompt[c]),
                        _field(b, OUTPUT, r.output[c]))
        return _records(CANCEL, min_size, n, decode)
    return st.one_of(*(segment(t) for t in sorted(set(r.tenants))))


def late_cancellations(r: Ranges, policy: Policy, n: int, min_size: int = 1) -> st.SearchStrategy[list[Draw]]:
    """Cancels mid-prefill (within 50 ms) or just before completion (about one iteration per output token:
    10-20 ms per token of the class's output range)."""
    classes = len(r.prompt)
    late = [(lo * 10, hi * 20) for lo, hi in r.output]

    def decode(b: bytes) -> Draw:
        c = _pick(b, CLS, classes)
        v = _u16(b, CANCEL)
        cancel = _scaled(v, 15, 0, 50) if v < 0x8000 else _scaled(v - 0x8000, 15, *late[c])
        return Draw(_scaled(_u16(b, GAP), 16, 0, r.mean_gap_ms[c]), c, _field(b, PROMPT, r.prompt[c]),
                    _field(b, OUTPUT, r.output[c]), cancel)
    return _records(CANCEL + 2, min_size, n, decode)


def kv_fragmentation(r: Ranges, policy: Policy, n: int, min_size: int = 1) -> st.SearchStrategy[list[Draw]]:
    """Mixed lengths that leave partial blocks: prompts one token past a block boundary."""
    size = policy.kv.block_size
    blocks = [(max(0, (lo - 1) // size), max(0, (hi - 1) // size)) for lo, hi in r.prompt]

    def prompt(b: bytes, c: int) -> int:
        lo, hi = r.prompt[c]
        return min(hi, max(lo, _field(b, PROMPT, blocks[c]) * size + 1))
    return _simple(r, n, min_size, 1, prompt, _within(r.output, OUTPUT))


def saturate_prefill(r: Ranges, policy: Policy, n: int, min_size: int = 1) -> st.SearchStrategy[list[Draw]]:
    """All prefill: the longest prompts with the shortest outputs."""
    return _simple(r, n, min_size, 0.5, _fixed([hi for _, hi in r.prompt]), _fixed([lo for lo, _ in r.output]), PROMPT)


def saturate_decode(r: Ranges, policy: Policy, n: int, min_size: int = 1) -> st.SearchStrategy[list[Draw]]:
    """All decode: the shortest prompts with the longest outputs."""
    return _simple(r, n, min_size, 0.5, _fixed([lo for lo, _ in r.prompt]), _fixed([hi for _, hi in r.output]), PROMPT)


def exhaust_slots(r: Ranges, policy: Policy, n: int, min_size: int = 1) -> st.SearchStrategy[list[Draw]]:
    """Many short requests at once, to fill every running slot."""
    classes = len(r.prompt)

    def decode(b: bytes) -> Draw:
        c = _pick(b, 0, classes)
        return Draw(0, c, r.prompt[c][0], _field(b, 1, r.output[c]))
    return _records(3, min_size, max(n, policy.batch.max_num_seqs + 1), decode)


def priority_stream(r: Ranges, policy: Policy, n: int, min_size: int = 1) -> st.SearchStrategy[list[Draw]]:
    """A sustained stream of the most urgent class, heavy (lengths in the upper half of its ranges, so it
    holds the server), with a few requests of the others mixed in (about one in five)."""
    sign = 1 if policy.queue.priority_polarity.value == "lower_first" else -1
    classes = len(r.prompt)
    urgent = min(range(classes), key=lambda c: sign * r.priorities[c])
    gap = max(1, r.mean_gap_ms[urgent] // 2)
    prompt = [(max(lo, hi // 2), hi) for lo, hi in r.prompt]
    output = [(max(lo, hi // 2), hi) for lo, hi in r.output]

    def decode(b: bytes) -> Draw:
        k = b[CLS]
        c = urgent if k < 205 else ((k - 205) * classes) // 51
        return Draw(_scaled(_u16(b, GAP), 16, 0, gap), c, _field(b, PROMPT, prompt[c]), _field(b, OUTPUT, output[c]))
    return _records(CANCEL, min_size, n, decode)


STRESSES: dict[str, Stress] = {f.__name__: f for f in (
    plain, long_prefill_bursts, max_outputs, tenant_skew, late_cancellations, kv_fragmentation,
    saturate_prefill, saturate_decode, exhaust_slots, priority_stream)}


def adversarial(w: Workload, policy: Policy, max_requests: int = 20, stresses: list[str] | None = None,
                min_requests: int = 1, max_segments: int = 3) -> st.SearchStrategy[list[Draw]]:
    """One to ``max_segments`` stress segments one after the other, each of at most ``max_requests``
    requests (the trace at most ``max_segments * max_requests``); the first segment has at least
    ``min_requests`` (bench/fuzz_speed.py measures 20-request traces with min = max = 20, one segment)."""
    r = ranges(w)
    chosen = [STRESSES[name] for name in (stresses or list(STRESSES))]
    cap = max_segments * max(max_requests, min_requests)

    def segment(low: int) -> st.SearchStrategy[list[Draw]]:
        return st.one_of(*(s(r, policy, max_requests, low) for s in chosen))
    if min_requests <= 1:
        return st.lists(segment(1), min_size=1, max_size=max_segments).map(
            lambda parts: [d for part in parts for d in part][:cap])
    if max_segments <= 1:
        return segment(min_requests).map(lambda part: part[:cap])
    return st.tuples(segment(min_requests), st.lists(segment(1), max_size=max_segments - 1)).map(
        lambda parts: (parts[0] + [d for part in parts[1] for d in part])[:cap])


def request_maker(w: Workload) -> Callable[[list[Draw], str], RequestSet]:
    """``to_requests`` for one workload with its per-class fields looked up once (the fuzzer converts
    every example; ``ranges`` alone costs about as much as converting 20 requests)."""
    tenants = ranges(w).tenants
    fields = [(c.priority, tenants[i], c.max_output) for i, c in enumerate(w.classes)]
    class_names, tenant_names = [c.name for c in w.classes], w.tenants

    def make(draws: list[Draw], source: str = "fuzz") -> RequestSet:
        specs, t = [], 0
        for rid, d in enumerate(draws):
            t += d.gap_ms
            priority, tenant, max_output = fields[d.cls]
            arrival = t * 1000
            specs.append(RequestSpec(rid, arrival, d.prompt, d.output, max(max_output, d.output), priority, tenant,
                                     d.cls, None if d.cancel_after_ms is None else arrival + d.cancel_after_ms * 1000))
        return RequestSet(specs, class_names, tenant_names, source)
    return make


def to_requests(draws: list[Draw], w: Workload, source: str = "fuzz") -> RequestSet:
    """The drawn trace as engine input (request numbers in arrival order)."""
    return request_maker(w)(draws, source)
