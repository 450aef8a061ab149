"""Side condition 1 of the any-N proof, proved for a fixed N: from every state of N slots that satisfies the proof's
predicate (the candidates that survived, on all N slots), a round of the concrete step and the instance extracted
from it (checker/verify/anyn_model.py) compute the same thing.

For each pass and each (cursor, victim) pair of slot indices (or none), one z3 query: the concrete N-slot round and
the instance on [cursor, victim, bystander] with the sums over the other slots; unsat when every kept slot's fields, per-slot
step and loop variables, the step's globals and next_seq agree, the other slots are untouched and the extraction's
assumptions hold. The random comparison (anyn_conformance.py) covers N = 1..6 on sampled states; this covers every
state of the given N (every verify --any-n run at anyn.SYMBOLIC_SIZES, N = 2..5; tests/conformance/
test_anyn_conformance.py at N = 4 on four policies, and with wrong instances that it must catch).
"""

from __future__ import annotations

import time

from checker.policy import Policy
from checker.semantics.state import FIELDS, Status
from checker.smt.encode import SlotParams, SymbolicStep
from checker.smt.ops import SmtSession, Z3Ops, sum_terms
from checker.verify.anyn import Instances, candidate_terms
from checker.verify.anyn_conformance import _pad
from checker.verify.anyn_model import (STATUSES, Rest, RestState, RestStep, Scene, blank_fields, copy_loop, empty_rest,
                                        limit_choices)

STEP_FIELDS = ("sched", "grown", "preempted", "admitted")
QUERIES = [0]  # equality queries posed (cases that can happen), for the verdict line
PAD_PARAMS = SlotParams(10**9, 1, 1, 1, 0, 0)  # a slot that never arrives (fills the instance where N is small)
PAD_STEP = {"sched": 0, "grown": 0, "preempted": False, "admitted": False}
GLOBALS = ("budget", "prefill_budget", "running", "growth_preempted")


def _concrete(step: RestStep) -> SymbolicStep:
    """The plain step over the same variables (no redirected reads)."""
    plain = SymbolicStep(step.o, step.p, step.params, step.s, step.now, step.cancels)
    for name in STEP_FIELDS:
        setattr(plain, name, list(getattr(step, name)))
    for name in GLOBALS + ("running_at_start", "threshold"):
        if hasattr(step, name):  # a step boundary has no budgets yet
            setattr(plain, name, getattr(step, name))
    return plain


def _victim_candidates(step: SymbolicStep, kind: str) -> list | None:
    o, p, n = step.o, step.p, step.n
    if kind == "WaitingPass":
        if not p.preempts_on_inversion:
            return None
        return [o.and_(step.st(i) == int(Status.RUNNING), o.not_(step.admitted[i])) for i in range(n)]
    if not p.preempts_on_growth:
        return None
    return [step.st(i) == int(Status.RUNNING) for i in range(n)]


def check_rounds(policy: Policy, n: int, alive: dict[str, list[str]], timeout_s: float = 120.0) -> list[str]:
    """Every pass, every (cursor, victim): the problems found ("sat"/"unknown" with the case), empty when proved."""
    inst = Instances(policy)
    problems: list[str] = []

    deadline = time.monotonic() + timeout_s
    for k, kind in enumerate(inst.kinds()):
        for c in [None] + list(range(n)):
            for v in [None] + list(range(n)):
                left = deadline - time.monotonic()
                if left <= 0:
                    return problems + [f"pass {k}: timeout"]
                answer = _check_case(inst, k, kind, n, c, v, set(alive[f"M{k}"]), left)
                if answer != "unsat":
                    problems.append(f"round of pass {k} ({kind}), N={n}, cursor={c}, victim={v}: {answer}")
    return problems


def _check_case(inst: Instances, k: int, kind: str, n: int, c: int | None, v: int | None, alive: set[str],
                timeout_s: float) -> str:
    o = Z3Ops
    smt = SmtSession(timeout_ms=max(1, int(timeout_s * 1000)))
    rest0 = empty_rest()
    base, cons = inst._step(smt, "", n, rest0, mid=True)
    loop = inst._loop(smt, "loop_", k, n)
    smt.add(*cons)
    conc = _concrete(base)
    scene = Scene(base, loop, list(base.sched), rest0, kind)
    smt.add(*(t for _, t in candidate_terms(inst.policy, kind, scene, alive)))
    cand = [scene.cand(i) for i in range(n)]
    keys = [scene.key(i) for i in range(n)]
    sel = conc.first(cand, keys)
    smt.add(*(sel[i] == (i == c) for i in range(n)))
    smt.add(*(o.or_(o.not_(scene.reached(i)), sel[i]) for i in range(n)))  # fixed tokens only at the cursor
    vc = _victim_candidates(conc, kind)
    if vc is None and v is not None:
        return "unsat"  # no victims in this pass: nothing to check
    if vc is not None:
        vsel = conc.last(vc, [conc.victim_key(i) for i in range(n)])
        smt.add(*(vsel[i] == (i == v) for i in range(n)))
    first = 0 if c is None else c
    other = v if v is not None and v != first else next(i for i in range(n) if i != first)
    bystander = next((i for i in range(n) if i not in (first, other)), -1)  # -1: a pad (never arrives)
    kept = [first, other, bystander]  # the proof's instance (anyn.KEPT slots)
    others = [i for i in range(n) if i not in kept]
    counts = {int(s): sum_terms([o.b2i(base.st(i) == int(s)) for i in others]) for s in STATUSES}
    rest = Rest(sum_terms([base.s.slots[i]["blocks"] for i in others]), sum_terms([base.sched[i] for i in others]),
                counts, o.or_(*(cand[i] for i in others)))
    state = RestState([dict(base.s.slots[i]) if i >= 0 else blank_fields() for i in kept], base.s.next_seq,
                      base.s.step, [0], rest_blocks=rest.blocks)
    choice = v is not None and v == other
    ins = RestStep(o, inst.policy, [base.params[i] if i >= 0 else PAD_PARAMS for i in kept], state, base.now,
                   [base.cancels[i] if i >= 0 else False for i in kept], rest, lambda name: choice)
    for name in STEP_FIELDS:
        setattr(ins, name, [getattr(base, name)[i] if i >= 0 else PAD_STEP[name] for i in kept])
    for name in GLOBALS + ("running_at_start", "threshold"):
        setattr(ins, name, getattr(base, name))
    iloop = {name: [val[i] if i >= 0 else _pad(name) for i in kept] if isinstance(val, list) else val
             for name, val in loop.items()}
    cloop = copy_loop(loop)
    before = [dict(slot) for slot in conc.s.slots]
    inst.passes[k].round(conc, cloop)
    inst.passes[k].round(ins, iloop)
    same = list(ins.assumed)
    for j, i in enumerate(kept):
        if i < 0:
            continue
        same += [conc.s.slots[i][f] == ins.s.slots[j][f] for f in FIELDS]
        same += [getattr(conc, name)[i] == getattr(ins, name)[j] for name in STEP_FIELDS]
        same += [_eq(cloop[name][i], iloop[name][j]) for name, val in cloop.items() if isinstance(val, list)]
    same += [_eq(val, iloop[name]) for name, val in cloop.items() if not isinstance(val, list)]
    same += [getattr(conc, name) == getattr(ins, name) for name in GLOBALS] + [conc.s.next_seq == ins.s.next_seq]
    for i in others:
        same += [conc.s.slots[i][f] == before[i][f] for f in FIELDS] + [conc.sched[i] == base.sched[i]]
    if smt.check() == "unsat":
        return "unsat"  # the case cannot happen (e.g. a cursor that is no candidate)
    QUERIES[0] += 1
    broken = smt.bool_var("instance_differs")
    smt.add(smt.implies(broken, o.not_(o.and_(*same))))
    return smt.check(broken)


def _eq(a, b):
    if isinstance(a, tuple):
        return Z3Ops.and_(*(x == y for x, y in zip(a, b)))
    return a == b


def check_maps(policy: Policy, n: int, alive: dict[str, list[str]], timeout_s: float = 120.0) -> list[str]:
    """The per-slot maps (prefix, each pass start, completion): for every state of n slots satisfying the predicate
    where the map starts, each slot's result (fields, tokens, per-slot loop variables) is the one-slot instance's
    with the other slots summed."""
    inst = Instances(policy)
    last = len(inst.passes) - 1
    maps = [("prefix", "P", None), ("complete", f"M{last}", last)] + \
        [(f"pass {k} start", f"M{k - 1}", k - 1) for k in range(1, last + 1)]
    problems = []
    deadline = time.monotonic() + timeout_s
    for name, loc, k in maps:
        for i in range(n):
            left = deadline - time.monotonic()
            if left <= 0:
                return problems + [f"{name}: timeout"]
            answer = _check_map(inst, name, loc, k, n, i, set(alive[loc]), left)
            if answer != "unsat":
                problems.append(f"{name}, N={n}, slot {i}: {answer}")
    return problems


def _run_map(inst: Instances, name: str, step: SymbolicStep):
    if name == "prefix":
        step.sched = [0] * step.n
        return step.prefix(inst.passes)
    if name == "complete":
        step.complete()
        return None
    return inst.passes[int(name.split()[1])].start(step)


def _check_map(inst: Instances, name: str, loc: str, k: int | None, n: int, i: int, alive: set[str],
               timeout_s: float) -> str:
    o = Z3Ops
    smt = SmtSession(timeout_ms=max(1, int(timeout_s * 1000)))
    rest0 = empty_rest()
    mid = name != "prefix"
    base, cons = inst._step(smt, "", n, rest0, mid=mid)
    loop = inst._loop(smt, "loop_", k, n) if k is not None else None
    smt.add(*cons)
    kind = inst.location_kind(loc)
    scene = Scene(base, loop, list(base.sched), rest0, "" if kind == "P" else kind)
    smt.add(*(t for _, t in candidate_terms(inst.policy, kind, scene, alive)))
    conc = _concrete(base)
    others = [j for j in range(n) if j != i]
    counts = {int(s): sum_terms([o.b2i(base.st(j) == int(s)) for j in others]) for s in STATUSES}
    rest = Rest(sum_terms([base.s.slots[j]["blocks"] for j in others]), sum_terms([base.sched[j] for j in others]),
                counts, False)
    state = RestState([dict(base.s.slots[i])], base.s.next_seq, base.s.step, [0], rest_blocks=rest.blocks)
    pre_i = dict(conc.s.slots[i])
    cloop = _run_map(inst, name, conc)
    choices = limit_choices(o, pre_i, conc.s.slots[i], 0)  # the concrete arrival's answers (a witness)
    ins = RestStep(o, inst.policy, [base.params[i]], state, base.now, [base.cancels[i]], rest,
                   lambda key: choices[key])
    for f in STEP_FIELDS:
        setattr(ins, f, [getattr(base, f)[i]])
    if mid:
        for f in GLOBALS + ("running_at_start", "threshold"):
            setattr(ins, f, getattr(base, f))
    iloop = _run_map(inst, name, ins)
    same = [conc.s.slots[i][f] == ins.s.slots[0][f] for f in FIELDS] + [conc.sched[i] == ins.sched[0]]
    same += [_eq(val[i], iloop[key][0]) for key, val in (cloop or {}).items()
             if isinstance(val, list) and key != "keys"]
    if smt.check() == "unsat":
        return "unsat"
    QUERIES[0] += 1
    broken = smt.bool_var("instance_differs")
    smt.add(smt.implies(broken, o.not_(o.and_(*same))))
    return smt.check(broken)
