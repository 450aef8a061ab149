"""Replaying a trace on the engine with the verifier's fixed clock, and checking invariants on it.

Iteration k starts at k * step_us; requests arrive and cancels apply at the first iteration whose
start is at or after their time (the same rule as the engine's ``simulate``, without idle skipping,
so iteration k here is iteration k in the solver's unrolling).
"""

from __future__ import annotations

from dataclasses import dataclass

from checker.engine import _Clock
from checker.frames import Frame, TraceContext, frame_from_engine, params_from_engine
from checker.policy import Policy
from checker.semantics.decision import StepDecision
from checker.semantics.state import FIELDS, SchedulerState
from checker.requests import RequestSpec
from checker.semantics.step import step
from checker.smt.ops import IntOps
from invariants.catalogue import Invariant


@dataclass
class Replay:
    state: SchedulerState
    frames: list[Frame]
    decisions: list[StepDecision]
    ctx: TraceContext


def replay_fixed_clock(policy: Policy, specs: list[RequestSpec], steps: int, step_us: int,
                       num_tenants: int = 1) -> Replay:
    s = SchedulerState(policy, specs, num_tenants=num_tenants)
    clock = _Clock(s.requests)
    frames: list[Frame] = []
    decisions: list[StepDecision] = []
    for k in range(steps):
        arrived, cancelled = clock.due(k * step_us)
        d = step(s, arrived, cancelled, k * step_us)
        decisions.append(d)
        frames.append(frame_from_engine(s, d))
    return Replay(s, frames, decisions, TraceContext(policy, params_from_engine(s), frames))


def first_violation(inv: Invariant, params: dict[str, int], replay: Replay) -> int | None:
    for t in range(len(replay.frames)):
        if not inv.holds(IntOps, replay.ctx, t, params):
            return t
    return None


def frame_differences(replay: Replay, solver_frames: list[dict]) -> list[str]:
    """Where the engine's frames differ from the solver's (empty: they agree on the whole trace)."""
    diffs = []
    for k, (mine, theirs) in enumerate(zip(replay.frames, solver_frames)):
        if mine.kv_used != theirs["kv_used"]:
            diffs.append(f"iteration {k}: kv_used engine={mine.kv_used} solver={theirs['kv_used']}")
        for i, slot in enumerate(theirs["requests"]):
            if i >= len(mine.slots):
                if slot["status"] != 0:
                    diffs.append(f"iteration {k}: request {i} is not in the replay but arrived in the solver's trace")
                continue
            for name in FIELDS:
                if mine.slots[i][name] != slot[name]:
                    diffs.append(f"iteration {k}: request {i} {name} engine={mine.slots[i][name]} solver={slot[name]}")
            for name, ours in (("scheduled", mine.scheduled[i]), ("produced", mine.produced[i]),
                               ("preempted", mine.preempted[i])):
                if ours != slot[name]:
                    diffs.append(f"iteration {k}: request {i} {name} engine={ours} solver={slot[name]}")
    return diffs


@dataclass
class ReplayReport:
    policy: Policy
    invariant: Invariant
    params: dict[str, int]
    replay: Replay
    violation: int | None  # first iteration at which the property fails, or None
    recorded_violation: int
    overrides: tuple[str, ...] = ()  # the recorded --set overrides applied to a policy given for the replay


def replay_counterexample(path, policy: Policy | None = None) -> ReplayReport:
    """Replay a counterexample file on the engine: under the policy it stores, or under ``policy``
    (to check whether a changed policy still fails on it)."""
    from checker.errors import InputError, Problem
    from checker.verify import counterexample as cex
    from invariants.catalogue import CATALOGUE

    doc = cex.load(path)
    prop = doc["property"]
    table = CATALOGUE
    if prop.get("kind") == "liveness":  # a lasso: the violation iteration closes the second turn of its cycle
        from checker.liveness.properties import LIVENESS as table
    if prop.get("kind") not in ("invariant", "liveness") or prop.get("name") not in table:
        raise InputError(Problem("property", prop.get("name"), "an invariant of the catalogue (load user invariants "
                                 "first), a liveness property or an SLO property"), str(path))
    overrides: tuple[str, ...] = ()
    if policy is None:  # the stored spec already has the overrides it was found with
        policy = Policy.model_validate(doc["policy"]["spec"])
    else:  # the file was found with --set overrides: a given policy is checked with them too
        from checker.inputfiles import apply_overrides

        overrides = tuple(doc.get("environment", {}).get("policy_overrides") or ())
        policy = apply_overrides(policy, list(overrides)) if overrides else policy
    specs = cex.specs_from_json(doc["requests"])
    inv = table[prop["name"]]
    params = {k: v for k, v in prop.get("params", {}).items() if k in inv.defaults}
    steps = doc["violation"]["iteration"] + 1
    tenants = max((s.tenant for s in specs), default=0) + 1
    replay = replay_fixed_clock(policy, specs, steps, doc["clock"]["step_us"], tenants)
    return ReplayReport(policy, inv, params, replay, first_violation(inv, params, replay), doc["violation"]["iteration"],
                        overrides)


def replay_table(report: ReplayReport) -> str:
    """One row per iteration: what the engine did, and whether the property held."""
    inv, params, r = report.invariant, report.params, report.replay
    label = inv.name + ("(" + ", ".join(f"{k}={v}" for k, v in params.items()) + ")" if params else "")
    rows = [("iter", "t_ms", "admitted", "scheduled (req:tokens)", "preempted", "finished", "cancelled",
             "kv_used", "run", "wait", label)]
    for k, d in enumerate(r.decisions):
        ok = inv.holds(IntOps, r.ctx, k, params)
        rows.append((str(k), f"{d.now_us / 1000:g}", ",".join(map(str, d.admitted)) or "-",
                     " ".join(f"{rid}:{n}" for rid, n in d.scheduled) or "-",
                     ",".join(map(str, d.preempted)) or "-", ",".join(map(str, d.finished)) or "-",
                     ",".join(map(str, d.cancelled)) or "-", f"{d.kv_blocks_used}/{report.policy.kv.num_blocks}",
                     str(d.num_running), str(d.num_waiting), "holds" if ok else "VIOLATED"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows)
