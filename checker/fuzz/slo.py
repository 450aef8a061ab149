"""SLO files: timing properties declared in YAML next to a workload, evaluated on an engine run.

Each property is named, has a kind, and when evaluated gives (holds, observed, allowed) so a
counterexample can say "observed 2,310 ms, allowed 2,000 ms".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

from checker.errors import InputError, Problem
from checker.loading import load_model
from checker.workload import Workload

Metric = Literal["ttft_ms", "tpot_ms", "queue_delay_ms", "e2e_ms", "max_tbt_ms"]
Stat = Literal["max", "p99", "p50", "mean"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


class LatencyBound(_Strict):
    """A latency statistic of one class (or of all requests) stays within a bound."""

    kind: Literal["latency"]
    name: Annotated[str, Field(min_length=1)]
    request_class: Annotated[str | None, Field(alias="class")] = None
    """The class it applies to (default: all requests)."""
    metric: Metric
    stat: Stat = "p99"
    bound_ms: Annotated[float, Field(gt=0, le=1e9)]


class RejectionRate(_Strict):
    """The share of a class's requests that is rejected stays within a bound."""

    kind: Literal["rejection_rate"]
    name: Annotated[str, Field(min_length=1)]
    request_class: Annotated[str | None, Field(alias="class")] = None
    max_rate: Annotated[float, Field(ge=0, le=1)]


class TenantFairness(_Strict):
    """Between two tenants, the larger mean queue delay is at most ``max_ratio`` times the smaller one
    (plus ``slack_ms``, so that near-zero delays do not make any difference look unfair)."""

    kind: Literal["tenant_fairness"]
    name: Annotated[str, Field(min_length=1)]
    tenants: Annotated[list[str], Field(min_length=2, max_length=2)]
    max_ratio: Annotated[float, Field(ge=1, le=1e6)]
    slack_ms: Annotated[float, Field(ge=0, le=1e9)] = 50.0


class DegradationOrder(_Strict):
    """Under overload the background class degrades first: the protected class never misses its TPOT
    bound (p99), and KV is never over-committed, unless the background class is already being rejected
    or degraded (its own TPOT p99 above the bound, or some of it rejected)."""

    kind: Literal["degradation_order"]
    name: Annotated[str, Field(min_length=1)]
    protected: str
    background: str
    tpot_bound_ms: Annotated[float, Field(gt=0, le=1e9)]

    @model_validator(mode="after")
    def _distinct(self) -> DegradationOrder:
        if self.protected == self.background:
            raise PydanticCustomError("consistency", "", {"field": "background", "value": self.background,
                                                          "expected": "a class other than the protected one"})
        return self


class KVWithinPool(_Strict):
    """The KV blocks in use never exceed the pool during the run (the timing-side twin of the
    kv_never_overcommitted invariant)."""

    kind: Literal["kv_within_pool"]
    name: Annotated[str, Field(min_length=1)]


class LookaheadWithinPool(_Strict):
    """The KV blocks in use, counting the drafter's lookahead slots of every request scheduled in a step, never
    exceed the pool during the run (the timing-side twin of the lookahead_fits invariant; without speculative
    decoding it is kv_within_pool)."""

    kind: Literal["lookahead_within_pool"]
    name: Annotated[str, Field(min_length=1)]


Property = Annotated[Union[LatencyBound, RejectionRate, TenantFairness, DegradationOrder, KVWithinPool,
                           LookaheadWithinPool],
                     Field(discriminator="kind")]


class SLOFile(_Strict):
    format: Literal["batchcheck-slo"] = "batchcheck-slo"
    properties: Annotated[list[Property], Field(min_length=1)]

    @model_validator(mode="after")
    def _unique(self) -> SLOFile:
        names = [p.name for p in self.properties]
        for i, name in enumerate(names):
            if names.index(name) != i:
                raise PydanticCustomError("consistency", "", {"field": f"properties.{i}.name", "value": name,
                                                              "expected": "a property name used once"})
        return self


def slo_file_for(workload: str | Path) -> Path:
    """The SLO file declared next to a workload: ``name.yaml`` -> ``name.slo.yaml``."""
    path = Path(workload)
    return path.with_name(path.stem + ".slo.yaml")


def load_slo(workload: str | Path, slo: str | Path | None, properties: list[str] | None):
    """The workload, the SLO file (given, or declared next to the workload) and the chosen properties,
    checked against each other (every class an SLO property names is a class of the workload)."""
    wl = load_model(Workload, workload)
    slo_path = Path(slo) if slo is not None else slo_file_for(workload)
    if slo is None and not slo_path.exists():
        raise InputError(Problem("--slo", "<none>", f"an SLO file (none given, and no {slo_path.name} next to the "
                                 "workload)"))
    slo_file = load_model(SLOFile, slo_path)
    known = {p.name: p for p in slo_file.properties}
    for name in properties or []:
        if name not in known:
            raise InputError(Problem("--property", name, "one of: " + ", ".join(known)), str(slo_path))
    for prop in slo_file.properties:
        classes = [getattr(prop, attr, None) for attr in ("request_class", "protected", "background")]
        for cls in classes:
            if cls is not None and cls not in [c.name for c in wl.classes]:
                raise InputError(Problem(f"properties.{prop.name}", cls, "a class of the workload: " +
                                         ", ".join(c.name for c in wl.classes)), str(slo_path))
    chosen = [known[name] for name in properties] if properties else list(slo_file.properties)
    return wl, slo_path, chosen


@dataclass(frozen=True)
class Outcome:
    holds: bool
    observed: float | None
    allowed: float
    detail: str


def _group(summary: Mapping, request_class: str | None) -> Mapping | None:
    return summary["overall"] if request_class is None else summary["by_class"].get(request_class)


def evaluate(prop: Property, summary: Mapping) -> Outcome:
    """Evaluate one property on a simulation summary (checker.metrics.summarize, or lazy_summary, which
    computes only the groups the property reads)."""
    if isinstance(prop, LatencyBound):
        group = _group(summary, prop.request_class)
        value = None if group is None else group[prop.metric][prop.stat]
        if value is None:
            return Outcome(True, None, prop.bound_ms, "no such request in this trace")
        return Outcome(value <= prop.bound_ms, value, prop.bound_ms,
                       f"{prop.request_class or 'all'} {prop.metric} {prop.stat}")
    if isinstance(prop, RejectionRate):
        group = _group(summary, prop.request_class)
        if not group or not group["requests"]:
            return Outcome(True, None, prop.max_rate, "no such request in this trace")
        rate = group["rejected"] / group["requests"]
        return Outcome(rate <= prop.max_rate, round(rate, 4), prop.max_rate,
                       f"{prop.request_class or 'all'} rejection rate")
    if isinstance(prop, TenantFairness):
        a, b = (summary["by_tenant"].get(t) for t in prop.tenants)
        if not a or not b or a["queue_delay_ms"]["mean"] is None or b["queue_delay_ms"]["mean"] is None:
            return Outcome(True, None, prop.max_ratio, "a tenant has no scheduled request in this trace")
        slow, fast = sorted((a["queue_delay_ms"]["mean"], b["queue_delay_ms"]["mean"]), reverse=True)
        ratio = (slow + prop.slack_ms) / (fast + prop.slack_ms)
        return Outcome(ratio <= prop.max_ratio, round(ratio, 3), prop.max_ratio,
                       f"mean queue delay ratio {prop.tenants[0]}/{prop.tenants[1]} (with {prop.slack_ms:g} ms slack)")
    if isinstance(prop, KVWithinPool):
        peak, pool = summary["engine"]["kv_peak_blocks"], summary["engine"]["kv_blocks"]
        return Outcome(peak <= pool, peak, pool, "KV blocks in use at the peak")
    if isinstance(prop, LookaheadWithinPool):
        engine = summary["engine"]
        spec = engine.get("speculative")
        peak = engine["kv_peak_blocks"] if spec is None else spec["kv_peak_blocks_with_lookahead"]
        return Outcome(peak <= engine["kv_blocks"], peak, engine["kv_blocks"],
                       "KV blocks in use at the peak, counting the lookahead slots")
    protected = summary["by_class"].get(prop.protected)
    background = summary["by_class"].get(prop.background)
    if not protected or protected["tpot_ms"]["p99"] is None:
        return Outcome(True, None, prop.tpot_bound_ms, "the protected class has no finished request here")
    tpot = protected["tpot_ms"]["p99"]
    overcommitted = summary["engine"]["kv_peak_blocks"] > summary["engine"]["kv_blocks"]
    missed = tpot > prop.tpot_bound_ms or overcommitted
    degraded = bool(background) and (background["rejected"] > 0 or (background["tpot_ms"]["p99"] or 0) > prop.tpot_bound_ms)
    return Outcome(not (missed and not degraded), tpot, prop.tpot_bound_ms,
                   f"{prop.protected} TPOT p99 while {prop.background} is {'degraded' if degraded else 'not degraded'}"
                   + (" (KV over-committed)" if overcommitted else ""))
