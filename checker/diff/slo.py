"""SLO regression witnesses: both policies run on the same generated traces (the engine, the same
profile); Hypothesis looks for a trace on which one policy's observed value is worse than the other's
by more than a relative threshold, and shrinks it to the smallest such trace.

For every SLO property the observed value is "higher is worse" (latency, rejection rate, unfairness
ratio, KV peak, protected TPOT). ``worse(a, b)`` holds when ``a > b * (1 + threshold) + slack`` where the
slack (``min_delta``, in the property's unit) keeps near-zero values from counting as regressions.

A worse trace is a witness only when it means something for the declared SLO (:meth:`Comparison.why`): the
worse policy breaks the SLO on it where the other meets it, or the trace holds enough requests of the
property's group for its statistic (:func:`samples_needed`: a p99 over fewer than 100 requests is their
maximum). The search looks for such witnesses only, so shrinking never makes one meaningless.
"""

from __future__ import annotations

from dataclasses import dataclass

from checker.engine import simulate
from checker.fuzz.run import hunt
from checker.fuzz.slo import DegradationOrder, LatencyBound, Outcome, Property, RejectionRate, TenantFairness, evaluate
from checker.fuzz.strategies import Draw, adversarial, to_requests
from checker.policy import Policy
from checker.profile import Profile
from checker.workload import Workload


@dataclass(frozen=True)
class Tolerance:
    threshold: float = 0.2  # relative: 0.2 = worse by more than 20 %
    min_delta: float = 1.0  # absolute, in the property's unit (ms for latencies)
    must_violate: bool = False  # count a trace only if the worse policy also breaks the SLO and the other does not

    def worse(self, a: float | None, b: float | None) -> bool:
        """a is worse than b (both observed values of the same property, higher is worse)."""
        if a is None:
            return False
        if b is None:
            b = 0.0
        return a > b * (1 + self.threshold) + self.min_delta


# requests of the property's group a trace needs before its statistic means what it says: with fewer than
# 100 a nearest-rank p99 is the maximum; a median, a mean or a rate of a handful of requests is noise
STAT_SAMPLES = {"p99": 100, "p50": 20, "mean": 20, "max": 1}


def samples_needed(prop: Property) -> tuple[int, str]:
    """How many requests of its group a trace needs for ``prop``'s statistic, and the statistic's name."""
    if isinstance(prop, LatencyBound):
        return STAT_SAMPLES[prop.stat], f"a {prop.metric} {prop.stat}"
    if isinstance(prop, DegradationOrder):
        return STAT_SAMPLES["p99"], "a TPOT p99"
    if isinstance(prop, RejectionRate):
        return 20, "a rejection rate"
    if isinstance(prop, TenantFairness):
        return 20, "a mean queue delay per tenant"
    return 1, "a KV peak"  # the peak of a run is its maximum at any size


def samples(prop: Property, summary) -> int:
    """The values ``prop``'s statistic is taken over in a run: the requests with that latency in its class,
    the requests of its class (a rate), the fewer of the two tenants' (fairness); the whole run otherwise."""
    def n(group, metric: str | None = None) -> int:
        if not group:
            return 0
        return int(group[metric]["n"] if metric is not None else group["requests"])
    if isinstance(prop, (LatencyBound, RejectionRate)):
        cls = prop.request_class
        group = summary["overall"] if cls is None else summary["by_class"].get(cls)
        return n(group, prop.metric if isinstance(prop, LatencyBound) else None)
    if isinstance(prop, DegradationOrder):
        return n(summary["by_class"].get(prop.protected), "tpot_ms")
    if isinstance(prop, TenantFairness):
        return min(n(summary["by_tenant"].get(t), "queue_delay_ms") for t in prop.tenants)
    return n(summary["overall"])


@dataclass
class Comparison:
    """One trace under both policies: the observed values of one property, and the requests of its group."""

    old: Outcome
    new: Outcome
    samples: int = 0

    def why(self, prop: Property, new_is_worse: bool) -> str | None:
        """Why this trace is a witness that one side (NEW if ``new_is_worse``) is worse for the declared SLO,
        or None when it says nothing about it (the worse side meets the SLO on too few requests)."""
        worse, other = (self.new, self.old) if new_is_worse else (self.old, self.new)
        need, stat = samples_needed(prop)
        if not worse.holds and other.holds:
            return f"breaks the declared SLO (allowed {worse.allowed:g}) where the other meets it"
        if self.samples >= need:
            return f"{self.samples} requests of its group, enough for {stat} (at least {need})"
        return None

    def ratio(self) -> float:
        if self.new.observed is None:
            return 0.0
        base = self.old.observed or 0.0
        return self.new.observed / base if base else float(self.new.observed > 0) * 2.0


@dataclass
class SloWitness:
    trace: list[Draw]
    comparison: Comparison


@dataclass
class SloDirection:
    """The search for traces on which ``worse_policy`` is worse than the other."""

    examples: int
    seconds: float
    witness: SloWitness | None = None


def counts(c: Comparison, prop: Property, tolerance: Tolerance, new_is_worse: bool) -> bool:
    """Whether the trace compared in ``c`` is a witness that NEW (``new_is_worse``) or OLD is worse: worse by
    the tolerance, and meaningful for the declared SLO (:meth:`Comparison.why`); with ``must_violate``
    (``--slo-gate violates``) the worse side must also break the SLO where the other meets it."""
    a, b = (c.new, c.old) if new_is_worse else (c.old, c.new)
    if not tolerance.worse(a.observed, b.observed) or c.why(prop, new_is_worse) is None:
        return False
    return not tolerance.must_violate or (not a.holds and b.holds)


def compare(old: Policy, new: Policy, workload: Workload, profile: Profile, prop: Property,
            trace: list[Draw]) -> Comparison:
    requests = to_requests(trace, workload, "diff")
    summary = simulate(new, requests, profile).summary()
    return Comparison(evaluate(prop, simulate(old, requests, profile).summary()), evaluate(prop, summary),
                      samples(prop, summary))


def search_direction(old: Policy, new: Policy, workload: Workload, profile: Profile, prop: Property,
                     new_is_worse: bool, tolerance: Tolerance, max_examples: int, time_budget_s: float,
                     seed: int, max_requests: int = 20, progress=None) -> SloDirection:
    """Traces on which NEW is worse than OLD (``new_is_worse``) or OLD worse than NEW, shrunk."""
    def judge(trace: list[Draw]) -> tuple[bool, Comparison, float]:
        c = compare(old, new, workload, profile, prop, trace)
        return counts(c, prop, tolerance, new_is_worse), c, c.ratio() if new_is_worse else 0.0

    strategy = adversarial(workload, new if new_is_worse else old, max_requests)
    label = f"{prop.name}: {'new worse' if new_is_worse else 'old worse'}"
    h = hunt(strategy, judge, max_examples, time_budget_s, seed, None, label, progress)
    result = SloDirection(h.examples, h.seconds)
    if h.trace is not None:
        result.witness = SloWitness(h.trace, h.verdict)
    return result
