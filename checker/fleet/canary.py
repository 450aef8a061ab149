"""The canary: a policy change on a stable fraction of the fleet, judged against the rest on the same arrivals.

Assignment: each request goes to the canary arm (the replicas of the canary group) or the baseline arm (every
other replica) by a hash of its key (its session, or the request itself) against the declared share, the same on
every run and for every attempt of the request (a retry stays in its arm). The router then chooses among its
arm's replicas only.

Verdict: a class is judged when each arm served (finished or lost) at least ``min_requests`` of it. ``rollback``
when a rollback condition is met on a judged class (the canary's p99 TTFT over the baseline's by more than
``ttft_p99_worse_ms``; its share lost over the baseline's by more than ``lost_share_worse``); else ``promote``
when every class is judged; else ``undecided``, with why (a class with too few requests in an arm).
"""

from __future__ import annotations

import hashlib

from checker.fleet.router import session_key
from checker.fleet.spec import Canary, LoadedFleet
from checker.metrics import percentile
from checker.requests import RequestSpec

ROLLBACK, PROMOTE, UNDECIDED = "rollback", "promote", "undecided"


def canary_replicas(fleet: LoadedFleet) -> set[int]:
    group = fleet.spec.canary.group
    return {i for i, r in enumerate(fleet.replicas) if r.group == group}


def share(fleet: LoadedFleet) -> float:
    """The declared share, else the canary group's share of the replicas."""
    canary = fleet.spec.canary
    return canary.share if canary.share is not None else len(canary_replicas(fleet)) / len(fleet.replicas)


def _unit(key: object) -> float:
    """A stable hash of ``key`` in [0, 1): the same on every run and machine (no per-process salt)."""
    digest = hashlib.blake2b(repr(key).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0**64


def in_canary(canary: Canary, fraction: float, index: int, spec: RequestSpec) -> bool:
    """Whether request ``index`` (its place in the requests) goes to the canary arm."""
    session = session_key(spec.content) if canary.key == "session" else None
    return _unit(("session", session) if session is not None else ("request", index)) < fraction


def arms(fleet: LoadedFleet, specs: list[RequestSpec]) -> list[bool]:
    fraction = share(fleet)
    return [in_canary(fleet.spec.canary, fraction, i, s) for i, s in enumerate(specs)]


def _arm(records: list) -> dict:
    """An arm's figures for one class: requests served (finished or lost; cancelled by their client left out),
    the share lost, and the p99 TTFT of those given a first token (losses are the lost share's)."""
    served = [r for r in records if r.outcome not in (None, "cancelled")]
    lost = sum(1 for r in served if r.outcome != "finished")
    ttft = sorted((r.first_token_us - r.spec.arrival_us) / 1000.0 for r in served if r.first_token_us is not None)
    return {"requests": len(records), "served": len(served), "lost": lost,
            "lost_share": round(lost / len(served), 4) if served else None,
            "ttft_p99_ms": round(percentile(ttft, 0.99), 3) if ttft else None}


def _delta(c: dict, b: dict, field: str, digits: int) -> float | None:
    return None if c[field] is None or b[field] is None else round(c[field] - b[field], digits)


def judge(result) -> dict:
    """The canary's figures per class and arm and its verdict (of a checker.fleet.simulation.FleetResult), with
    the observed and allowed figures of what decided it: the first condition met, else the first declared
    condition's largest excess over the baseline (observed None: no class judged)."""
    fleet = result.fleet
    canary = fleet.spec.canary
    conditions = [(field, bound) for field, bound in (("ttft_p99", canary.rollback.ttft_p99_worse_ms),
                                                      ("lost_share", canary.rollback.lost_share_worse))
                  if bound is not None]
    names = result.requests.class_names
    chosen = canary.classes or names
    classes, met, short, seen = {}, [], [], []
    for name in chosen:
        members = [r for r in result.records if names[r.spec.cls] == name]
        c = _arm([r for r in members if result.arms[r.index]])
        b = _arm([r for r in members if not result.arms[r.index]])
        judged = c["served"] >= canary.min_requests and b["served"] >= canary.min_requests
        deltas = {"ttft_p99": _delta(c, b, "ttft_p99_ms", 3), "lost_share": _delta(c, b, "lost_share", 4)}
        classes[name] = {"canary": c, "baseline": b, "judged": judged,
                         "ttft_p99_worse_ms": deltas["ttft_p99"], "lost_share_worse": deltas["lost_share"]}
        if not judged:
            short.append(f"{name}: {c['served']} served on the canary, {b['served']} on the baseline (a class is "
                         f"judged from {canary.min_requests} in each)")
            continue
        for field, bound in conditions:
            delta = deltas[field]
            if delta is None:
                continue
            if field == conditions[0][0]:  # the first declared condition: what a promote reports
                seen.append((delta, bound))
            if delta > bound:
                unit = "ms" if field == "ttft_p99" else "of its requests lost"
                what = "p99 TTFT" if field == "ttft_p99" else "lost share"
                key = "ttft_p99_ms" if field == "ttft_p99" else "lost_share"
                met.append(((delta, bound), f"{name}: canary {what} {c[key]:g} vs baseline {b[key]:g} (worse by "
                                            f"{delta:g} > {bound:g} {unit})"))
    verdict = ROLLBACK if met else UNDECIDED if short else PROMOTE
    why = [w for _, w in met] if met else short if short else [f"no rollback condition met on {', '.join(chosen)}"]
    decided_by = met[0][0] if met else max(seen, key=lambda s: s[0] - s[1]) if seen else None
    return {"group": canary.group, "replicas": [fleet.replicas[i].name for i in sorted(canary_replicas(fleet))],
            "share": round(share(fleet), 4), "key": canary.key, "min_requests": canary.min_requests,
            "requests": sum(result.arms), "verdict": verdict, "why": why,
            "observed": None if decided_by is None else decided_by[0],
            "allowed": conditions[0][1] if decided_by is None else decided_by[1], "classes": classes}
