"""The fleet's Hypothesis search: arrivals (the SLO fuzzer's adversarial request strategies over the workload's
classes), faults (replicas lost, with their recovery delay, and slow windows) and their timing, drawn together;
a failing fleet trace is shrunk by Hypothesis to a minimal one, replayed, and saved as a fleet counterexample
(``batchcheck fleet FLEET --replay FILE`` runs it again). One search per property, with the SLO fuzzer's driver
(checker.fuzz.run.hunt).

The drawn faults replace the fleet file's: each lost fault takes the rule, detection delay and warm-up of the
file's first lost fault (the defaults where it has none), each slow fault the factor of its first slow fault."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from hypothesis import strategies as st

from checker.errors import InternalError
from checker.fleet.counterexample import save_counterexample
from checker.fleet.metrics import summarize_fleet
from checker.fleet.properties import FleetProperty, evaluate_fleet, fleet_properties
from checker.fleet.simulation import simulate_fleet
from checker.fleet.spec import Fault, LoadedFleet, LostFault, SlowFault
from checker.fuzz.run import hunt
from checker.fuzz.slo import Outcome
from checker.fuzz.strategies import Draw, adversarial, ranges, request_maker
from checker.loading import load_model
from checker.traces import RequestSet
from checker.workload import Workload

MAX_FAULTS = 2


class FaultDraw(NamedTuple):
    kind: str  # "lost" or "slow"
    replica: int
    at_ms: int
    length_ms: int  # lost: recovery delay (0: it never recovers); slow: the window's length


def _faults(fleet: LoadedFleet, horizon_ms: int) -> st.SearchStrategy[list[FaultDraw]]:
    n = len(fleet.replicas)
    replica, at = st.integers(0, n - 1), st.integers(0, horizon_ms)
    lost = st.builds(FaultDraw, st.just("lost"), replica, at, st.integers(0, horizon_ms))
    slow = st.builds(FaultDraw, st.just("slow"), replica, at, st.integers(1, horizon_ms))
    return st.lists(st.one_of(lost, slow), max_size=MAX_FAULTS)


def to_faults(fleet: LoadedFleet, draws: list[FaultDraw]) -> list[Fault]:
    """The drawn faults as fleet faults (one lost fault per replica: a later draw for a lost replica is dropped)."""
    template = next((f for f in fleet.spec.faults if isinstance(f, LostFault)), None)
    factor = next((f.factor for f in fleet.spec.faults if isinstance(f, SlowFault)), 4.0)
    out: list[Fault] = []
    lost: set[int] = set()
    for d in draws:
        name = fleet.replicas[d.replica].name
        if d.kind == "slow":
            out.append(SlowFault(kind="slow", replica=name, start_ms=d.at_ms, end_ms=d.at_ms + d.length_ms,
                                 factor=factor))
        elif d.replica not in lost:
            lost.add(d.replica)
            detect = 0.0 if template is None else template.detect_ms
            recover = None if d.length_ms == 0 else max(float(d.length_ms), detect)
            out.append(LostFault(kind="lost", replica=name, at_ms=d.at_ms, rule=template.rule if template else "fail",
                                 detect_ms=detect, recover_after_ms=recover,
                                 warmup_ms=template.warmup_ms if template else 0.0,
                                 warmup_factor=template.warmup_factor if template else 1.0))
    return out


def run_trace(fleet: LoadedFleet, prop: FleetProperty, requests: RequestSet, faults: list[Fault]) -> Outcome:
    """One fleet trace (requests and faults) judged on one property."""
    fl = fleet.with_faults(faults)
    result = simulate_fleet(fl, requests)
    if result.step_limit_hit:  # decides nothing: no counterexample from it
        return Outcome(True, None, 0.0, "the run stopped at its step limit")
    return evaluate_fleet(fl, prop, summarize_fleet(result))


@dataclass
class SearchResult:
    prop: FleetProperty
    examples: int
    seconds: float
    outcome: Outcome | None = None  # of the minimal failing trace, replayed
    requests: RequestSet | None = None
    faults: list[Fault] = field(default_factory=list)
    counterexample: Path | None = None
    shrink_stopped: bool = False  # the time budget ran out while the failure was being shrunk

    @property
    def violated(self) -> bool:
        return self.outcome is not None

    def line(self) -> str:
        name = f"{self.prop.name:<28}"
        if self.outcome is None:
            return (f"NO_COUNTEREXAMPLE  {name} no counterexample in {self.examples} examples (a search, not a "
                    f"proof)  [{self.seconds:.1f} s]")
        o = self.outcome
        saved = f"; {self.counterexample}" if self.counterexample else ""
        size = f"{len(self.requests.specs)} requests, {len(self.faults)} faults"
        trace = (f"fleet trace: {size} (shrinking stopped at the time budget: a smaller one may fail too)"
                 if self.shrink_stopped else f"minimal fleet trace: {size} after shrinking")
        return (f"VIOLATED           {name} observed {o.observed} > allowed {o.allowed} ({o.detail}); {trace}; "
                f"replayed{saved}  [{self.seconds:.1f} s]")

    def as_json(self) -> dict:
        doc = {"name": self.prop.name, "kind": self.prop.kind, "examples": self.examples,
               "seconds": round(self.seconds, 3),
               "verdict": "VIOLATED" if self.violated else "NO_COUNTEREXAMPLE",
               "counterexample": str(self.counterexample) if self.counterexample else None}
        if self.outcome is not None:
            doc.update(observed=self.outcome.observed, allowed=self.outcome.allowed, detail=self.outcome.detail,
                       requests=len(self.requests.specs), faults=len(self.faults))
        return doc


@dataclass(frozen=True)
class _Task:
    """One property's search, as a worker runs it (everything it needs, picklable: it reads no file)."""

    fleet: LoadedFleet
    workload: Workload
    prop: FleetProperty
    max_examples: int
    time_budget_s: float
    seed: int
    max_requests: int
    stresses: list[str] | None
    database_dir: Path | None


def _split(trace: list) -> tuple[list[Draw], list[FaultDraw]]:
    return [d for d in trace if isinstance(d, Draw)], [d for d in trace if isinstance(d, FaultDraw)]


def search_property(task: _Task) -> SearchResult:
    """One Hypothesis search for one property; a failure shrunk and replayed (not saved: the caller saves)."""
    fleet, w, prop = task.fleet, task.workload, task.prop
    make = request_maker(w)
    horizon = max(1, max(ranges(w).mean_gap_ms) * task.max_requests)
    strategy = st.tuples(adversarial(w, fleet.replicas[0].policy, task.max_requests, task.stresses),
                         _faults(fleet, horizon)).map(lambda parts: list(parts[0]) + list(parts[1]))

    def judge(trace: list) -> tuple[bool, Outcome | None, float]:
        draws, faults = _split(trace)
        outcome = run_trace(fleet, prop, make(draws), to_faults(fleet, faults))
        ratio = outcome.observed / outcome.allowed if outcome.observed is not None and outcome.allowed else 0.0
        return not outcome.holds, outcome, ratio

    h = hunt(strategy, judge, task.max_examples, task.time_budget_s, task.seed, task.database_dir, prop.name)
    result = SearchResult(prop, h.examples, h.seconds)
    if h.trace is not None:
        draws, faults = _split(h.trace)
        requests, fleet_faults = make(draws, "fleet search"), to_faults(fleet, faults)
        replayed = run_trace(fleet, prop, requests, fleet_faults)
        if replayed.holds:  # the simulation is deterministic: a failure that does not replay is a bug
            raise InternalError(f"fleet search: the shrunk trace of {prop.name} does not fail on replay")
        result.outcome, result.requests, result.faults = replayed, requests, fleet_faults
        result.shrink_stopped = h.stopped == "shrinking"
    return result


def search(fleet: LoadedFleet, workload: str | Path, max_examples: int = 100, time_budget_s: float = 60.0,
           seed: int = 0, max_requests: int = 20, out_dir: Path | None = None,
           only: list[str] | None = None, stresses: list[str] | None = None, database_dir: Path | None = None,
           budget_in_all: bool = False, jobs: int = 1, scheduler=None) -> list[SearchResult]:
    """One search per property of the fleet (or those named in ``only``), each with ``time_budget_s`` (with
    ``budget_in_all``: that much for all of them, split evenly, as ``fuzz`` splits its budget). ``stresses``: the
    request strategies drawn (default: the first replica policy's, as fuzz's); ``database_dir``: a Hypothesis
    example database (None: none). The searches run in this process, one after the other, or on ``jobs`` local
    processes or a Dask cluster (``scheduler``: checker.parallel), each the same wherever it runs; the caller
    saves the counterexamples."""
    import os

    from checker.parallel import map_dask, map_processes, quiet_worker

    w = load_model(Workload, workload)
    chosen = [p for p in fleet_properties(fleet) if not only or p.name in only]
    budget = time_budget_s / max(1, len(chosen)) if budget_in_all else time_budget_s
    tasks = [_Task(fleet, w, prop, max_examples, budget, seed, max_requests, stresses, database_dir) for prop in chosen]
    if scheduler is not None:
        results = map_dask(search_property, tasks, scheduler)
    else:
        results = map_processes(search_property, tasks, jobs, None, quiet_worker, (os.getpid(),))
    for r in results:
        if r.violated and out_dir is not None:
            r.counterexample = save_counterexample(fleet, r.prop.name, r.outcome, r.requests, r.faults, out_dir)
    return results


def fleet_search(fleet: str | Path, workload: str | Path | None = None, max_examples: int = 100,
                 time_budget_s: float = 60.0, seed: int = 0, max_requests: int = 20,
                 out_dir: Path | None = None, only: list[str] | None = None, stresses: list[str] | None = None,
                 database_dir: Path | None = None, budget_in_all: bool = False, jobs: int = 1,
                 scheduler=None) -> list[SearchResult]:
    """``search`` on a fleet file, over the classes of ``workload`` (default: the workload the fleet names), for
    its properties (or those named in ``only``)."""
    from checker.errors import InputError, Problem
    from checker.fleet.spec import check_classes, load_fleet
    from checker.fuzz.run import check_stresses

    loaded = load_fleet(fleet)
    workload = workload if workload is not None else loaded.workload
    if workload is None:
        raise InputError(Problem("--workload", "<none>", "a workload (its classes and length ranges are what the "
                                 "search draws from), or a workload: in the fleet file"))
    check_classes(loaded, [c.name for c in load_model(Workload, workload).classes])
    known = [p.name for p in fleet_properties(loaded)]
    for name in only or []:
        if name not in known:
            raise InputError(Problem("--property", name, "a property of the fleet: " + ", ".join(known)))
    check_stresses(stresses, loaded.replicas[0].policy)
    return search(loaded, workload, max_examples, time_budget_s, seed, max_requests, out_dir, only, stresses,
                  database_dir, budget_in_all, jobs, scheduler)
