"""Per-request timing collected while the engine runs, and the summary by class and tenant."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING

from checker.semantics.decision import StepDecision
from checker.semantics.state import Reason, Request, Status

if TYPE_CHECKING:
    from checker.engine import SimResult

UNSET = -1


class RequestTimes:
    """Microsecond timestamps per request id (UNSET until they happen)."""

    __slots__ = ("first_scheduled", "first_token", "last_token", "done", "max_gap", "tokens_scheduled",
                 "first_hit", "hit_tokens")

    def __init__(self, n: int):
        self.first_scheduled = [UNSET] * n  # start of the first step that scheduled it
        self.first_token = [UNSET] * n  # end of the step that produced its first output token
        self.last_token = [UNSET] * n
        self.done = [UNSET] * n  # finished, rejected or cancelled
        self.max_gap = [0] * n  # longest time between two of its output tokens
        self.tokens_scheduled = [0] * n  # tokens computed for it, recompute included
        self.first_hit = [0] * n  # prompt tokens its first admission took from the prefix cache
        self.hit_tokens = [0] * n  # tokens all its admissions took from the prefix cache (prefill saved)

    def decoded(self, running: list[Request], k: int, first_end_us: int, longest_us: int, end_us: int) -> None:
        """k quiet decode steps of the running requests (a fast-forward stretch): the first ends at first_end_us,
        the last at end_us, the longest takes longest_us (what observe would record step by step)."""
        tokens, max_gap, last_token = self.tokens_scheduled, self.max_gap, self.last_token
        for r in running:
            rid = r.rid
            tokens[rid] += k
            gap = max(longest_us, first_end_us - last_token[rid])
            if gap > max_gap[rid]:
                max_gap[rid] = gap
            last_token[rid] = end_us

    def observe(self, d: StepDecision, reqs: list[Request], start_us: int, end_us: int) -> None:
        first_scheduled, tokens = self.first_scheduled, self.tokens_scheduled
        for rid, n in d.cache_hits:  # before first_scheduled is set: a hit at the first admission
            if first_scheduled[rid] == UNSET:
                self.first_hit[rid] = n
            self.hit_tokens[rid] += n
        for rid, n in d.scheduled:
            if first_scheduled[rid] == UNSET:
                first_scheduled[rid] = start_us
            tokens[rid] += n
        first_token, last_token, max_gap = self.first_token, self.last_token, self.max_gap
        for rid in d.produced:
            last = last_token[rid]
            if last == UNSET:
                first_token[rid] = end_us
            elif end_us - last > max_gap[rid]:
                max_gap[rid] = end_us - last
            last_token[rid] = end_us
        for rid in d.finished:
            self.done[rid] = end_us
        for rid, _ in d.rejected:
            self.done[rid] = start_us
        for rid in d.cancelled:
            self.done[rid] = start_us


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile: a value that occurred."""
    if not sorted_values:
        return math.nan
    rank = max(1, math.ceil(q * len(sorted_values)))
    return sorted_values[rank - 1]


def stats(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"n": 0, "mean": None, "p50": None, "p99": None, "max": None}
    v = sorted(values)
    return {"n": len(v), "mean": round(sum(v) / len(v), 3), "p50": round(percentile(v, 0.5), 3),
            "p99": round(percentile(v, 0.99), 3), "max": round(v[-1], 3)}


def _group(result: SimResult, members: list[Request]) -> dict:
    t = result.times
    ms = 1000.0
    queue, ttft, tpot, e2e, tbt = [], [], [], [], []
    rejected: dict[str, int] = {}
    finished = cancelled = unfinished = preemptions = recomputed = prompt = output = 0
    for r in members:
        rid = r.rid
        preemptions += r.num_preemptions
        prompt += r.prompt_len
        output += r.num_generated
        if t.first_scheduled[rid] != UNSET:
            queue.append((t.first_scheduled[rid] - r.arrival_us) / ms)
        if t.first_token[rid] != UNSET:
            ttft.append((t.first_token[rid] - r.arrival_us) / ms)
        if r.status is Status.FINISHED:
            finished += 1
            e2e.append((t.done[rid] - r.arrival_us) / ms)
            if r.num_generated > 1:
                tpot.append((t.done[rid] - t.first_token[rid]) / ms / (r.num_generated - 1))
                tbt.append(t.max_gap[rid] / ms)
            recomputed += t.tokens_scheduled[rid] - (r.prompt_len + r.num_generated - 1)
        elif r.status is Status.REJECTED:
            name = Reason(r.reason).name.lower()
            rejected[name] = rejected.get(name, 0) + 1
        elif r.status is Status.CANCELLED:
            cancelled += 1
        else:
            unfinished += 1
    group = {
        "requests": len(members), "finished": finished, "rejected": sum(rejected.values()),
        "rejected_by_reason": dict(sorted(rejected.items())), "cancelled": cancelled,
        "unfinished": unfinished, "prompt_tokens": prompt, "output_tokens": output,
        "preemptions": preemptions, "recomputed_tokens": recomputed,
        "queue_delay_ms": stats(queue), "ttft_ms": stats(ttft), "tpot_ms": stats(tpot),
        "e2e_ms": stats(e2e), "max_tbt_ms": stats(tbt),
    }
    if result.policy.kv.prefix_caching.enabled:
        group["prefix_cache"] = _cache_stats(t, members)
    return group


def _cache_stats(t: RequestTimes, members: list[Request]) -> dict:
    """Prefix-cache hits: of the requests admitted at least once, the share of their prompt tokens and of the
    requests themselves that the first admission found cached, and the prefill tokens every admission saved."""
    admitted = [r for r in members if t.first_scheduled[r.rid] != UNSET]
    prompt = sum(r.prompt_len for r in admitted)
    hit = sum(t.first_hit[r.rid] for r in admitted)
    with_hit = sum(1 for r in admitted if t.first_hit[r.rid])
    return {"admitted": len(admitted), "prompt_tokens": prompt, "hit_tokens": hit,
            "token_hit_rate": round(hit / prompt, 4) if prompt else None, "requests_with_hit": with_hit,
            "request_hit_rate": round(with_hit / len(admitted), 4) if admitted else None,
            "prefill_tokens_saved": sum(t.hit_tokens[r.rid] for r in members)}


def _engine(result: SimResult) -> dict:
    reqs, policy = result.state.requests, result.policy
    output_tokens = sum(r.num_generated for r in reqs)  # the overall group's output_tokens
    span_us = max(result.end_us - (reqs[0].arrival_us if reqs else 0), 1)
    return {
        "steps": result.steps, "request_steps": result.request_steps, "simulated_s": round(span_us / 1e6, 3),
        "busy_s": round(result.busy_us / 1e6, 3), "wall_s": round(result.wall_s, 3),
        "kv_peak_blocks": result.kv_peak_blocks, "kv_blocks": policy.kv.num_blocks,
        "kv_peak_pct": round(100.0 * result.kv_peak_blocks / policy.kv.num_blocks, 1),
        "running_peak": result.running_peak, "waiting_peak": result.waiting_peak,
        "idle_slot_steps": result.idle_slot_steps,
        "output_tokens_per_s": round(output_tokens / (span_us / 1e6), 1),
        "stuck_requests": len(result.stuck), "step_limit_hit": result.step_limit_hit,
        "livelock_suspected": result.livelock,
        **({} if result.state.spec is None else {"speculative": _speculative(result, output_tokens)}),
    }


def _speculative(result: SimResult, output_tokens: int) -> dict:
    """Speculative decoding's totals (only with it on): drafts verified and accepted, the acceptance rate, output
    tokens per row that verified drafts (1 + accepted), and output tokens per step that scheduled anything."""
    spec = result.state.spec
    rows = spec.steps_verified
    return {"drafts": spec.drafted, "accepted": spec.accepted_total,
            "acceptance_rate": round(spec.accepted_total / spec.drafted, 4) if spec.drafted else None,
            "tokens_per_verifying_row": round((rows + spec.accepted_total) / rows, 3) if rows else None,
            "output_tokens_per_step": round(output_tokens / result.steps, 3) if result.steps else None,
            # blocks in use at the peak counting the lookahead slots left unreserved (speculative.reserve_lookahead)
            "kv_peak_blocks_with_lookahead": max(result.kv_peak_blocks, spec.lookahead_peak)}


def summarize(result: SimResult) -> dict:
    reqs = result.state.requests
    rs = result.requests
    by_class = {name: _group(result, [r for r in reqs if r.spec.cls == i]) for i, name in enumerate(rs.class_names)}
    by_tenant = {name: _group(result, [r for r in reqs if r.tenant == i]) for i, name in enumerate(rs.tenant_names)}
    overall = _group(result, reqs)
    return {
        "policy": result.policy.name, "profile": result.profile.name, "source": rs.source,
        "engine": _engine(result), "overall": overall, "by_class": by_class, "by_tenant": by_tenant,
    }


class _Lazy(Mapping):
    """A read-only mapping whose values are computed on first access."""

    def __init__(self, makers: dict[str, Callable[[], object]]):
        self._makers = makers
        self._values: dict[str, object] = {}

    def __getitem__(self, key: str) -> object:
        try:
            return self._values[key]
        except KeyError:
            value = self._values[key] = self._makers[key]()
            return value

    def __iter__(self) -> Iterator[str]:
        return iter(self._makers)

    def __len__(self) -> int:
        return len(self._makers)


def lazy_summary(result: SimResult) -> Mapping:
    """``summarize(result)`` computed one group at a time, as it is read (a property checker reads one or
    two of the eight groups); every value equals the eager summary's."""
    reqs = result.state.requests
    rs = result.requests

    def group(keep: Callable[[object], bool]) -> Callable[[], dict]:
        return lambda: _group(result, [r for r in reqs if keep(r)])

    def by(attr: Callable[[object], int], names: list[str]) -> Callable[[], Mapping]:
        return lambda: _Lazy({name: group(lambda r, i=i: attr(r) == i) for i, name in enumerate(names)})

    return _Lazy({
        "policy": lambda: result.policy.name, "profile": lambda: result.profile.name, "source": lambda: rs.source,
        "engine": lambda: _engine(result), "overall": lambda: _group(result, reqs),
        "by_class": by(lambda r: r.spec.cls, rs.class_names), "by_tenant": by(lambda r: r.tenant, rs.tenant_names),
    })
