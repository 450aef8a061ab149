"""Pinning the symbolic step to the engine's step: one state, one step, field by field.

``capture`` reads a SchedulerState (before a step) as plain ints; ``outputs_of_engine`` reads the state
after the engine's step; ``IntBackend`` / ``Z3Backend`` evaluate the symbolic step on the captured
inputs. A mismatch is a drift between the engine and the encoder: a bug in batchcheck.
"""

from __future__ import annotations

from dataclasses import dataclass

from checker.policy import Policy
from checker.semantics.decision import StepDecision
from checker.semantics.state import FIELDS, Request, SchedulerState
from checker.smt.encode import SlotParams, SlotState, StepResult, symbolic_step
from checker.smt.ops import IntOps, Z3Ops, bool_var, int_var, pin_and_eval

PARAM_FIELDS = ("arrival_us", "prompt_len", "output_len", "max_output", "priority", "tenant")
OUTPUT_NAMES = tuple(f"{f}" for f in FIELDS) + ("scheduled",)


@dataclass(frozen=True)
class Captured:
    """Everything one step reads, as plain ints."""

    params: tuple[tuple[int, ...], ...]  # per slot, PARAM_FIELDS
    slots: tuple[tuple[int, ...], ...]  # per slot, FIELDS
    next_seq: int
    step: int
    counters: tuple[int, ...]
    now_us: int
    cancels: tuple[bool, ...]


def capture(s: SchedulerState, cancels: list[Request], now_us: int) -> Captured:
    cancelled = {r.rid for r in cancels}
    return Captured(
        params=tuple((r.arrival_us, r.prompt_len, r.output_len, r.max_output, r.priority, r.tenant)
                     for r in s.requests),
        slots=tuple(r.snapshot() for r in s.requests),
        next_seq=s.next_seq, step=s.step, counters=tuple(s.tenant_counters), now_us=now_us,
        cancels=tuple(r.rid in cancelled for r in s.requests))


def outputs_of_engine(s: SchedulerState, d: StepDecision) -> dict[str, int]:
    scheduled = dict(d.scheduled)
    out: dict[str, int] = {}
    for r in s.requests:
        for name, value in zip(FIELDS, r.snapshot()):
            out[f"slot{r.rid}.{name}"] = value
        out[f"slot{r.rid}.scheduled"] = scheduled.get(r.rid, 0)
    out["next_seq"] = s.next_seq
    out["step"] = s.step
    for t, c in enumerate(s.tenant_counters):
        out[f"counter{t}"] = c
    out["kv_used"] = s.kv_used
    out["swap_used"] = s.swap_used
    return out


def _flatten(result: StepResult) -> dict[str, object]:
    out: dict[str, object] = {}
    for i, slot in enumerate(result.state.slots):
        for name in FIELDS:
            out[f"slot{i}.{name}"] = slot[name]
        out[f"slot{i}.scheduled"] = result.scheduled[i]
    out["next_seq"] = result.state.next_seq
    out["step"] = result.state.step
    for t, c in enumerate(result.state.counters):
        out[f"counter{t}"] = c
    out["kv_used"] = result.state.kv_used
    out["swap_used"] = result.state.swap_used
    return out


def _state(slots: list[dict], next_seq, step, counters) -> SlotState:
    return SlotState(slots=slots, next_seq=next_seq, step=step, counters=list(counters))


def int_outputs(policy: Policy, c: Captured) -> dict[str, int]:
    """The symbolic step evaluated on ints."""
    params = [SlotParams(*p) for p in c.params]
    slots = [dict(zip(FIELDS, values)) for values in c.slots]
    result = symbolic_step(IntOps, policy, params, _state(slots, c.next_seq, c.step, c.counters),
                           c.now_us, list(c.cancels))
    return {k: int(v) for k, v in _flatten(result).items()}


class Z3Step:
    """The symbolic step over z3 variables, built once per (policy, slots, tenants) and then
    evaluated by pinning the variables to a captured state."""

    def __init__(self, policy: Policy, num_slots: int, num_tenants: int):
        self.params = [SlotParams(*(int_var(f"{f}_{i}") for f in PARAM_FIELDS)) for i in range(num_slots)]
        self.slots = [{f: int_var(f"{f}_{i}") for f in FIELDS} for i in range(num_slots)]
        self.next_seq = int_var("next_seq")
        self.step = int_var("step")
        self.counters = [int_var(f"counter_{t}") for t in range(num_tenants)]
        self.now = int_var("now_us")
        self.cancels = [bool_var(f"cancel_{i}") for i in range(num_slots)]
        result = symbolic_step(Z3Ops, policy, self.params, _state(self.slots, self.next_seq, self.step, self.counters),
                               self.now, self.cancels)
        flat = _flatten(result)
        self.names = list(flat)
        self.terms = list(flat.values())

    def evaluate(self, c: Captured) -> dict[str, int]:
        pins: list[tuple[object, object]] = []
        for prm, values in zip(self.params, c.params):
            pins += list(zip((getattr(prm, f) for f in PARAM_FIELDS), values))
        for slot, values in zip(self.slots, c.slots):
            pins += [(slot[f], v) for f, v in zip(FIELDS, values)]
        pins += [(self.next_seq, c.next_seq), (self.step, c.step), (self.now, c.now_us)]
        pins += list(zip(self.counters, c.counters))
        pins += list(zip(self.cancels, c.cancels))
        values = pin_and_eval(pins, self.terms)
        return {name: int(v) for name, v in zip(self.names, values)}


def differences(expected: dict[str, int], got: dict[str, int]) -> list[str]:
    return [f"{k}: engine={expected[k]} symbolic={got.get(k)}" for k in expected if got.get(k) != expected[k]]
