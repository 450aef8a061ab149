"""``fuzz``: search adversarial traces for an SLO violation with Hypothesis, shrink it, replay it, save it.

One Hypothesis search per property (so each property gets its own minimal trace). The example database
lives in a project-local folder (``.batchcheck/hypothesis`` by default), so a rerun tries earlier failures
first. The time budget stops the search where it is, generating or shrinking (checked before every example,
so one example's simulation is the most it runs past): the verdict counts only the examples that ran, and a
failure found before the budget ran out is reported as shrunk so far (still replayed before it is saved).
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from hypothesis import HealthCheck, Phase, example, given, seed, settings
from hypothesis import configuration as hypothesis_configuration
from hypothesis.database import DirectoryBasedExampleDatabase

from checker.engine import simulate
from checker.errors import InputError, InternalError, Problem
from checker.fuzz import counterexample as fuzz_cex
from checker.fuzz.seeds import SeedCorpus, seed_corpus, shrink
from checker.fuzz.slo import Outcome, Property, evaluate, load_slo
from checker.fuzz.strategies import (CONNECTOR_STRESSES, STRESSES, Draw, adversarial, default_stresses, ranges,
                                     request_maker, to_requests)
from checker.inputfiles import PolicyInput, load_policy, policy_source, trace_requests
from checker.metrics import lazy_summary
from checker.policy import Policy
from checker.profile import Profile, load_profile
from checker.traces import TraceOptions
from checker.verify.counterexample import save
from checker.workload import Workload


class _Violation(Exception):
    def __init__(self, verdict: object):
        super().__init__(str(verdict))
        self.verdict = verdict


class _BudgetSpent(BaseException):
    """The time budget ran out: raised from the test function, it ends the Hypothesis run at once, in any
    phase (a BaseException, as KeyboardInterrupt: Hypothesis neither takes it for a failure nor shrinks it,
    where an example that merely passed would let it go on generating or trying shrink candidates)."""


@dataclass
class PropertyResult:
    prop: Property
    examples: int  # examples that ran for this property
    seconds: float
    violated: bool = False
    outcome: Outcome | None = None  # of the minimal failing trace
    trace: list[Draw] = field(default_factory=list)
    counterexample: Path | None = None
    seeds_run: int = 0  # seed windows (from --seed-trace) that ran as explicit examples
    seed_found: int | None = None  # the seed window (1 = busiest) the failure was found in
    seed_notes: list[str] = field(default_factory=list)
    requests_run: int = 0  # requests in all the examples that ran (their mean trace length times examples)
    shrink_stopped: bool = False  # the time budget ran out while the failure was being shrunk

    def line(self) -> str:
        name = f"{self.prop.name:<28}"
        if self.violated:
            assert self.outcome is not None
            found = "" if self.seed_found is None else (f" (found in seed window {self.seed_found}, example "
                                                         f"{self.seed_found}, then shrunk)")
            trace = (f"trace: {len(self.trace)} requests (shrinking stopped at the time budget: a smaller one may fail too)"
                     if self.shrink_stopped else f"minimal trace: {len(self.trace)} requests after shrinking")
            return (f"VIOLATED           {name} observed {self.outcome.observed} > allowed {self.outcome.allowed} "
                    f"({self.outcome.detail}); {trace}{found}; replayed; {self.counterexample}  "
                    f"[{self.seconds:.1f} s]")
        seeded = f"{self.seeds_run} of them seed windows; " if self.seeds_run else ""
        return (f"NO_COUNTEREXAMPLE  {name} no counterexample in {self.examples} examples ({seeded}a search, not a "
                f"proof)  [{self.seconds:.1f} s]")


@dataclass
class Hunt:
    """What one Hypothesis search found: the examples that ran, and the shrunk failing trace (if any)
    with what the judge said of it."""

    examples: int
    seconds: float
    trace: list[Draw] | None = None
    verdict: object = None
    seeds_run: int = 0  # explicit seed examples that ran
    seed_found: int | None = None  # 1-based index of the seed the failure was found in
    requests_run: int = 0  # requests in all the examples that ran
    stopped: str | None = None  # where the time budget stopped the search: "generating" or "shrinking"


Judge = Callable[[list[Draw]], "tuple[bool, object, float]"]  # (fails, what to report, badness for progress)


@contextlib.contextmanager
def _hypothesis_home(database_dir: Path | None):
    """Where Hypothesis keeps its own files (a cache of constants it reads from source files) while it runs:
    beside the example database, or a temporary folder removed afterwards when there is none (``--database
    none`` must leave nothing in the working directory)."""
    previous = getattr(hypothesis_configuration, "__hypothesis_home_directory", None)
    temporary = None
    if database_dir is not None:
        home = Path(database_dir).parent / "hypothesis-home"
    else:
        home = temporary = Path(tempfile.mkdtemp(prefix="batchcheck-hypothesis-"))
    hypothesis_configuration.set_hypothesis_home_dir(home)
    try:
        yield
    finally:
        hypothesis_configuration.set_hypothesis_home_dir(previous)
        if temporary is not None:
            shutil.rmtree(temporary, ignore_errors=True)


def hunt(strategy, judge: Judge, max_examples: int, time_budget_s: float, seed_value: int,
         database_dir: Path | None, label: str = "", progress: Callable[[str], None] | None = None,
         seeds: list[list[Draw]] = (),
         seed_shrinker: Callable[[list[Draw], Judge, float], tuple[list[Draw], object, bool]] | None = None) -> Hunt:
    """Generate traces until ``judge`` says one fails (then shrink it) or the budget is spent. The time budget
    is checked before every example, in every phase: once it is spent no example runs (the search ends where
    it is); a failure found before is returned as shrunk so far (``stopped`` says "shrinking"), the caller
    replays it. ``seeds`` run first, in order, as Hypothesis explicit examples (they do not count against
    ``max_examples``); Hypothesis does not shrink those, so a failing seed goes to ``seed_shrinker`` (given the
    deadline; it returns the trace, the verdict and whether the deadline stopped it)."""
    started = time.monotonic()
    deadline = started + time_budget_s
    state = {"examples": 0, "requests": 0, "last_failure": None, "worst": 0.0, "seed_found": None}

    def check(trace: list[Draw]) -> None:
        if state["seed_found"] is not None:  # the remaining explicit examples: a seed already failed
            return
        if time.monotonic() > deadline:
            raise _BudgetSpent
        state["examples"] += 1
        state["requests"] += len(trace)
        fails, verdict, badness = judge(trace)
        state["worst"] = max(state["worst"], badness)
        if progress is not None and state["examples"] % 20 == 0:
            progress(f"{label}: {state['examples']} examples, worst {state['worst']:.2f}")
        if fails:
            state["last_failure"] = (list(trace), verdict)
            if state["examples"] <= len(seeds):  # the explicit phase runs every seed before generating
                state["seed_found"] = state["examples"]
            raise _Violation(verdict)

    database = DirectoryBasedExampleDatabase(str(database_dir)) if database_dir is not None else None
    test = settings(max_examples=max_examples, deadline=None, database=database, derandomize=False,
                    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink], print_blob=False,
                    suppress_health_check=list(HealthCheck))
    for trace in reversed(seeds):  # Hypothesis runs the last-applied example first
        check = example(trace)(check)
    test = seed(seed_value)(test(given(strategy)(check)))
    found, stopped = None, None
    try:
        with _hypothesis_home(database_dir):
            test()
    except _Violation:
        found = state["last_failure"]
    except _BudgetSpent:  # the failure judged last is the smallest the shrinker reached (it only tries smaller ones)
        found = state["last_failure"]
        stopped = "generating" if found is None else "shrinking"
    seed_found = state["seed_found"]
    if found is not None and seed_found is not None and seed_shrinker is not None:
        trace, verdict, cut = seed_shrinker(found[0], judge, deadline)
        found, stopped = (trace, verdict), ("shrinking" if cut else stopped)
    result = Hunt(state["examples"], time.monotonic() - started, seeds_run=min(len(seeds), state["examples"]),
                  seed_found=seed_found, requests_run=state["requests"], stopped=stopped)
    if found is not None:
        result.trace, result.verdict = found
    return result


def run_property(policy: Policy, workload: Workload, profile: Profile, prop: Property, max_examples: int,
                 time_budget_s: float, seed_value: int, database_dir: Path | None, max_requests: int = 20,
                 stresses: list[str] | None = None, progress: Callable[[str], None] | None = None,
                 corpus: SeedCorpus | None = None, min_requests: int = 1, max_segments: int = 3) -> PropertyResult:
    """One property's search. ``min_requests`` and ``max_segments`` shape the traces (see
    ``strategies.adversarial``; bench/fuzz_speed.py uses them for its 20-request traces)."""
    requests = request_maker(workload)

    def judge(trace: list[Draw]) -> tuple[bool, Outcome, float]:
        outcome = evaluate(prop, lazy_summary(simulate(policy, requests(trace), profile)))
        badness = outcome.observed / outcome.allowed if outcome.observed is not None and outcome.allowed else 0.0
        return not outcome.holds, outcome, badness

    bounds = ranges(workload)

    def shrink_seed(trace: list[Draw], judge_: Judge, deadline: float) -> tuple[list[Draw], object, bool]:
        smaller, verdict, _ = shrink(trace, lambda t: judge_(t)[:2], bounds, deadline)
        return smaller, verdict, time.monotonic() > deadline

    strategy = adversarial(workload, policy, max_requests, stresses, min_requests, max_segments)
    h = hunt(strategy, judge, max_examples, time_budget_s, seed_value, database_dir, f"{prop.name} (observed/allowed)",
             progress, corpus.windows if corpus else [], shrink_seed)
    result = PropertyResult(prop, h.examples, h.seconds, seeds_run=h.seeds_run, seed_found=h.seed_found,
                            requests_run=h.requests_run)
    if h.trace is not None:
        result.violated, result.trace, result.outcome = True, h.trace, h.verdict
        result.shrink_stopped = h.stopped == "shrinking"
    return result


def check_stresses(stresses: list[str] | None, policy: Policy) -> None:
    """Each --stress names a stress (one the policy can feel): InputError (exit 2) naming it otherwise."""
    for name in stresses or []:
        if name not in STRESSES:
            raise InputError(Problem("--stress", name, "one of: " + ", ".join(STRESSES)))
        if name == "blocked_grammars" and policy.queue.blocked_waiting == "off":
            raise InputError(Problem("--stress", name, "a stress the policy can feel: it draws structured-output "
                                     "requests whose grammar is not ready, which queue.blocked_waiting off ignores"))
        if name in CONNECTOR_STRESSES and not policy.connector.loads:
            raise InputError(Problem("--stress", name, "a stress the policy can feel: it draws loads from an external "
                                     "KV tier, and the policy has no loading connector (connector.kind offload, "
                                     "decode_node or both)"))


def run_fuzz(policy: PolicyInput, workload: str | Path, slo: str | Path | None = None,
             properties: list[str] | None = None, max_examples: int = 200, time_budget_s: float = 60.0,
             seed: int = 0, profile: str | Path | None = None, out_dir: str | Path | None = "counterexamples",
             database_dir: str | Path | None = ".batchcheck/hypothesis", max_requests: int = 20,
             stresses: list[str] | None = None, progress=None, seed_trace: str | Path | None = None,
             trace_options: TraceOptions | None = None, seed_windows: int = 20):
    """Search adversarial traces for SLO violations (one Hypothesis search per property); save and
    return the shrunk, replayed counterexamples. With ``seed_trace``, the trace's ``seed_windows`` busiest
    windows of at most ``max_requests`` requests run first (docs/fuzz.md, "Seeding from a real trace")."""
    pol = load_policy(policy)
    wl, slo_path, chosen = load_slo(workload, slo, properties)
    check_stresses(stresses, pol)
    prof = load_profile(profile)
    corpus = None
    if seed_trace is not None:
        if seed_windows < 1:
            raise InputError(Problem("--seed-windows", seed_windows, "at least 1"))
        corpus = seed_corpus(trace_requests(seed_trace, trace_options), wl, max_requests, seed_windows, str(seed_trace))
    results = []
    for prop in chosen:
        result = run_property(pol, wl, prof, prop, max_examples, time_budget_s / len(chosen), seed,
                              Path(database_dir) if database_dir is not None else None, max_requests, stresses, progress,
                              corpus)
        if corpus is not None:
            result.seed_notes = corpus.notes(str(seed_trace))
        if result.violated and out_dir is not None:
            requests = to_requests(result.trace, wl, "fuzz")
            search = {"seed": seed, "max_examples": max_examples, "examples_run": result.examples,
                      "stresses": stresses or default_stresses(pol), "max_requests_per_stress": max_requests,
                      "workload": str(workload), "slo": str(slo_path)}
            if seed_trace is not None:
                search.update(seed_trace=str(seed_trace), seed_windows_run=result.seeds_run,
                              found_in_seed_window=result.seed_found)
            doc = fuzz_cex.build(pol, policy_source(policy), prof, prop, result.outcome, requests, search)
            replayed = fuzz_cex.replay(doc)
            if not replayed.violated:
                raise InternalError(f"the shrunk trace for {prop.name} does not fail when replayed "
                                    f"(observed {replayed.outcome.observed}, allowed {replayed.outcome.allowed})")
            result.counterexample = save(doc, Path(out_dir))
        results.append(result)
    return results
