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
    def __init__(self, outcome: Outcome):
        super().__init__(outcome.detail)
        self.outcome = outcome


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


def run_property(policy: Policy, workload: Workload, profile: Profile, prop: Property, max_examples: int,
                 time_budget_s: float, seed_value: int, database_dir: Path | None, max_requests: int = 20,
                 stresses: list[str] | None = None, progress: Callable[[str], None] | None = None) -> PropertyResult:
    started = time.monotonic()
    deadline = started + time_budget_s
    state = {"examples": 0, "last_failure": None, "worst": 0.0}

    def check(trace: list[Draw]) -> None:
        if state["last_failure"] is None and time.monotonic() > deadline:
            return  # out of time: no new examples (not counted); a found failure is still shrunk honestly
        state["examples"] += 1
        summary = simulate(policy, to_requests(trace, workload), profile).summary()
        outcome = evaluate(prop, summary)
        if outcome.observed is not None and outcome.allowed:
            state["worst"] = max(state["worst"], outcome.observed / outcome.allowed)
        if progress is not None and state["examples"] % 20 == 0:
            progress(f"{prop.name}: {state['examples']} examples, worst observed/allowed {state['worst']:.2f}")
        if not outcome.holds:
            state["last_failure"] = (list(trace), outcome)
            raise _Violation(outcome)

    database = DirectoryBasedExampleDatabase(str(database_dir)) if database_dir is not None else None
    test = settings(max_examples=max_examples, deadline=None, database=database, derandomize=False,
                    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink], print_blob=False,
                    suppress_health_check=list(HealthCheck))(
        given(adversarial(workload, policy, max_requests, stresses))(check))
    test = seed(seed_value)(test)
    result = PropertyResult(prop, 0, 0.0)
    try:
        test()
    except _Violation:
        trace, outcome = state["last_failure"]
        result.violated, result.trace, result.outcome = True, trace, outcome
    result.examples = state["examples"]
    result.seconds = time.monotonic() - started
    return result
