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

import dataclasses
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

from hypothesis import strategies as st

from checker.policy import Policy
from checker.requests import RequestSpec
from checker.traces import RequestSet
from checker.workload import TokenNames, Workload


class Draw(NamedTuple):
    """One request of a drawn trace (a NamedTuple: the fuzzer builds one per request of every example)."""

    gap_ms: int  # time since the previous request of the trace
    cls: int  # class index in the workload
    prompt: int
    output: int
    cancel_after_ms: int | None = None
    external_tokens: int = 0  # with a KV connector: the prompt prefix an external tier holds
    load_steps: int | None = 1  # steps its load takes (None: it is never reported)
    load_fails: bool = False  # with a KV connector: its load is reported failed (policy.connector.load_failure)
    grammar_steps: int = 0  # blocked waiting states: steps its structured-output grammar compiles after arrival


@dataclass(frozen=True)
class Ranges:
    """What the workload allows, per class: (low, high) prompt and output tokens, and the mean gap."""

    prompt: list[tuple[int, int]]
    output: list[tuple[int, int]]
    mean_gap_ms: list[int]
    tenants: list[int]
    priorities: list[int]
    structured: list[bool] = ()  # per class: it has a structured_output section (blocked_grammars draws there)


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
                  [tenant_index[c.tenant] for c in w.classes], [c.priority for c in w.classes],
                  [c.structured_output is not None for c in w.classes])


Stress = Callable[..., st.SearchStrategy[list[Draw]]]  # (ranges, policy, n, min_size=1, cap=None)
Decode = Callable[[bytes], Draw]
Scale = Callable[[int], int]

# How a request is drawn: one fixed-width byte record per request (one Hypothesis choice, not one per
# field), decoded into the stress's fields. Hypothesis's per-choice bookkeeping, not the random numbers,
# is what generation costs, so a 20-request trace costs 20 records (and the list's 20 "one more?"
# choices) instead of 80-100 integer draws. Shrinking keeps working per request and per field: the list
# deletes whole records; the bytes shrinker lowers each byte toward 0, and every field is a monotone
# function of its bytes whose 0 is the field's simplest value (the class listed first, gap 0, the shortest
# lengths, the earliest cancel). Layout: class 1 byte, then gap, prompt, output, cancel 2 bytes each
# (big-endian), as far as the stress uses them.
CLS, GAP, PROMPT, OUTPUT, CANCEL = 0, 1, 3, 5, 7  # byte offsets


def _scale(lo: int, hi: int, bits: int = 16) -> Scale:
    """v (0 .. 2**bits - 1) onto lo .. hi, monotone, 0 -> lo; about 1/32 of the values land on each bound,
    so the extremes (the longest prompt, a gap of 0) come up often, as with Hypothesis's own integers."""
    if hi <= lo:
        return lambda v: lo
    span = hi - lo + 1
    edge = span // 32 + 1
    mult, low, top = span + 2 * edge, lo - edge, hi

    def scaled(v: int) -> int:
        x = ((v * mult) >> bits) + low
        return lo if x < lo else top if x > top else x
    return scaled


def _records(width: int, min_size: int, max_size: int, cap: int | None, decode: Decode
             ) -> st.SearchStrategy[list[Draw]]:
    """A list of ``width``-byte records, decoded; at most ``cap`` records are drawn (a trace keeps no more)."""
    if cap is not None:
        max_size = min(max_size, cap)
    return st.lists(st.binary(min_size=width, max_size=width), min_size=min_size,
                    max_size=max(min_size, max_size)).map(lambda recs: list(map(decode, recs)))


def _per_class(bounds: list[tuple[int, int]]) -> list[Scale]:
    return [_scale(lo, hi) for lo, hi in bounds]


def _simple(r: Ranges, n: int, min_size: int, cap: int | None, gap_factor: float, prompt: list[Scale] | list[int],
            output: list[Scale] | list[int]) -> st.SearchStrategy[list[Draw]]:
    """Any class; gap up to gap_factor times the class's mean gap; prompt and output per class: scaled from
    the record, or fixed (a list of ints); the record holds only the fields that are drawn."""
    classes = len(r.prompt)
    gaps = _per_class([(0, max(0, int(m * gap_factor))) for m in r.mean_gap_ms])
    if callable(prompt[0]) and callable(output[0]):
        def decode(b: bytes) -> Draw:
            c = (b[0] * classes) >> 8
            return Draw(gaps[c]((b[1] << 8) | b[2]), c, prompt[c]((b[3] << 8) | b[4]), output[c]((b[5] << 8) | b[6]))
        return _records(CANCEL, min_size, n, cap, decode)
    if callable(prompt[0]):
        def decode_prompt(b: bytes) -> Draw:
            c = (b[0] * classes) >> 8
            return Draw(gaps[c]((b[1] << 8) | b[2]), c, prompt[c]((b[3] << 8) | b[4]), output[c])
        return _records(OUTPUT, min_size, n, cap, decode_prompt)
    assert not callable(output[0])

    def decode_fixed(b: bytes) -> Draw:
        c = (b[0] * classes) >> 8
        return Draw(gaps[c]((b[1] << 8) | b[2]), c, prompt[c], output[c])
    return _records(PROMPT, min_size, n, cap, decode_fixed)


def plain(r: Ranges, policy: Policy, n: int, min_size: int = 1, cap: int | None = None) -> st.SearchStrategy[list[Draw]]:
    """Arrivals at about the declared rates, lengths anywhere in the declared ranges."""
    return _simple(r, n, min_size, cap, 2, _per_class(r.prompt), _per_class(r.output))


def long_prefill_bursts(r: Ranges, policy: Policy, n: int, min_size: int = 1, cap: int | None = None
                        ) -> st.SearchStrategy[list[Draw]]:
    """Bursts of the longest prompts the workload allows, arriving together (gap 0, now and then 1 ms)."""
    classes = len(r.prompt)
    prompt = _per_class([(max(lo, hi * 3 // 4), hi) for lo, hi in r.prompt])
    output = _per_class(r.output)

    def decode(b: bytes) -> Draw:
        c = (b[0] * classes) >> 8
        return Draw(int(b[1] >= 192), c, prompt[c]((b[3] << 8) | b[4]), output[c]((b[5] << 8) | b[6]))
    return _records(CANCEL, min_size, n, cap, decode)


def max_outputs(r: Ranges, policy: Policy, n: int, min_size: int = 1, cap: int | None = None
                ) -> st.SearchStrategy[list[Draw]]:
    """Outputs lengthened to the limit."""
    return _simple(r, n, min_size, cap, 1, _per_class(r.prompt), [hi for _, hi in r.output])


def tenant_skew(r: Ranges, policy: Policy, n: int, min_size: int = 1, cap: int | None = None
                ) -> st.SearchStrategy[list[Draw]]:
    """Almost all requests from one tenant's classes, fast."""
    gaps = _per_class([(0, max(0, int(m * 0.25))) for m in r.mean_gap_ms])
    prompt, output = _per_class(r.prompt), _per_class(r.output)

    def segment(tenant: int) -> st.SearchStrategy[list[Draw]]:
        mine = [c for c, t in enumerate(r.tenants) if t == tenant] or [0]
        count = len(mine)

        def decode(b: bytes) -> Draw:
            c = mine[(b[0] * count) >> 8]
            return Draw(gaps[c]((b[1] << 8) | b[2]), c, prompt[c]((b[3] << 8) | b[4]), output[c]((b[5] << 8) | b[6]))
        return _records(CANCEL, min_size, n, cap, decode)
    return st.one_of(*(segment(t) for t in sorted(set(r.tenants))))


def late_cancellations(r: Ranges, policy: Policy, n: int, min_size: int = 1, cap: int | None = None
                       ) -> st.SearchStrategy[list[Draw]]:
    """Cancels mid-prefill (within 50 ms) or just before completion (about one iteration per output token:
    10-20 ms per token of the class's output range): the cancel field's top bit picks which."""
    classes = len(r.prompt)
    gaps, prompt, output = _per_class([(0, m) for m in r.mean_gap_ms]), _per_class(r.prompt), _per_class(r.output)
    early = _scale(0, 50, 15)
    late = [_scale(lo * 10, hi * 20, 15) for lo, hi in r.output]

    def decode(b: bytes) -> Draw:
        c = (b[0] * classes) >> 8
        v = (b[7] << 8) | b[8]
        return Draw(gaps[c]((b[1] << 8) | b[2]), c, prompt[c]((b[3] << 8) | b[4]), output[c]((b[5] << 8) | b[6]),
                    early(v) if v < 0x8000 else late[c](v - 0x8000))
    return _records(CANCEL + 2, min_size, n, cap, decode)


def kv_fragmentation(r: Ranges, policy: Policy, n: int, min_size: int = 1, cap: int | None = None
                     ) -> st.SearchStrategy[list[Draw]]:
    """Mixed lengths that leave partial blocks: prompts one token past a block boundary."""
    size = policy.kv.block_size

    def one_past(lo: int, hi: int) -> Scale:
        blocks = _scale(max(0, (lo - 1) // size), max(0, (hi - 1) // size))
        return lambda v: min(hi, max(lo, blocks(v) * size + 1))
    return _simple(r, n, min_size, cap, 1, [one_past(lo, hi) for lo, hi in r.prompt], _per_class(r.output))


def saturate_prefill(r: Ranges, policy: Policy, n: int, min_size: int = 1, cap: int | None = None
                     ) -> st.SearchStrategy[list[Draw]]:
    """All prefill: the longest prompts with the shortest outputs."""
    return _simple(r, n, min_size, cap, 0.5, [hi for _, hi in r.prompt], [lo for lo, _ in r.output])


def saturate_decode(r: Ranges, policy: Policy, n: int, min_size: int = 1, cap: int | None = None
                    ) -> st.SearchStrategy[list[Draw]]:
    """All decode: the shortest prompts with the longest outputs."""
    return _simple(r, n, min_size, cap, 0.5, [lo for lo, _ in r.prompt], [hi for _, hi in r.output])


def exhaust_slots(r: Ranges, policy: Policy, n: int, min_size: int = 1, cap: int | None = None
                  ) -> st.SearchStrategy[list[Draw]]:
    """Many short requests at once, to fill every running slot (up to max_num_seqs + 1 of them)."""
    classes = len(r.prompt)
    output = _per_class(r.output)

    def decode(b: bytes) -> Draw:
        c = (b[0] * classes) >> 8
        return Draw(0, c, r.prompt[c][0], output[c]((b[1] << 8) | b[2]))
    return _records(3, min_size, max(n, policy.batch.max_num_seqs + 1), cap, decode)


def priority_stream(r: Ranges, policy: Policy, n: int, min_size: int = 1, cap: int | None = None
                    ) -> st.SearchStrategy[list[Draw]]:
    """A sustained stream of the most urgent class, heavy (lengths in the upper half of its ranges, so it
    holds the server), with a few requests of the others mixed in (about one in five)."""
    sign = 1 if policy.queue.priority_polarity.value == "lower_first" else -1
    classes = len(r.prompt)
    urgent = min(range(classes), key=lambda c: sign * r.priorities[c])
    gap = _scale(0, max(1, r.mean_gap_ms[urgent] // 2))
    prompt = _per_class([(max(lo, hi // 2), hi) for lo, hi in r.prompt])
    output = _per_class([(max(lo, hi // 2), hi) for lo, hi in r.output])

    def decode(b: bytes) -> Draw:
        k = b[0]
        c = urgent if k < 205 else ((k - 205) * classes) // 51
        return Draw(gap((b[1] << 8) | b[2]), c, prompt[c]((b[3] << 8) | b[4]), output[c]((b[5] << 8) | b[6]))
    return _records(CANCEL, min_size, n, cap, decode)


def _transfer_fields(r: Ranges, policy: Policy, b: bytes, at: int) -> tuple[int, int, Scale]:
    """Record bytes at ``at``: the share of the prompt held externally (3/4 to all of it) and the load's
    latency: 1 .. 2 * max_load_steps, the top value a load that is never reported (0: the simplest, one step)."""
    top = 2 * policy.connector.max_load_steps
    steps = _scale(1, top + 1, 8)(b[at + 1])
    return b[at], steps, _scale(0, 0)


def _with_load(d: Draw, share: int, steps: int, top: int) -> Draw:
    held = d.prompt - (d.prompt * (255 - share)) // 1020  # 3/4 of the prompt (share 0xff) .. all of it (share 0)
    return d._replace(external_tokens=max(1, held), load_steps=None if steps > top else steps)


def slow_or_lost_transfers(r: Ranges, policy: Policy, n: int, min_size: int = 1, cap: int | None = None
                           ) -> st.SearchStrategy[list[Draw]]:
    """Every request with an external hit (most of its prompt) whose load takes up to twice the policy's
    longest transfer, or is never reported; arrivals close together, so loads pile up on the pool."""
    return _close_loads(r, policy, n, min_size, cap, fails=False)


def _close_loads(r: Ranges, policy: Policy, n: int, min_size: int, cap: int | None, fails: bool
                 ) -> st.SearchStrategy[list[Draw]]:
    """slow_or_lost_transfers' requests; with ``fails`` one more byte per record: the load fails below 128."""
    classes = len(r.prompt)
    gaps, prompt, output = _per_class([(0, max(1, m // 2)) for m in r.mean_gap_ms]), _per_class(r.prompt), _per_class(r.output)
    top = 2 * policy.connector.max_load_steps

    def decode(b: bytes) -> Draw:
        c = (b[0] * classes) >> 8
        d = Draw(gaps[c]((b[1] << 8) | b[2]), c, prompt[c]((b[3] << 8) | b[4]), output[c]((b[5] << 8) | b[6]))
        share, steps, _ = _transfer_fields(r, policy, b, CANCEL)
        d = _with_load(d, share, steps, top)
        return d._replace(load_fails=b[CANCEL + 2] < 128) if fails else d
    return _records(CANCEL + 2 + fails, min_size, n, cap, decode)


def abort_during_load(r: Ranges, policy: Policy, n: int, min_size: int = 1, cap: int | None = None
                      ) -> st.SearchStrategy[list[Draw]]:
    """Requests with an external hit and a slow or lost load, cancelled within 50 ms of arriving (while the
    load is in flight, before or after it is reported)."""
    classes = len(r.prompt)
    gaps, prompt, output = _per_class([(0, m) for m in r.mean_gap_ms]), _per_class(r.prompt), _per_class(r.output)
    top = 2 * policy.connector.max_load_steps
    early = _scale(0, 50, 8)

    def decode(b: bytes) -> Draw:
        c = (b[0] * classes) >> 8
        d = Draw(gaps[c]((b[1] << 8) | b[2]), c, prompt[c]((b[3] << 8) | b[4]), output[c]((b[5] << 8) | b[6]),
                 early(b[CANCEL + 2]))
        share, steps, _ = _transfer_fields(r, policy, b, CANCEL)
        return _with_load(d, share, steps, top)
    return _records(CANCEL + 3, min_size, n, cap, decode)


def failed_loads(r: Ranges, policy: Policy, n: int, min_size: int = 1, cap: int | None = None
                 ) -> st.SearchStrategy[list[Draw]]:
    """Requests with an external hit whose load takes 1 .. 2 * max_load_steps steps (or is never reported), about
    half of them failing at their report (load_fails; byte 0 of the flag: fails, the simplest); arrivals close
    together, so failed loads' requests (recompute) or their freed blocks (fail) meet a loaded pool."""
    return _close_loads(r, policy, n, min_size, cap, fails=True)


GRAMMAR_STEPS = 32  # the longest grammar compilation blocked_grammars draws


def blocked_grammars(r: Ranges, policy: Policy, n: int, min_size: int = 1, cap: int | None = None
                     ) -> st.SearchStrategy[list[Draw]]:
    """Structured-output requests whose grammar compiles 1 .. GRAMMAR_STEPS steps after arrival (byte 0: one
    step), about three in four of them, between plain ones, at the workload's arrival rates; only requests of the
    classes with a structured_output section get one when the workload has such classes. A blocked request reaches
    the head of the queue with others behind it."""
    classes = len(r.prompt)
    gaps, prompt, output = _per_class([(0, m) for m in r.mean_gap_ms]), _per_class(r.prompt), _per_class(r.output)
    steps = _scale(1, GRAMMAR_STEPS, 8)
    structured = list(r.structured) if any(r.structured) else [True] * classes

    def decode(b: bytes) -> Draw:
        c = (b[0] * classes) >> 8
        d = Draw(gaps[c]((b[1] << 8) | b[2]), c, prompt[c]((b[3] << 8) | b[4]), output[c]((b[5] << 8) | b[6]))
        return d if b[CANCEL + 1] >= 192 or not structured[c] else d._replace(grammar_steps=steps(b[CANCEL]))
    return _records(CANCEL + 2, min_size, n, cap, decode)


STRESSES: dict[str, Stress] = {f.__name__: f for f in (
    plain, long_prefill_bursts, max_outputs, tenant_skew, late_cancellations, kv_fragmentation,
    saturate_prefill, saturate_decode, exhaust_slots, priority_stream, slow_or_lost_transfers, abort_during_load,
    failed_loads, blocked_grammars)}
# Stresses that only mean something under a loading KV connector (policy.connector): drawn by default only there,
# so the default search of every other policy stays as it was.
CONNECTOR_STRESSES = ("slow_or_lost_transfers", "abort_during_load", "failed_loads")
# Drawn by default only where the policy lets the environment choose them: failed loads (connector.loads_may_fail),
# blocked waiting states (queue.blocked_waiting skip or stop).
CHOSEN_STRESSES = {"failed_loads": lambda p: p.connector.loads_may_fail,
                   "blocked_grammars": lambda p: p.queue.blocked_waiting != "off"}


def default_stresses(policy: Policy) -> list[str]:
    return [name for name in STRESSES if (policy.connector.loads or name not in CONNECTOR_STRESSES)
            and CHOSEN_STRESSES.get(name, lambda p: True)(policy)]


def adversarial(w: Workload, policy: Policy, max_requests: int = 20, stresses: list[str] | None = None,
                min_requests: int = 1, max_segments: int = 3) -> st.SearchStrategy[list[Draw]]:
    """One to ``max_segments`` stress segments one after the other, each of at most ``max_requests``
    requests (the trace at most ``max_segments * max_requests``); the first segment has at least
    ``min_requests`` (bench/fuzz_speed.py measures 20-request traces with min = max = 20, one segment)."""
    r = ranges(w)
    chosen = [STRESSES[name] for name in (stresses or default_stresses(policy))]
    cap = max_segments * max(max_requests, min_requests)

    def segment(low: int) -> st.SearchStrategy[list[Draw]]:
        return st.one_of(*(s(r, policy, max_requests, low, cap) for s in chosen))
    if min_requests <= 1:
        return st.lists(segment(1), min_size=1, max_size=max_segments).map(
            lambda parts: [d for part in parts for d in part][:cap])
    if max_segments <= 1:
        return segment(min_requests)
    return st.tuples(segment(min_requests), st.lists(segment(1), max_size=max_segments - 1)).map(
        lambda parts: (parts[0] + [d for part in parts[1] for d in part])[:cap])


def request_maker(w: Workload) -> Callable[[list[Draw], str], RequestSet]:
    """``to_requests`` for one workload with its per-class fields looked up once (the fuzzer converts
    every example; ``ranges`` alone costs about as much as converting 20 requests)."""
    tenants = ranges(w).tenants
    fields = [(c.priority, tenants[i], c.max_output) for i, c in enumerate(w.classes)]
    class_names, tenant_names = [c.name for c in w.classes], w.tenants
    prefixes = [c.shared_prefix for c in w.classes]
    accepts = [c.speculative_acceptance for c in w.classes]
    names = TokenNames()

    def make(draws: list[Draw], source: str = "fuzz") -> RequestSet:
        specs, t = [], 0
        for rid, d in enumerate(draws):
            t += d.gap_ms
            priority, tenant, max_output = fields[d.cls]
            arrival = t * 1000
            prompt, content = d.prompt, None
            shared = prefixes[d.cls]
            if shared is not None:  # the drawn prompt follows one of the class's system prompts, in turn by request
                content = (names.run(("system", d.cls, rid % shared.system_prompts), shared.tokens),
                           names.run(("own", rid), d.prompt))
                prompt += shared.tokens
            spec = RequestSpec(rid, arrival, prompt, d.output, max(max_output, d.output), priority, tenant,
                               d.cls, None if d.cancel_after_ms is None else arrival + d.cancel_after_ms * 1000,
                               content, min(d.external_tokens, prompt), d.load_steps,
                               **({} if not (d.load_fails or d.grammar_steps) else
                                  {"load_fails": d.load_fails, "grammar_steps": d.grammar_steps}))
            if accepts[d.cls] is not None:  # the verifier's choices: the class's acceptance, its own seeded stream
                rng = random.Random(f"{w.seed}/{d.cls}/{rid}/accept")
                spec = dataclasses.replace(spec, **accepts[d.cls].draw(rng, d.output))
            specs.append(spec)
        return RequestSet(specs, class_names, tenant_names, source)
    return make


def to_requests(draws: list[Draw], w: Workload, source: str = "fuzz") -> RequestSet:
    """The drawn trace as engine input (request numbers in arrival order)."""
    return request_maker(w)(draws, source)
