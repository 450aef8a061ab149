"""``fuzz``: search adversarial traces for an SLO violation with Hypothesis, shrink it, replay it, save it.

One Hypothesis search per property (so each property gets its own minimal trace). The example database
lives in a project-local folder (``.batchcheck/hypothesis`` by default), so a rerun tries earlier failures
first. A time budget stops generating new examples; the verdict counts only the examples that ran.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis.database import DirectoryBasedExampleDatabase

from checker.engine import simulate
from checker.fuzz.slo import Outcome, Property, evaluate
from checker.fuzz.strategies import Draw, adversarial, to_requests
from checker.policy import Policy
from checker.profile import Profile
from checker.workload import Workload


class _Violation(Exception):
    def __init__(self, verdict: object):
        super().__init__(str(verdict))
        self.verdict = verdict


@dataclass
class PropertyResult:
    prop: Property
    examples: int  # examples that ran for this property
    seconds: float
    violated: bool = False
    outcome: Outcome | None = None  # of the minimal failing trace
    trace: list[Draw] = field(default_factory=list)
    counterexample: Path | None = None

    def line(self) -> str:
        name = f"{self.prop.name:<28}"
        if self.violated:
            assert self.outcome is not None
            return (f"VIOLATED           {name} observed {self.outcome.observed} > allowed {self.outcome.allowed} "
                    f"({self.outcome.detail}); minimal trace: {len(self.trace)} requests after shrinking; replayed; "
                    f"{self.counterexample}  [{self.seconds:.1f} s]")
        return (f"NO_COUNTEREXAMPLE  {name} no counterexample in {self.examples} examples (a search, not a proof)"
                f"  [{self.seconds:.1f} s]")


@dataclass
class Hunt:
    """What one Hypothesis search found: the examples that ran, and the shrunk failing trace (if any)
    with what the judge said of it."""

    examples: int
    seconds: float
    trace: list[Draw] | None = None
    verdict: object = None


Judge = Callable[[list[Draw]], "tuple[bool, object, float]"]  # (fails, what to report, badness for progress)


def hunt(strategy, judge: Judge, max_examples: int, time_budget_s: float, seed_value: int,
         database_dir: Path | None, label: str = "", progress: Callable[[str], None] | None = None) -> Hunt:
    """Generate traces until ``judge`` says one fails (then shrink it) or the budget is spent. A time budget
    stops generating new examples (they are not counted); a failure already found is still shrunk."""
    started = time.monotonic()
    deadline = started + time_budget_s
    state = {"examples": 0, "last_failure": None, "worst": 0.0}

    def check(trace: list[Draw]) -> None:
        if state["last_failure"] is None and time.monotonic() > deadline:
            return
        state["examples"] += 1
        fails, verdict, badness = judge(trace)
        state["worst"] = max(state["worst"], badness)
        if progress is not None and state["examples"] % 20 == 0:
            progress(f"{label}: {state['examples']} examples, worst {state['worst']:.2f}")
        if fails:
            state["last_failure"] = (list(trace), verdict)
            raise _Violation(verdict)

    database = DirectoryBasedExampleDatabase(str(database_dir)) if database_dir is not None else None
    test = settings(max_examples=max_examples, deadline=None, database=database, derandomize=False,
                    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink], print_blob=False,
                    suppress_health_check=list(HealthCheck))(given(strategy)(check))
    test = seed(seed_value)(test)
    found = None
    try:
        test()
    except _Violation:
        found = state["last_failure"]
    result = Hunt(state["examples"], time.monotonic() - started)
    if found is not None:
        result.trace, result.verdict = found
    return result


def run_property(policy: Policy, workload: Workload, profile: Profile, prop: Property, max_examples: int,
                 time_budget_s: float, seed_value: int, database_dir: Path | None, max_requests: int = 20,
                 stresses: list[str] | None = None, progress: Callable[[str], None] | None = None) -> PropertyResult:
    def judge(trace: list[Draw]) -> tuple[bool, Outcome, float]:
        outcome = evaluate(prop, simulate(policy, to_requests(trace, workload), profile).summary())
        badness = outcome.observed / outcome.allowed if outcome.observed is not None and outcome.allowed else 0.0
        return not outcome.holds, outcome, badness

    h = hunt(adversarial(workload, policy, max_requests, stresses), judge, max_examples, time_budget_s, seed_value,
             database_dir, f"{prop.name} (observed/allowed)", progress)
    result = PropertyResult(prop, h.examples, h.seconds)
    if h.trace is not None:
        result.violated, result.trace, result.outcome = True, h.trace, h.verdict
    return result
