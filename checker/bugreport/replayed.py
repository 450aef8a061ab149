"""A counterexample replayed on the engine: the per-iteration decisions a report is drawn from.

An invariant counterexample is replayed on the verifier's fixed clock (checker/verify/replay.py), up to
the iteration at which it fails; an SLO counterexample is simulated with its stored profile
(checker/fuzz/counterexample.py); a lasso file (``batchcheck liveness``) is replayed like an invariant one,
its prefix and two turns of its cycle on the fixed clock, the liveness property failing at the last
iteration exactly when the cycle repeats (checker/liveness/properties.py). All under the policy stored in
the file.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from checker.bugreport.document import CounterexampleDoc, load_counterexample
from checker.semantics.decision import StepDecision
from checker.requests import RequestSpec
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
    lasso: LassoSpan | None = None  # a liveness counterexample: where its prefix and cycle lie


@dataclass(frozen=True)
class LassoSpan:
    """A lasso replayed as ``prefix`` iterations then two turns of a ``cycle``-iteration cycle, and what the
    engine's replay did on it (read from the replayed frames, checker/liveness/properties.py)."""

    prefix: int
    cycle: int
    closes: bool  # the canonical state after the prefix, after one turn and after two turns is the same
    live_at_start: list[int]  # live requests (arrival order) when the cycle starts
    live_through: list[int]  # those of them live after every iteration of both turns
    tokens: tuple[int, int]  # tokens scheduled in turn 1, turn 2
    finished: tuple[list[int], list[int]]  # requests that finished in turn 1, turn 2
    cancelled: tuple[list[int], list[int]]  # requests a client cancelled in turn 1, turn 2
    idle_live: bool  # every iteration of both turns starts with live requests and schedules no token

    def turn(self, j: int) -> range:
        """The iterations of turn j (1 or 2) of the cycle."""
        start = self.prefix + (j - 1) * self.cycle
        return range(start, start + self.cycle)

    def part(self, k: int) -> str:
        """Which part of the lasso iteration k is in."""
        return "prefix" if k < self.prefix else f"cycle, turn {1 + (k - self.prefix) // self.cycle}"


def _lasso_span(ctx, decisions: list[StepDecision], prefix: int, cycle: int) -> LassoSpan:
    from checker.liveness.properties import _live, _tokens, lasso_closes

    turns = [range(prefix + j * cycle, prefix + (j + 1) * cycle) for j in range(2)]
    both = range(prefix, prefix + 2 * cycle)
    start = _live(ctx, prefix - 1)
    through = [i for i in start if all(i in _live(ctx, t) for t in both)]

    def per_turn(event: str) -> tuple[list[int], list[int]]:
        first, second = ([rid for t in turn for rid in getattr(decisions[t], event)] for turn in turns)
        return first, second

    return LassoSpan(
        prefix, cycle, lasso_closes(ctx, prefix, cycle), start, through,
        (sum(_tokens(ctx, t) for t in turns[0]), sum(_tokens(ctx, t) for t in turns[1])),
        per_turn("finished"), per_turn("cancelled"),
        all(_live(ctx, t - 1) and not _tokens(ctx, t) for t in both))


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
    lasso = _lasso_span(r.ctx, r.decisions, doc.prefix, doc.cycle) if doc.is_lasso else None
    label = inv.name if lasso else _label(inv.name, params)
    if lasso is not None and report.violation is None:
        verdict = (f"{label} holds on the replay: the lasso does not reproduce, the engine no longer fails it "
                   f"(recorded: the cycle closes at iteration {report.recorded_violation})")
    elif lasso is not None:
        verdict = (f"{label} VIOLATED: the cycle repeats, closing at iteration {report.violation} (recorded: "
                   f"iteration {report.recorded_violation})")
    elif report.violation is None:
        verdict = f"{label} holds on the replay: the engine no longer fails it (recorded: iteration " \
                  f"{report.recorded_violation})"
    else:
        verdict = f"{label} VIOLATED at iteration {report.violation} (recorded: iteration {report.recorded_violation})"
    step_ms = doc.clock.step_us / MS_PER_S
    return ReplayedCounterexample(
        path, doc, [q.spec for q in r.state.requests], [], r.decisions,
        [float(k) for k in range(len(r.decisions) + 1)], f"iteration (each {step_ms:g} ms)", True, label,
        inv.statement, report.violation is not None, verdict, report.violation, holds, lasso=lasso)


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


def replay_for_report(path: str | Path, invariant_modules: list[str] | None = None) -> ReplayedCounterexample:
    """Load, validate and replay a counterexample file (a user invariant's module loaded first: the
    ``invariant_modules`` given, else the one the file records). InputError (exit 2) on a bad file."""
    raw, doc = load_counterexample(path, invariant_modules)
    if doc.is_slo:
        return _replay_slo(Path(path), raw, doc)
    return _replay_invariant(Path(path), doc)
