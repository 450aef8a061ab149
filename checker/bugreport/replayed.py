"""A counterexample replayed on the engine: the per-iteration decisions a report is drawn from.

An invariant counterexample is replayed on the verifier's fixed clock (checker/verify/replay.py), up to
the iteration at which it fails; an SLO counterexample is simulated with its stored profile
(checker/fuzz/counterexample.py). Both under the policy stored in the file.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from checker.bugreport.document import CounterexampleDoc, load_counterexample
from checker.semantics.decision import StepDecision
from checker.semantics.state import RequestSpec
from checker.smt.ops import IntOps

MS_PER_S = 1000.0
SECONDS_AXIS_FROM_MS = 10_000.0  # a time axis longer than this is drawn in seconds


@dataclass
class ReplayedCounterexample:
    path: Path
    doc: CounterexampleDoc
    specs: list[RequestSpec]
    class_names: list[str]
    decisions: list[StepDecision]
    edges: list[float]  # x boundaries of the iterations
    x_label: str
    iteration_axis: bool
    property_label: str  # e.g. decode_progress(gap=1)
    statement: str
    still_violated: bool  # the engine's replay fails the property too
    verdict_line: str  # what the replay found, one line
    violation: int | None  # the iteration at which it fails (invariants)
    holds: list[bool] | None  # per iteration (invariants)
    request_table: str | None = None  # SLO: per-request latencies of the replay


def _label(name: str, params: dict[str, int]) -> str:
    return name + ("(" + ", ".join(f"{k}={v}" for k, v in params.items()) + ")" if params else "")


def time_edges(decisions: list[StepDecision], end_us: int) -> tuple[list[float], str]:
    """Iteration boundaries in ms (or s for long runs): each iteration lasts until the next one starts."""
    edges_ms = [d.now_us / MS_PER_S for d in decisions] + [end_us / MS_PER_S]
    if edges_ms[-1] - edges_ms[0] > SECONDS_AXIS_FROM_MS:
        return [e / MS_PER_S for e in edges_ms], "time (s)"
    return edges_ms, "time (ms)"


def _replay_invariant(path: Path, doc: CounterexampleDoc) -> ReplayedCounterexample:
    from checker.verify.replay import replay_counterexample

    report = replay_counterexample(path)
    r, inv, params = report.replay, report.invariant, report.params
    holds = [bool(inv.holds(IntOps, r.ctx, k, params)) for k in range(len(r.frames))]
    label = _label(inv.name, params)
    if report.violation is None:
        verdict = f"{label} holds on the replay: the engine no longer fails it (recorded: iteration " \
                  f"{report.recorded_violation})"
    else:
        verdict = f"{label} VIOLATED at iteration {report.violation} (recorded: iteration {report.recorded_violation})"
    step_ms = doc.clock.step_us / MS_PER_S
    return ReplayedCounterexample(
        path, doc, [q.spec for q in r.state.requests], [], r.decisions,
        [float(k) for k in range(len(r.decisions) + 1)], f"iteration (each {step_ms:g} ms)", True, label,
        inv.statement, report.violation is not None, verdict, report.violation, holds)


def _replay_slo(path: Path, raw: dict, doc: CounterexampleDoc) -> ReplayedCounterexample:
    from checker.engine import simulate
    from checker.fuzz.counterexample import replay, request_set
    from checker.profile import Profile

    slo = replay(raw)
    requests = request_set(raw)
    result = simulate(slo.policy, requests, Profile.model_validate(raw["profile"]["spec"]), record=True)
    decisions = result.decisions or []
    edges, x_label = time_edges(decisions, result.end_us)
    o = slo.outcome
    verdict = (f"{slo.prop.name} VIOLATED: observed {o.observed} > allowed {o.allowed} ({o.detail})" if slo.violated
               else f"{slo.prop.name} holds on the replay (observed {o.observed}, allowed {o.allowed}): the engine "
                    "no longer fails it")
    statement = " ".join((type(slo.prop).__doc__ or "").split())
    return ReplayedCounterexample(path, doc, requests.specs, requests.class_names, decisions, edges, x_label, False,
                                  slo.prop.name, statement, slo.violated, verdict, None, None, slo.table)


def replay_for_report(path: str | Path) -> ReplayedCounterexample:
    """Load, validate and replay a counterexample file. InputError (exit 2) on a bad file."""
    raw, doc = load_counterexample(path)
    if doc.is_slo:
        return _replay_slo(Path(path), raw, doc)
    return _replay_invariant(Path(path), doc)
