"""SLO regression witnesses: both policies run on the same generated traces (the engine, the same
profile); Hypothesis looks for a trace on which one policy's observed value is worse than the other's
by more than a relative threshold, and shrinks it to the smallest such trace.

For every SLO property the observed value is "higher is worse" (latency, rejection rate, unfairness
ratio, KV peak, protected TPOT). ``worse(a, b)`` holds when ``a > b * (1 + threshold) + slack`` where the
slack (``min_delta``, in the property's unit) keeps near-zero values from counting as regressions.
"""

from __future__ import annotations

from dataclasses import dataclass

from checker.engine import simulate
from checker.fuzz.run import hunt
from checker.fuzz.slo import Outcome, Property, evaluate
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


@dataclass
class Comparison:
    """One trace under both policies: the observed values of one property."""

    old: Outcome
    new: Outcome

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


def compare(old: Policy, new: Policy, workload: Workload, profile: Profile, prop: Property,
            trace: list[Draw]) -> Comparison:
    requests = to_requests(trace, workload, "diff")
    return Comparison(evaluate(prop, simulate(old, requests, profile).summary()),
                      evaluate(prop, simulate(new, requests, profile).summary()))


def search_direction(old: Policy, new: Policy, workload: Workload, profile: Profile, prop: Property,
                     new_is_worse: bool, tolerance: Tolerance, max_examples: int, time_budget_s: float,
                     seed: int, max_requests: int = 20, progress=None) -> SloDirection:
    """Traces on which NEW is worse than OLD (``new_is_worse``) or OLD worse than NEW, shrunk."""
    def judge(trace: list[Draw]) -> tuple[bool, Comparison, float]:
        c = compare(old, new, workload, profile, prop, trace)
        a, b = (c.new, c.old) if new_is_worse else (c.old, c.new)
        worse = tolerance.worse(a.observed, b.observed)
        if tolerance.must_violate:
            worse = worse and not a.holds and b.holds
        return worse, c, c.ratio() if new_is_worse else 0.0

    strategy = adversarial(workload, new if new_is_worse else old, max_requests)
    label = f"{prop.name}: {'new worse' if new_is_worse else 'old worse'}"
    h = hunt(strategy, judge, max_examples, time_budget_s, seed, None, label, progress)
    result = SloDirection(h.examples, h.seconds)
    if h.trace is not None:
        result.witness = SloWitness(h.trace, h.verdict)
    return result
