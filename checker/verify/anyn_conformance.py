"""The any-N abstraction's side conditions, checked on concrete states (checker/verify/anyn.py).

For random states of N = 1..6 slots (that satisfy the facts the proof assumes: running slots with distinct
admission numbers, tokens scheduled only for running slots, a pass's fixed tokens only at its first candidate),
each action runs twice on plain ints: the concrete N-slot action (``SymbolicStep``), and the instance the proof
reasons about (``RestStep``: the cursor and the victim kept, the rest summed; a per-slot map on each slot alone).
They must agree on every kept slot's fields and per-slot step and loop variables and on the step's globals; the
other slots must be untouched by a round; the extraction's assumptions must hold; a map must keep the sums'
claims (blocks and the running count only fall, a pass start changes nothing). The invariants' sum forms
(anyn.aggregate_form) are compared with the catalogue's on the frames. A pool of the policy's size rarely fills
on small random states, so each state is also run on the policy with a pool of a few blocks (preemptions) and its
admission limits at a few requests (rejections at arrival).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from checker.frames import Frame, TraceContext
from checker.policy import Policy
from checker.semantics.state import FIELDS, Status
from checker.smt.encode import SlotParams, SlotState, SymbolicStep
from checker.smt.ops import IntOps, sum_terms
from checker.verify.anyn_model import STATUSES, Rest, RestState, RestStep, blank_fields, limit_choices
from invariants.catalogue import CATALOGUE

STEP_FIELDS = ("sched", "grown", "preempted", "admitted")
TENANTS = 2  # random states spread requests over two tenants (tenant_fair orders them by counters)
GLOBALS = ("budget", "prefill_budget", "running", "growth_preempted")


@dataclass
class Concrete:
    params: list[SlotParams]
    slots: list[dict[str, int]]
    next_seq: int
    step: int
    now: int
    cancels: list[bool]
    sched: list[int]
    grown: list[int]
    preempted: list[bool]
    admitted: list[bool]
    budget: int
    prefill_budget: int
    running: int
    growth_preempted: bool
    counters: tuple[int, ...] = (0,) * 2  # per tenant (tenant_fair's virtual token counters)


def random_state(policy: Policy, n: int, rng: random.Random) -> Concrete:
    params, slots, sched, grown = [], [], [], []
    next_seq = rng.randint(1, 3) + n
    seqs = rng.sample(range(1, next_seq), k=min(n, next_seq - 1))
    bs = policy.kv.block_size
    per = max(1, policy.kv.num_blocks // max(1, n))
    for i in range(n):
        prompt = rng.randint(1, min(policy.max_model_len - 1, 4 * bs * 8))
        out = rng.randint(1, 16)
        params.append(SlotParams(rng.randint(0, 5) * 1000, prompt, out, out + rng.randint(0, 8), rng.randint(0, 2),
                                 rng.randint(0, TENANTS - 1)))
        slot = blank_fields()
        status = rng.choice([Status.PENDING, Status.WAITING, Status.RUNNING, Status.RUNNING, Status.FINISHED,
                             Status.REJECTED, Status.CANCELLED])
        slot["status"] = int(status)
        slot["num_generated"] = rng.randint(0, out - 1) if status is not Status.PENDING else 0
        total = prompt + slot["num_generated"]
        s = 0
        if status is Status.RUNNING:
            slot["num_computed"] = rng.randint(0, total)
            s = rng.choice([0, 0, rng.randint(1, max(1, total - slot["num_computed"]))])
            slot["blocks"] = min(per, -(-(slot["num_computed"] + s) // bs) + rng.randint(0, 1))
            slot["admitted_seq"] = seqs[i] if i < len(seqs) else next_seq - 1
        elif status is Status.WAITING:
            slot["num_computed"] = 0
        elif status is Status.CANCELLED and rng.random() < 0.3:
            slot["blocks"] = rng.randint(1, per)
            slot["release_step"] = rng.randint(0, 3)
        slot["requeue_seq"] = rng.choice([0, rng.randint(1, next_seq)])
        slot["num_preemptions"] = rng.randint(0, 2)
        slots.append(slot)
        sched.append(s)
        grown.append(rng.randint(0, slot["blocks"]) if s else 0)
    b = policy.batch.max_num_batched_tokens
    budget = max(0, b - sum(sched))
    running = sum(1 for s in slots if s["status"] == int(Status.RUNNING))
    return Concrete(params, slots, next_seq, rng.randint(0, 5), rng.randint(0, 8) * 1000,
                    [rng.random() < 0.2 for _ in range(n)], sched, grown, [False] * n,
                    [rng.random() < 0.1 for _ in range(n)], budget, policy.batch.prefill_token_cap, running,
                    rng.random() < 0.2, tuple(rng.randint(0, 500) for _ in range(TENANTS)))


def _apply(step: SymbolicStep, c: Concrete, mid: bool, idx: list[int]) -> None:
    if mid:
        for name in STEP_FIELDS:
            setattr(step, name, [getattr(c, name)[i] for i in idx])
        for name in GLOBALS:
            setattr(step, name, getattr(c, name))
        step.running_at_start = c.running
        step.threshold = step.p.chunking.long_prefill_token_threshold
    else:
        step.sched = [c.sched[i] for i in idx]


def concrete_step(policy: Policy, c: Concrete, mid: bool) -> SymbolicStep:
    n = len(c.slots)
    state = SlotState([dict(s) for s in c.slots], c.next_seq, c.step, list(c.counters))
    step = SymbolicStep(IntOps, policy, list(c.params), state, c.now, list(c.cancels))
    _apply(step, c, mid, list(range(n)))
    return step


def rest_of(c: Concrete, kept: list[int], cand: bool) -> Rest:
    others = [i for i in range(len(c.slots)) if i not in kept]
    counts = {int(s): sum(1 for i in others if c.slots[i]["status"] == int(s)) for s in STATUSES}
    return Rest(sum(c.slots[i]["blocks"] for i in others), sum(c.sched[i] for i in others), counts, cand)


def instance_step(policy: Policy, c: Concrete, kept: list[int], rest: Rest, mid: bool,
                  choices: dict[str, bool]) -> RestStep:
    pad_params = SlotParams(10**9, 1, 1, 1, 0, 0)  # a slot that never arrives (N = 1: no second slot)
    params = [c.params[i] if i >= 0 else pad_params for i in kept]
    slots = [dict(c.slots[i]) if i >= 0 else blank_fields() for i in kept]
    # the proof's instance knows no tenant counters (they only order the queue, which it leaves free): zeros here,
    # the concrete step's own in concrete_step, so that a decision that read them would differ
    state = RestState(slots, c.next_seq, c.step, [0] * len(c.counters), rest_blocks=rest.blocks)
    cancels = [c.cancels[i] if i >= 0 else False for i in kept]
    step = RestStep(IntOps, policy, params, state, c.now, cancels, rest, lambda name: choices[name])
    padded = Concrete(c.params, c.slots + [blank_fields()], c.next_seq, c.step, c.now, c.cancels,
                      c.sched + [0], c.grown + [0], c.preempted + [False], c.admitted + [False], c.budget,
                      c.prefill_budget, c.running, c.growth_preempted, c.counters)
    _apply(step, padded, mid, [i if i >= 0 else len(c.slots) for i in kept])
    return step


def random_loop(step: SymbolicStep, kind: str, rng: random.Random) -> dict:
    """Loop variables of a pass that satisfy the structure the proof keeps (fixed tokens only at the first
    candidate; a waiting pass's untried snapshot is queued)."""
    n = step.n
    pass_ = {type(p).__name__: p for p in step.passes()}[kind]
    loop = pass_.start(step)
    if kind in ("WaitingPass", "MixedPass"):
        keys = rng.sample(range(100), n)
        loop["keys"] = [(keys[i], i) for i in range(n)]
    if "processed" in loop:
        loop["processed"] = [rng.random() < 0.3 for _ in range(n)]
    if "tried" in loop:
        loop["tried"] = [rng.random() < 0.3 for _ in range(n)]
    for name in ("enabled", "admitting"):
        if name in loop:
            loop[name] = rng.random() < 0.85
    if "stopped" in loop:
        loop["stopped"] = rng.random() < 0.15
    if "want" in loop:  # tokens fixed at the first candidate only
        cand = _cand(step, kind, loop)
        sel = step.first(cand, _keys(step, kind, loop))
        loop["want"] = [rng.randint(0, max(0, step.budget)) if sel[i] and rng.random() < 0.4 else -1
                        for i in range(n)]
    return loop


def _cand(step: SymbolicStep, kind: str, loop: dict) -> list:
    o, n = IntOps, step.n
    if kind == "RunningPass":
        return [o.and_(step.st(i) == int(Status.RUNNING), not loop["processed"][i]) for i in range(n)]
    if kind == "WaitingPass":
        return [loop["snapshot"][i] and not loop["tried"][i] for i in range(n)]
    return [loop["snapshot"][i] and not loop["processed"][i] for i in range(n)]


def _keys(step: SymbolicStep, kind: str, loop: dict) -> list[tuple]:
    if kind == "RunningPass":
        return [(step.s.slots[i]["admitted_seq"],) for i in range(step.n)]
    return list(loop["keys"])


def _victim(step: SymbolicStep, kind: str, cursor: int | None) -> int | None:
    """The slot a round would preempt (the concrete ``last``), computed before the round."""
    p, n = step.p, step.n
    if kind == "WaitingPass":
        if not p.preempts_on_inversion:
            return None
        cand = [step.st(i) == int(Status.RUNNING) and not step.admitted[i] for i in range(n)]
    else:
        if not p.preempts_on_growth:
            return None
        cand = [step.st(i) == int(Status.RUNNING) for i in range(n)]
    sel = step.last(cand, [step.victim_key(i) for i in range(n)])
    return next((i for i in range(n) if sel[i]), None)


def _loop_sub(loop: dict, idx: list[int], pad) -> dict:
    out = {}
    for k, v in loop.items():
        if isinstance(v, list):
            out[k] = [v[i] if i >= 0 else pad(k) for i in idx]
        else:
            out[k] = v
    return out


def _pad(name: str):
    return {"processed": True, "tried": True, "snapshot": False, "want": -1, "keys": (10**6, 9)}.get(name, False)


def compare_round(policy: Policy, c: Concrete, kind: str, k: int, rng: random.Random) -> list[str]:
    n = len(c.slots)
    conc = concrete_step(policy, c, mid=True)
    loop = random_loop(conc, kind, rng)
    cand = _cand(conc, kind, loop)
    sel = conc.first(cand, _keys(conc, kind, loop))
    cursor = next((i for i in range(n) if sel[i]), None)
    victim = _victim(conc, kind, cursor)
    first = cursor if cursor is not None else 0
    other = victim if victim not in (None, first) else next((i for i in range(n) if i != first), -1)
    bystander = next((i for i in range(n) if i not in (first, other)), -1)  # a rest slot kept whole (or a pad)
    kept = [first, other, bystander]
    rest_cand = any(cand[i] for i in range(n) if i not in kept)
    inst = instance_step(policy, c, kept, rest_of(c, kept, rest_cand), True,
                         {"victim_is_slot1": victim is not None and victim == other})
    iloop = _loop_sub(loop, kept, _pad)
    before = [dict(s) for s in conc.s.slots]
    passes = conc.passes()
    passes[k].round(conc, loop)
    inst.passes()[k].round(inst, iloop)
    where = f"round of pass {k} ({kind}), N={n}, cursor={cursor}, victim={victim}"
    out = [f"{where}: the extraction's assumption fails"] if not all(inst.assumed) else []
    for j, i in enumerate(kept):
        if i < 0:
            continue
        for f in FIELDS:
            if conc.s.slots[i][f] != inst.s.slots[j][f]:
                out.append(f"{where}: slot {i} {f}={inst.s.slots[j][f]} (expected {conc.s.slots[i][f]})")
        for name in STEP_FIELDS:
            if getattr(conc, name)[i] != getattr(inst, name)[j]:
                out.append(f"{where}: slot {i} {name}={getattr(inst, name)[j]} (expected {getattr(conc, name)[i]})")
        for name, v in loop.items():
            if isinstance(v, list) and v[i] != iloop[name][j]:
                out.append(f"{where}: slot {i} loop {name}={iloop[name][j]} (expected {v[i]})")
    for name, v in loop.items():
        if not isinstance(v, list) and v != iloop[name]:
            out.append(f"{where}: loop {name}={iloop[name]} (expected {v})")
    for name in GLOBALS:
        if getattr(conc, name) != getattr(inst, name):
            out.append(f"{where}: {name}={getattr(inst, name)} (expected {getattr(conc, name)})")
    if conc.s.next_seq != inst.s.next_seq:
        out.append(f"{where}: next_seq={inst.s.next_seq} (expected {conc.s.next_seq})")
    for i in range(n):
        if i not in kept and (conc.s.slots[i] != before[i] or conc.sched[i] != c.sched[i]):
            out.append(f"{where}: slot {i}, not kept, was changed by the round")
    return out


def compare_maps(policy: Policy, c: Concrete, rng: random.Random) -> list[str]:
    """The prefix, each pass start and the completion: the concrete N-slot map against the one-slot instance of
    each slot, and the sums' claims."""
    n = len(c.slots)
    out: list[str] = []
    passes = concrete_step(policy, c, mid=False).passes()

    def run(step, which: str, loop=None):
        if which == "prefix":
            step.sched = [0] * step.n
            return step.prefix(step.passes())
        if which == "complete":
            step.complete()
            return None
        return step.passes()[int(which)].start(step)

    for which in ["prefix", "complete"] + [str(k) for k in range(1, len(passes))]:
        mid = which != "prefix"
        conc = concrete_step(policy, c, mid)
        before = [dict(s) for s in conc.s.slots]
        kv0 = sum(s["blocks"] for s in before)
        run0 = sum(1 for s in before if s["status"] == int(Status.RUNNING))
        cloop = run(conc, which)
        for i in range(n):
            choices = limit_choices(IntOps, before[i], conc.s.slots[i], 0)  # the concrete arrival's answers
            inst = instance_step(policy, c, [i], rest_of(c, [i], False), mid, choices)
            iloop = run(inst, which)
            for f in FIELDS:
                if conc.s.slots[i][f] != inst.s.slots[0][f]:
                    out.append(f"{which}, N={n}: slot {i} {f}={inst.s.slots[0][f]} (expected {conc.s.slots[i][f]})")
            if conc.sched[i] != inst.sched[0]:
                out.append(f"{which}, N={n}: slot {i} sched={inst.sched[0]} (expected {conc.sched[i]})")
            for name, v in (cloop or {}).items():
                if isinstance(v, list) and name != "keys" and v[i] != iloop[name][0]:
                    out.append(f"{which}, N={n}: slot {i} loop {name}={iloop[name][0]} (expected {v[i]})")
        kv1 = sum(s["blocks"] for s in conc.s.slots)
        run1 = sum(1 for s in conc.s.slots if s["status"] == int(Status.RUNNING))
        if kv1 > kv0 or run1 > run0:
            out.append(f"{which}, N={n}: the sums grew (blocks {kv0}->{kv1}, running {run0}->{run1})")
        if which == "prefix" and (conc.running != run1 or conc.budget != policy.batch.max_num_batched_tokens):
            out.append(f"{which}, N={n}: running={conc.running} budget={conc.budget} (expected {run1}, "
                       f"{policy.batch.max_num_batched_tokens})")
        if which not in ("prefix", "complete") and conc.s.slots != before:
            out.append(f"pass start {which}, N={n}: a slot changed")
    return out


def compare_invariants(policy: Policy, c: Concrete) -> list[str]:
    from checker.verify.anyn import aggregate_form

    o = IntOps
    slots = tuple(c.slots)
    frame = Frame(slots, tuple(c.sched), tuple([False] * len(slots)), tuple([False] * len(slots)),
                  sum(s["blocks"] for s in slots), c.now, (0,))
    ctx = TraceContext(policy, tuple(c.params), [frame])
    kv = sum_terms([s["blocks"] for s in slots])
    run = sum(1 for s in slots if s["status"] == int(Status.RUNNING))
    out = []
    for name in ("kv_never_overcommitted", "seq_cap", "token_budget"):
        if bool(CATALOGUE[name].holds(o, ctx, 0)) != bool(aggregate_form(policy, name, o, kv, run, sum(c.sched))):
            out.append(f"{name}: the sum form differs from the catalogue's on a frame of N={len(slots)}")
    rc = CATALOGUE["request_conservation"]
    each = all(rc.holds(o, TraceContext(policy, (c.params[i],), [Frame((slots[i],), (c.sched[i],), (False,), (False,),
                                                                      slots[i]["blocks"], c.now, (0,))]), 0)
               for i in range(len(slots)))
    if bool(rc.holds(o, ctx, 0)) != each:
        out.append(f"request_conservation: not the conjunction of its one-slot forms on a frame of N={len(slots)}")
    return out


def compare_random(policy: Policy, states_per_size: int = 40, sizes: tuple[int, ...] = (1, 2, 3, 4),
                   seed: int = 0) -> tuple[list[str], int]:
    """Every comparison above on random states; returns (mismatches, states compared)."""
    rng = random.Random(seed)
    a = policy.admission  # the pool and the admission limits small enough for a few requests to reach them
    limits = {name: low for name, low in (("max_inflight", 2), ("max_queue_len", 1), ("max_queued_tokens", 64))
              if getattr(a, name) is not None}
    small = policy.model_copy(update={"kv": policy.kv.model_copy(update={"num_blocks": 12}),
                                      "admission": a.model_copy(update=limits)})
    mismatches: list[str] = []
    count = 0
    for pol in (policy, small):
        kinds = [type(p).__name__ for p in SymbolicStep(IntOps, pol, [], SlotState([], 0, 0, []), 0, []).passes()]
        for n in sizes:
            for _ in range(states_per_size):
                c = random_state(pol, n, rng)
                count += 1
                for k, kind in enumerate(kinds):
                    mismatches += compare_round(pol, c, kind, k, rng)
                mismatches += compare_maps(pol, c, rng)
                mismatches += compare_invariants(pol, c)
    return mismatches, count
