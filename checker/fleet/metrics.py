"""What a fleet run measured: per class p50/p99 TTFT and end-to-end time (from each request's first arrival),
requests lost (and why), retries, re-routes, retry amplification (requests offered to the router per unique
request), goodput, each replica's work, and the recovery time of each class after each fault."""

from __future__ import annotations

import math
from bisect import insort

from checker.fleet.simulation import DECODE, Attempt, FleetResult, RequestRecord
from checker.fleet.spec import LostFault
from checker.fuzz.slo import LatencyBound
from checker.metrics import percentile, stats

MS = 1000.0


def ttft_bound_ms(result: FleetResult, cls: str) -> float | None:
    """The class's p99 TTFT bound (the tightest SLO latency property on ttft_ms p99 for it or for all)."""
    bounds = [p.bound_ms for p in result.fleet.slo if isinstance(p, LatencyBound) and p.metric == "ttft_ms"
              and p.stat == "p99" and p.request_class in (None, cls)]
    return min(bounds) if bounds else None


def _lost(rec: RequestRecord) -> bool:
    return rec.outcome not in ("finished", "cancelled")


def _group(result: FleetResult, members: list[RequestRecord]) -> dict:
    ttft, e2e = [], []
    lost: dict[str, int] = {}
    finished = cancelled = retries = reroutes = denied = 0
    for rec in members:
        arrival = rec.spec.arrival_us
        retries += rec.retries
        reroutes += rec.reroutes
        denied += rec.budget_denied
        if rec.first_token_us is not None:
            ttft.append((rec.first_token_us - arrival) / MS)
        if rec.outcome == "finished":
            finished += 1
            e2e.append((rec.done_us - arrival) / MS)
        elif rec.outcome == "cancelled":
            cancelled += 1
        else:
            why = rec.outcome or "unfinished"
            lost[why] = lost.get(why, 0) + 1
    n_lost = sum(lost.values())
    return {"requests": len(members), "finished": finished, "cancelled": cancelled, "lost": n_lost,
            "lost_by_reason": dict(sorted(lost.items())), "rejected": n_lost, "retries": retries,
            "reroutes": reroutes, "retries_denied_by_budget": denied, "ttft_ms": stats(ttft), "e2e_ms": stats(e2e)}


def recovery_ms(result: FleetResult, cls: int, start_us: int, bound_ms: float, window_ms: float) -> float | None:
    """Time from ``start_us`` until the class's p99 TTFT over a sliding window of arrivals is back within the
    bound for good: 0 when no window ending after the start misses it, None when the last window still misses
    it. A request of the class lost (never given a first token) counts as infinitely late; one its own client
    cancelled is left out. The windows end at the class's arrivals at or after the start."""
    members = sorted((r for r in result.records if r.spec.cls == cls and r.outcome != "cancelled"),
                     key=lambda r: r.spec.arrival_us)
    window_us = window_ms * MS
    inside: list[float] = []
    lo = 0
    last_bad = None
    recovered_at = None
    for hi, rec in enumerate(members):
        t = rec.spec.arrival_us
        ttft = math.inf if rec.first_token_us is None else (rec.first_token_us - t) / MS
        insort(inside, ttft)
        while members[lo].spec.arrival_us <= t - window_us:
            old = members[lo]
            inside.remove(math.inf if old.first_token_us is None else (old.first_token_us - old.spec.arrival_us) / MS)
            lo += 1
        if t < start_us:
            continue
        if percentile(inside, 0.99) > bound_ms:
            last_bad, recovered_at = t, None
        elif recovered_at is None:
            recovered_at = t
    if last_bad is None:
        return 0.0
    if recovered_at is None:
        return None
    return round((recovered_at - start_us) / MS, 3)


def _faults(result: FleetResult) -> list[dict]:
    spec = result.fleet.spec
    out = []
    for i, t in result.fault_times:
        f = spec.faults[i]
        recovery = {}
        for ci, name in enumerate(result.requests.class_names):  # classes with a p99 TTFT bound only
            bound = ttft_bound_ms(result, name)
            if bound is not None:
                recovery[name] = recovery_ms(result, ci, t, bound, spec.properties.recovery_window_ms)
        entry = {"fault": i, "kind": f.kind, "replica": f.replica, "at_ms": round(t / MS, 3),
                 "recovery_ms": recovery, "until_end_ms": round(max(0, result.end_us - t) / MS, 3)}
        if isinstance(f, LostFault):
            entry["rule"] = f.rule.value
        out.append(entry)
    return out


def goodput(result: FleetResult) -> tuple[int, float]:
    """Requests finished with a TTFT within their class's p99 TTFT bound (any finished request where the class
    has none), and how many per simulated second."""
    bounds = [ttft_bound_ms(result, name) for name in result.requests.class_names]
    good = 0
    for rec in result.records:
        if rec.outcome != "finished":
            continue
        bound = bounds[rec.spec.cls]
        if bound is None or (rec.first_token_us - rec.spec.arrival_us) / MS <= bound:
            good += 1
    return good, round(good / _span_s(result), 3)


def _span_s(result: FleetResult) -> float:
    first = min((r.spec.arrival_us for r in result.records), default=0)
    return max(result.end_us - first, 1) / 1e6


def offered(result: FleetResult) -> list[Attempt]:
    """The attempts offered to the router: first attempts, retries and re-routes (not the decode legs that
    disaggregated pools send on after a transfer)."""
    return [a for a in result.attempts if a.kind != DECODE]


def amplification(result: FleetResult) -> float:
    unique = len(result.records)
    return round(len(offered(result)) / unique, 4) if unique else 1.0


def tpot_ms(rec: RequestRecord) -> float | None:
    """Time per output token after the first, as the client sees it: (finish - first token) / (output - 1) (None:
    not finished, or one output token)."""
    if rec.outcome != "finished" or rec.spec.output_len <= 1:
        return None
    return (rec.done_us - rec.first_token_us) / MS / (rec.spec.output_len - 1)


def _pools(result: FleetResult) -> dict:
    """Disaggregated pools: each request's transfer time (its prefill's first token to its arrival at a decode
    replica), TPOT per class, and each pool's utilisation (busy time / (replicas x span))."""
    pools = result.fleet.spec.pools
    transfers: list[float] = []
    for a in result.attempts:
        if a.kind == DECODE:
            prefill = result.attempts[result.records[a.request].attempts[-2]]
            transfers.append((a.sent_us - prefill.end_us) / MS)
    span_us = _span_s(result) * 1e6
    sides = {}
    for side, groups in (("prefill", pools.prefill), ("decode", pools.decode)):
        nodes = [n for n, r in zip(result.nodes, result.fleet.replicas) if r.group in groups]
        sides[side] = {"groups": list(groups), "replicas": len(nodes),
                       "utilisation": round(sum(n.busy_us for n in nodes) / (len(nodes) * span_us), 4)}
    tpot = {name: stats([x for r in result.records if r.spec.cls == i and (x := tpot_ms(r)) is not None])
            for i, name in enumerate(result.requests.class_names)}
    return {"kind": pools.kind, "transfers": len(transfers), "transfer_ms": stats(transfers),
            "tpot_ms": stats([x for r in result.records if (x := tpot_ms(r)) is not None]), "tpot_ms_by_class": tpot,
            **sides}


def summarize_fleet(result: FleetResult) -> dict:
    records = result.records
    by_class = {name: _group(result, [r for r in records if r.spec.cls == i])
                for i, name in enumerate(result.requests.class_names)}
    good, good_rps = goodput(result)
    kinds = {k: sum(1 for a in result.attempts if a.kind == k) for k in ("first", "retry", "reroute")}
    sent = len(offered(result))
    replicas = []
    for node, spec in zip(result.nodes, result.fleet.replicas):
        replicas.append({"name": node.name, "group": spec.group, "policy": node.policy.name,
                         "profile": node.profile.name, "steps": node.steps, "busy_s": round(node.busy_us / 1e6, 3),
                         "kv_peak_blocks": node.kv_peak, "kv_blocks": node.policy.kv.num_blocks,
                         "attempts": sum(1 for a in result.attempts if a.replica == node.index),
                         "lives": len(node.lives), "up_at_end": node.up, "livelock_suspected": node.livelock})
    doc = {
        "fleet": result.fleet.name, "source": result.fleet.source, "requests_source": result.requests.source,
        "router": result.fleet.spec.router.strategy.value,
        "offered": {"unique_requests": len(records), "attempts": sent, **kinds,
                    "retry_amplification": amplification(result)},
        "goodput": {"requests": good, "per_s": good_rps},
        "overall": _group(result, records), "by_class": by_class, "faults": _faults(result), "replicas": replicas,
        "engine": {"steps": result.steps, "simulated_s": round(_span_s(result), 3), "wall_s": round(result.wall_s, 3),
                   "step_limit_hit": result.step_limit_hit},
    }
    if result.fleet.spec.pools.kind == "disaggregated":
        doc["pools"] = _pools(result)
    if result.arms is not None:
        from checker.fleet.canary import judge

        doc["canary"] = judge(result)
    return doc
