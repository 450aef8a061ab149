"""A fleet check as the facade calls it: the fleet file, its requests, the run, its summary and the verdict of
each property; and the replay of a saved fleet counterexample."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from checker.errors import InputError, Problem
from checker.fleet.metrics import summarize_fleet
from checker.fleet.properties import Finding, evaluate_all, fleet_properties
from checker.fleet.counterexample import load_counterexample
from checker.fleet.simulation import DEFAULT_MAX_STEPS, FleetResult, simulate_fleet
from checker.fleet.spec import Fleet, LoadedFleet, check_classes, load_fleet
from checker.loading import validate
from checker.traces import RequestSet, TraceOptions, load_requests


@dataclass
class FleetRun:
    fleet: LoadedFleet
    requests: RequestSet
    result: FleetResult
    summary: dict
    findings: list[Finding]

    @property
    def violated(self) -> bool:
        return any(f.verdict == "VIOLATED" for f in self.findings)

    @property
    def decided(self) -> bool:
        """False when the run stopped at its step limit (every verdict UNKNOWN) or a canary is undecided: exit 3."""
        return not self.result.step_limit_hit and not any(f.undecided for f in self.findings)


def fleet_requests(fleet: LoadedFleet, workload: str | Path | None, trace: str | Path | None,
                   limit: int | None = None, options: TraceOptions | None = None) -> RequestSet:
    """The requests: the command line's workload or trace, else the workload the fleet file names."""
    if workload is None and trace is None:
        if fleet.workload is None and fleet.trace is None:
            raise InputError(Problem("--workload/--trace", "<none>", "one of them, or a workload: or trace: in the "
                                     "fleet file"), None)
        workload, trace = fleet.workload, fleet.trace
    if trace is None and options is not None and options != TraceOptions():
        raise InputError(Problem("--window/--rate-scale/--class-by-prompt/--class-column", "given", "a trace to apply "
                                 "them to: --trace FILE, or a trace: in the fleet file"), fleet.source)
    requests = load_requests(workload=workload, trace=trace, limit=limit, options=options)
    check_classes(fleet, requests.class_names)
    return requests


def check(fleet: LoadedFleet, requests: RequestSet, max_steps: int = DEFAULT_MAX_STEPS) -> FleetRun:
    result = simulate_fleet(fleet, requests, max_steps)
    summary = summarize_fleet(result)
    return FleetRun(fleet, requests, result, summary, evaluate_all(fleet, summary))


def run_fleet(fleet: str | Path, workload: str | Path | None = None, trace: str | Path | None = None,
              limit: int | None = None, options: TraceOptions | None = None) -> FleetRun:
    loaded = load_fleet(fleet)
    return check(loaded, fleet_requests(loaded, workload, trace, limit, options))


def replay_fleet(fleet: str | Path, counterexample: str | Path) -> FleetRun:
    """A saved fleet counterexample run again on the fleet file (its requests and faults in place of the file's),
    judged on the property it names (and the others)."""
    loaded = load_fleet(fleet)
    cex, requests = load_counterexample(counterexample)
    names = [p.name for p in fleet_properties(loaded)]
    if cex.property not in names:
        raise InputError(Problem("property", cex.property, "a property of the fleet: " + ", ".join(names)),
                         str(counterexample))
    data = {**loaded.spec.model_dump(mode="json", by_alias=True),
            "faults": [f.model_dump(mode="json") for f in cex.faults]}
    validate(Fleet, data, str(counterexample))  # its faults on this fleet's replicas (one lost fault per replica)
    return check(loaded.with_faults(list(cex.faults)), requests)
