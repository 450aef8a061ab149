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
from checker.semantics.state import FIELDS, RequestSpec, SchedulerState
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
