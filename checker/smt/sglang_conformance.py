"""Pinning the SGLang encoding (checker/smt/sglang.py) to the engine's step under SGLang's rules: one state, one
step, field by field, on ints (IntOps) and through z3 (every input pinned, the model read back).

``capture`` reads an engine state (before a step) as plain values, the ratio as the exact rational of its float;
``engine_outputs`` reads the state after the engine's step; ``int_outputs`` / ``Z3SGLangStep.evaluate`` the
encoding's. The ratio is compared within the encoding's own float bound (age x 2^-53); a step whose adder met an
ambiguous comparison (``inexact``) is reported, not compared (the encoding does not decide it). ``random_scenario``
makes the generated SGLang policies and requests the conformance suite drives.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from fractions import Fraction

from checker.policy import Policy
from checker.requests import RequestSpec
from checker.semantics.state import FIELDS, TERMINAL, Request, SchedulerState, Status
from checker.semantics.step import step
from checker.smt.encode import SlotParams
from checker.smt.ops import IntOps, Z3Ops, bool_var, int_var, pin_and_eval
from checker.smt.sglang import (SGLANG_FIELDS, ULP, SGLangGlobals, SGLangSlotState, ratio_unit, scaled,
                                sglang_step)

PARAM_FIELDS = ("arrival_us", "prompt_len", "output_len", "max_output", "priority", "tenant")
GLOBAL_FIELDS = ("chunked", "full", "shrunk", "ran_batch", "ratio", "age", "next_entry")


@dataclass(frozen=True)
class SGLangCaptured:
    params: tuple[tuple[int, ...], ...]
    slots: tuple[tuple[int, ...], ...]  # FIELDS + SGLANG_FIELDS
    globals: tuple  # GLOBAL_FIELDS
    next_seq: int
    step: int
    counters: tuple[int, ...]
    now_us: int
    cancels: tuple[bool, ...]


def _sglang_slot(s: SchedulerState, r: Request) -> tuple[int, ...]:
    g = s.sglang
    place = {q.rid: k for k, q in enumerate(s.running)}
    return (g.entry.get(r.rid, 0), place.get(r.rid, 0), int(r.rid in g.aborting))


def capture(s: SchedulerState, cancels: list[Request], now_us: int) -> SGLangCaptured:
    g = s.sglang
    cancelled = {r.rid for r in cancels}
    return SGLangCaptured(
        params=tuple((r.arrival_us, r.prompt_len, r.output_len, r.max_output, r.priority, r.tenant) for r in s.requests),
        slots=tuple(r.snapshot() + _sglang_slot(s, r) for r in s.requests),
        globals=(-1 if g.chunked is None else g.chunked, g.batch_is_full, g.shrunk, g.ran_batch, Fraction(g.ratio), 0,
                 g.next_entry),
        next_seq=s.next_seq, step=s.step, counters=tuple(s.tenant_counters), now_us=now_us,
        cancels=tuple(r.rid in cancelled for r in s.requests))


def engine_outputs(s: SchedulerState) -> dict[str, object]:
    """The state after the engine's step, as the encoding names it (an entry stamp only where it is read: a waiting
    request's)."""
    out: dict[str, object] = {}
    g = s.sglang
    for r in s.requests:
        entry, place, aborting = _sglang_slot(s, r)
        for name, value in zip(FIELDS, r.snapshot()):
            out[f"slot{r.rid}.{name}"] = value
        out[f"slot{r.rid}.entry"] = entry if r.status is Status.WAITING else None
        out[f"slot{r.rid}.rpos"] = place
        out[f"slot{r.rid}.aborting"] = aborting
    out.update({"chunked": -1 if g.chunked is None else g.chunked, "full": g.batch_is_full, "shrunk": g.shrunk,
                "ran_batch": g.ran_batch, "next_entry": g.next_entry, "next_seq": s.next_seq, "step": s.step,
                "kv_used": s.kv_used, "ratio": Fraction(g.ratio)})
    return out


def engine_scheduled(d) -> dict[int, int]:
    return dict(d.scheduled)


def _flatten(result, unit: int) -> dict[str, object]:
    st = result.state
    out: dict[str, object] = {}
    for i, slot in enumerate(st.slots):
        for name in FIELDS + SGLANG_FIELDS:
            out[f"slot{i}.{name}"] = slot[name]
        out[f"slot{i}.scheduled"] = result.scheduled[i]
    g = st.g
    out.update({"chunked": g.chunked, "full": g.full, "shrunk": g.shrunk, "ran_batch": g.ran_batch,
                "next_entry": g.next_entry, "next_seq": st.next_seq, "step": st.step, "kv_used": st.kv_used,
                "ratio": g.ratio, "age": g.age, "inexact": result.inexact, "unit": unit})
    return out


def _state(slots, g: SGLangGlobals, next_seq, step_, counters) -> SGLangSlotState:
    return SGLangSlotState(slots=slots, next_seq=next_seq, step=step_, counters=list(counters), g=g)


def _globals(c: SGLangCaptured, unit: int) -> tuple:
    """The captured globals with the ratio in the encoding's unit."""
    return c.globals[:4] + (scaled(c.globals[4], unit),) + c.globals[5:]


def int_outputs(policy: Policy, c: SGLangCaptured) -> dict[str, object]:
    params = [SlotParams(*p) for p in c.params]
    slots = [dict(zip(FIELDS + SGLANG_FIELDS, values)) for values in c.slots]
    most = max((p[3] for p in c.params), default=0)
    unit = ratio_unit(policy, len(params), most)
    state = _state(slots, SGLangGlobals(*_globals(c, unit)), c.next_seq, c.step, c.counters)
    return _flatten(sglang_step(IntOps, policy, params, state, c.now_us, list(c.cancels), most), unit)


class Z3SGLangStep:
    """The SGLang step over z3 variables, built once per (policy, slots, tenants, largest max_output)."""

    def __init__(self, policy: Policy, num_slots: int, num_tenants: int, most_output: int):
        self.params = [SlotParams(*(int_var(f"{f}_{i}") for f in PARAM_FIELDS)) for i in range(num_slots)]
        self.slots = [{f: int_var(f"{f}_{i}") for f in FIELDS + SGLANG_FIELDS} for i in range(num_slots)]
        self.globals = SGLangGlobals(int_var("chunked"), bool_var("full"), bool_var("shrunk"), bool_var("ran_batch"),
                                     int_var("ratio"), int_var("age"), int_var("next_entry"))
        self.next_seq, self.step, self.now = int_var("next_seq"), int_var("step"), int_var("now_us")
        self.counters = [int_var(f"counter_{t}") for t in range(num_tenants)]
        self.cancels = [bool_var(f"cancel_{i}") for i in range(num_slots)]
        state = _state(self.slots, self.globals, self.next_seq, self.step, self.counters)
        self.unit = ratio_unit(policy, num_slots, most_output)
        flat = _flatten(sglang_step(Z3Ops, policy, self.params, state, self.now, self.cancels, most_output), self.unit)
        self.names, self.terms = list(flat), list(flat.values())

    def evaluate(self, c: SGLangCaptured) -> dict[str, object]:
        pins: list[tuple[object, object]] = []
        for prm, values in zip(self.params, c.params):
            pins += list(zip((getattr(prm, f) for f in PARAM_FIELDS), values))
        for slot, values in zip(self.slots, c.slots):
            pins += [(slot[f], v) for f, v in zip(FIELDS + SGLANG_FIELDS, values)]
        g = self.globals
        pins += list(zip((g.chunked, g.full, g.shrunk, g.ran_batch, g.ratio, g.age, g.next_entry),
                         _globals(c, self.unit)))
        pins += [(self.next_seq, c.next_seq), (self.step, c.step), (self.now, c.now_us)]
        pins += list(zip(self.counters, c.counters)) + list(zip(self.cancels, c.cancels))
        return dict(zip(self.names, pin_and_eval(pins, self.terms)))


def differences(expected: dict[str, object], got: dict[str, object], scheduled: dict[int, int]) -> list[str]:
    """Where the encoding's step differs from the engine's (the ratio within the encoding's float bound)."""
    diffs = []
    for key, value in expected.items():
        if value is None:
            continue
        mine = got[key]
        if key == "ratio":
            exact = Fraction(int(mine), got["unit"])
            if abs(exact - value) > got["age"] * ULP:
                diffs.append(f"ratio: engine={float(value)!r} symbolic={float(exact)!r} age={got['age']}")
        elif int(mine) != int(value):
            diffs.append(f"{key}: engine={value} symbolic={mine}")
    for i in range(len([k for k in got if k.endswith(".scheduled")])):
        if int(got[f"slot{i}.scheduled"]) != scheduled.get(i, 0):
            diffs.append(f"slot{i}.scheduled: engine={scheduled.get(i, 0)} symbolic={got[f'slot{i}.scheduled']}")
    return diffs


# ----------------------------------------------------------------------------------------- generated scenarios
def random_policy(rng: random.Random) -> Policy:
    """A small SGLang policy (radix cache off, no priority preemption): pages of 1-4 tokens, a small pool, chunking
    on or off, mixed chunk, fcfs / lof / priority order, retraction by length or priority, the ratio's knobs."""
    page = rng.choice([1, 2, 4])
    chunking = rng.random() < 0.8
    chunk = page * rng.randint(1, 6)
    max_len = rng.choice([16, 32, 64])
    prefill = rng.randint(4, 48)
    priority = rng.random() < 0.3
    data = {"scheduler": "sglang", "max_model_len": max_len,
            "kv": {"block_size": page, "num_blocks": rng.randint(3, 40 // page + 3)},
            "batch": {"max_num_seqs": rng.randint(1, 4),
                      "max_num_batched_tokens": chunk if chunking else max_len + prefill,
                      "phase_mode": "prefill_first"},
            "chunking": {"enabled": chunking},
            "preemption": {"victim": rng.choice(["fewest_generated", "lowest_priority"]) if priority
                           else "fewest_generated"},
            "queue": {"order": "priority", "priority_polarity": rng.choice(["lower_first", "higher_first"])}
            if priority else {"order": "fcfs"},
            "sglang": {"max_prefill_tokens": prefill, "mixed_chunk": chunking and rng.random() < 0.4,
                       "schedule_policy": rng.choice(["fcfs", "lof"]),
                       "init_new_token_ratio": rng.choice([0.05, 0.05, 0.3, 0.7, 1.0]),
                       "min_new_token_ratio_factor": rng.choice([0.14, 0.5, 1.0]),
                       "new_token_ratio_decay_steps": rng.choice([1, 2, 5, 600]),
                       "retract_decode_steps": rng.choice([0, 1, 20]),
                       "clip_max_new_tokens": rng.choice([1, 1, 4, 4096])}}
    if rng.random() < 0.2:
        data["timeouts"] = {"queue_timeout_ms": rng.randint(1, 6)}
    return Policy.model_validate(data)


def random_specs(rng: random.Random, policy: Policy, n: int, step_us: int) -> list[RequestSpec]:
    """Requests for a policy: mostly prompts within half the pool and outputs that outgrow it (retractions), some
    cancelled while they run."""
    specs = []
    arrivals = sorted(rng.randint(0, 6) for _ in range(n))
    capacity = policy.kv.num_blocks * policy.kv.block_size
    for rid, a in enumerate(arrivals):
        output = rng.randint(1, 24)
        cancel = rng.choice([None, None, rng.randint(0, 10)])
        prompt = rng.randint(1, policy.max_model_len) if rng.random() < 0.2 else rng.randint(1, max(1, capacity // 2))
        specs.append(RequestSpec(rid=rid, arrival_us=a * step_us, prompt_len=prompt,
                                 output_len=output, max_output=output + rng.randint(0, 4), priority=rng.randint(0, 2),
                                 tenant=0, cls=0, cancel_us=None if cancel is None else (a + cancel) * step_us))
    return specs


def drive(policy: Policy, specs: list[RequestSpec], step_us: int, max_steps: int):
    """Step the engine one iteration per step_us; yield (inputs, outputs after, scheduled)."""
    s = SchedulerState(policy, specs, num_tenants=1)
    for k in range(max_steps):
        now = k * step_us  # the events due in (now - step_us, now], in request order (the engine's clock's order)
        arrived = [r for r in s.requests if now - step_us < r.arrival_us <= now or (k == 0 and r.arrival_us <= 0)]
        cancelled = [r for r in s.requests if r.spec.cancel_us is not None
                     and (now - step_us < r.spec.cancel_us <= now or (k == 0 and r.spec.cancel_us <= 0))]
        before = capture(s, cancelled, now)
        d = step(s, arrived, cancelled, now)
        yield before, engine_outputs(s), engine_scheduled(d)
        if all(r.status in TERMINAL for r in s.requests):
            return
