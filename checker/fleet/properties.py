"""The fleet's properties, evaluated on one run: the SLO file's properties per class across the fleet (latency of
ttft_ms / e2e_ms from each request's first arrival; rejection_rate as the share of requests lost), retry
amplification bounded, and every request accounted for (finished, cancelled by its client, or lost with a
reason: none left stuck).

On one run a property HOLDS (on that run: a simulation, not a proof) or is VIOLATED; one that measured nothing
(no request of its class) is VACUOUS; on a run cut off at its step limit every property is UNKNOWN. The search (checker.fleet.search) turns these into NO_COUNTEREXAMPLE or a
shrunk, replayed VIOLATED."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from checker.fleet.spec import LoadedFleet
from checker.fuzz.slo import Outcome, evaluate

AMPLIFICATION = "retry_amplification"
ACCOUNTED = "every_request_accounted"
RECOVERY = "recovery_time"
CANARY = "canary"


@dataclass(frozen=True)
class FleetProperty:
    name: str
    kind: str  # "slo", AMPLIFICATION, ACCOUNTED, RECOVERY or CANARY
    slo: object = None  # the SLO file's property, for kind "slo"


@dataclass(frozen=True)
class Finding:
    prop: FleetProperty
    outcome: Outcome
    cut_off: bool = False  # the run stopped at its step limit: nothing it measured decides a property
    undecided: bool = False  # the canary: too few requests in an arm to judge a class (exit 3)

    @property
    def verdict(self) -> str:
        if self.cut_off or self.undecided:
            return "UNKNOWN"
        if self.outcome.observed is None:
            return "VACUOUS"
        return "HOLDS" if self.outcome.holds else "VIOLATED"

    def line(self) -> str:
        o = self.outcome
        if self.undecided and not self.cut_off:
            return f"UNKNOWN   {self.prop.name:<28} {o.detail}"
        if self.verdict == "UNKNOWN":
            return f"UNKNOWN   {self.prop.name:<28} the run stopped at its step limit before every request ended"
        if self.verdict == "VACUOUS":
            return f"VACUOUS   {self.prop.name:<28} {o.detail}"
        sign = "<=" if o.holds else ">" if o.observed > o.allowed else "vs"  # vs: violated below (not recovered)
        word = "HOLDS    " if o.holds else "VIOLATED "
        return f"{word} {self.prop.name:<28} observed {o.observed} {sign} allowed {o.allowed} ({o.detail})"

    def as_json(self) -> dict:
        return {"name": self.prop.name, "kind": self.prop.kind, "verdict": self.verdict,
                "observed": self.outcome.observed, "allowed": self.outcome.allowed, "detail": self.outcome.detail}


def fleet_properties(fleet: LoadedFleet) -> list[FleetProperty]:
    props = [FleetProperty(p.name, "slo", p) for p in fleet.slo]
    if fleet.spec.properties.max_retry_amplification is not None:
        props.append(FleetProperty(AMPLIFICATION, AMPLIFICATION))
    if fleet.spec.properties.every_request_accounted:
        props.append(FleetProperty(ACCOUNTED, ACCOUNTED))
    if fleet.spec.properties.max_recovery_ms is not None:
        props.append(FleetProperty(RECOVERY, RECOVERY))
    if fleet.spec.canary is not None:
        props.append(FleetProperty(CANARY, CANARY))
    return props


def _canary(summary: Mapping) -> Outcome:
    """Holds when the canary is promoted (or undecided: Finding.undecided), violated when it is rolled back."""
    c = summary["canary"]
    return Outcome(c["verdict"] != "rollback", c["observed"], c["allowed"],
                   f"{c['verdict']} ({c['group']}: {c['share']:.0%} of requests by {c['key']}): " + "; ".join(c["why"]))


def _recovery(fleet: LoadedFleet, summary: Mapping) -> Outcome:
    """The longest recovery time of a class after a fault. A class still outside its p99 TTFT bound at the end of
    the run has not recovered: violated, observed the time from the fault to the end (a lower bound)."""
    bound = fleet.spec.properties.max_recovery_ms
    rows = [(ms is None, f["until_end_ms"] if ms is None else ms, cls, f)
            for f in summary["faults"] for cls, ms in f["recovery_ms"].items()]
    if not rows:
        return Outcome(True, None, bound, "no fault, or no class with a p99 TTFT bound in the SLO file: no recovery "
                                          "time measured")
    late, worst, cls, f = max(rows, key=lambda r: (r[0], r[1]))
    where = f"{cls} after fault {f['fault']} ({f['kind']} {f['replica']} at {f['at_ms']:g} ms)"
    if late:
        return Outcome(False, worst, bound, f"{where} not back within its p99 TTFT bound by the end of the run, "
                                            f"{worst:g} ms after the fault")
    return Outcome(worst <= bound, worst, bound, f"longest recovery time: {where}")


def evaluate_fleet(fleet: LoadedFleet, prop: FleetProperty, summary: Mapping) -> Outcome:
    """One property on a fleet run's summary (checker.fleet.metrics.summarize_fleet)."""
    if prop.kind == "slo":
        outcome = evaluate(prop.slo, summary)
        return Outcome(outcome.holds, outcome.observed, outcome.allowed,
                       outcome.detail.replace("rejection rate", "share of requests lost") + " across the fleet")
    if prop.kind == AMPLIFICATION:
        spec = fleet.spec.properties
        offered = summary["offered"]
        unique = max(1, offered["unique_requests"])
        allowed = round(spec.max_retry_amplification + spec.retry_slack / unique, 4)
        slack = f" + {spec.retry_slack} slack / {unique}" if spec.retry_slack else ""
        value = offered["retry_amplification"]
        return Outcome(offered["attempts"] <= spec.max_retry_amplification * unique + spec.retry_slack, value, allowed,
                       f"{offered['attempts']} requests offered for {offered['unique_requests']} unique "
                       f"({offered['retry']} retries, {offered['reroute']} re-routes); bound "
                       f"{spec.max_retry_amplification:g}{slack}")
    if prop.kind == RECOVERY:
        return _recovery(fleet, summary)
    if prop.kind == CANARY:
        return _canary(summary)
    stuck = summary["overall"]["lost_by_reason"].get("unfinished", 0)
    total = summary["overall"]["requests"]
    return Outcome(stuck == 0, stuck, 0, f"requests left unfinished with no reason, of {total}")


def evaluate_all(fleet: LoadedFleet, summary: Mapping) -> list[Finding]:
    cut_off = summary["engine"]["step_limit_hit"]
    undecided = "canary" in summary and summary["canary"]["verdict"] == "undecided"
    return [Finding(p, evaluate_fleet(fleet, p, summary), cut_off, undecided and p.kind == CANARY)
            for p in fleet_properties(fleet)]
