"""Action-wise induction: prove a state invariant one scheduler action at a time.

The step (checker/smt/encode.py) is a sequence of actions: the prefix (release, arrive, cancel, expire,
and the schedule's start), the rounds of each pass (one slot's worth of work each), the hand-over from one
pass to the next, and the completion. Induction over whole steps asks z3 about 2N-3N nested rounds at once,
and the query grows far faster than N (docs/benchmarks.md). Here each action is checked alone, from any
values of the step's variables that satisfy a predicate at that point:

- P, at step boundaries (over the slots, as the monolithic induction's lemmas and the invariant), and
- M_k, between the actions of pass k (over the slots and the step's running variables: tokens scheduled
  per slot, budgets, the running count, blocks grown, and the pass's loop variables).

If the initial state satisfies P, the prefix takes P to M_0, every round of pass k keeps M_k, the hand-over
takes M_k to M_k+1 and the completion takes M_last to P, then P holds after every step of every run: the
step is defined as exactly these actions (``SymbolicStep.run``, pinned to the engine by tests/conformance),
and each action is checked from every state its predicate allows (a superset of the states it meets). So when the invariant is part of P, it is PROVED for N slots and any
number of iterations.

P and M_k are found by Houdini: start from candidate lemmas (the structural lemmas of the monolithic
induction, the invariant itself at every point, and facts about the step's running variables) and drop
every candidate some action, or the initial state, breaks, until none is dropped. What survives is
inductive. If the invariant is dropped the method fails (the caller falls back to whole-step induction);
the failure says which action broke it, which is no counterexample (the candidates may just be too weak).

Each surviving action query is written, one SMT-LIB2 block per action, as the certificate that
``batchcheck recheck`` re-checks with a fresh solver.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property

from checker.frames import Frame, TraceContext
from checker.policy import Allocation, Policy
from checker.semantics.state import Status
from checker.smt.encode import Pass, SlotParams, SlotState, SymbolicStep, refuse_proof_with_connector
from checker.smt.ops import CERTIFICATE_BLOCK, SmtSession, Term, Z3Ops, sum_terms
from checker.verify.budget import BuildTimeout, within
from checker.verify.env import Environment
from checker.verify.induction import (
    STATE_INVARIANTS,
    InductionResult,
    _symbolic_state,
    global_lemmas,
    lemmas,
    slot_ranges,
)
from checker.verify.vacuity import engine_witnesses
from invariants.catalogue import CATALOGUE, Invariant

Candidate = tuple[str, Callable[["View"], Term]]


@dataclass
class View:
    """What candidates read at one point of the step: the step's variables, and the pass's loop variables
    (None at step boundaries, where ``scheduled`` is the tokens of the step that just ended)."""

    step: SymbolicStep
    loop: dict | None
    scheduled: list[Term]
    produced: list[Term]
    structural: list[tuple[str, Term]] | None = None  # the structural lemmas here, built once

    @property
    def slots(self) -> list[dict[str, Term]]:
        return self.step.s.slots

    def frame(self) -> Frame:
        s = self.step.s
        return Frame(tuple(s.slots), tuple(self.scheduled), tuple(self.produced), tuple(self.step.preempted),
                     s.kv_used, s.step * self.step.env_step_us, tuple(s.counters))


@dataclass
class Action:
    name: str
    pre: str  # "P" or "M<k>"
    post: str
    run: Callable[[SmtSession, str], tuple[View, View]]  # builds the action from fresh variables


def supported(inv: Invariant) -> bool:
    return inv.name in STATE_INVARIANTS


class ActionModel:
    """The actions of one policy's step over N symbolic slots."""

    def __init__(self, policy: Policy, targets: tuple[Target, ...], env: Environment, tier: str = "full"):
        """``targets``: the invariants to prove (each a candidate at every point); ``tier``: "core" (the
        invariants, value ranges and the step's bookkeeping: small queries) or "full" (also every
        structural lemma)."""
        self.policy, self.targets, self.env, self.tier = policy, targets, env, tier
        self.n = env.requests
        probe = SymbolicStep(Z3Ops, policy, [], SlotState([], 0, 0, []), 0, [])
        self.passes: list[Pass] = probe.passes()

    # ------------------------------------------------------------------ fresh states
    def _boundary(self, smt: SmtSession, tag: str) -> tuple[list[SlotParams], SlotState, list[Term]]:
        return _symbolic_state(smt, self.env, self.n, tag)

    def _new_step(self, smt: SmtSession, tag: str, cancels: bool) -> SymbolicStep:
        params, state, cons = self._boundary(smt, tag)
        smt.add(*cons)
        c = [smt.bool_var(f"{tag}cancel_{i}") for i in range(self.n)] if cancels else [False] * self.n
        step = SymbolicStep(Z3Ops, self.policy, params, state, state.step * self.env.step_us, c)
        step.env_step_us = self.env.step_us
        return step

    def _mid_step(self, smt: SmtSession, tag: str) -> SymbolicStep:
        """A step stopped between two actions of its schedule, every running variable fresh."""
        return stop_mid_step(smt, self._new_step(smt, tag, cancels=False), tag)

    def _loop(self, smt: SmtSession, tag: str, pass_: Pass) -> dict:
        return fresh_loop(smt, tag, pass_, self.n)

    def _boundary_view(self, step: SymbolicStep, scheduled=None, produced=None) -> View:
        zeros = [0] * self.n
        return View(step, None, list(scheduled) if scheduled is not None else zeros,
                    list(produced) if produced is not None else [False] * self.n)

    # ------------------------------------------------------------------ actions
    def actions(self) -> list[Action]:
        out = [Action("prefix", "P", "M0", self._prefix)]
        for k, pass_ in enumerate(self.passes):
            out.append(Action(f"round of pass {k} ({type(pass_).__name__})", f"M{k}", f"M{k}",
                              lambda smt, tag, k=k: self._round(smt, tag, k)))
            if k + 1 < len(self.passes):
                out.append(Action(f"pass {k} -> pass {k + 1}", f"M{k}", f"M{k + 1}",
                                  lambda smt, tag, k=k: self._handover(smt, tag, k)))
        out.append(Action("complete", f"M{len(self.passes) - 1}", "P", self._complete))
        return out

    def _prefix(self, smt: SmtSession, tag: str) -> tuple[View, View]:
        step = self._new_step(smt, tag, cancels=True)
        before = SymbolicStep(Z3Ops, self.policy, step.params, step.s, step.now, step.cancels)
        before.env_step_us = self.env.step_us
        loop = step.prefix(self.passes)
        return self._boundary_view(before), View(step, loop, step.sched, [False] * self.n)

    def _round(self, smt: SmtSession, tag: str, k: int) -> tuple[View, View]:
        step = self._mid_step(smt, tag)
        loop = self._loop(smt, tag + "loop_", self.passes[k])
        pre = View(_snapshot(step), {k: list(v) if isinstance(v, list) else v for k, v in loop.items()},
                   list(step.sched), [False] * self.n)
        self.passes[k].round(step, loop)
        return pre, View(step, loop, step.sched, [False] * self.n)

    def _handover(self, smt: SmtSession, tag: str, k: int) -> tuple[View, View]:
        step = self._mid_step(smt, tag)
        loop = self._loop(smt, tag + "loop_", self.passes[k])
        pre = View(_snapshot(step), loop, list(step.sched), [False] * self.n)
        nxt = self.passes[k + 1].start(step)
        return pre, View(step, nxt, step.sched, [False] * self.n)

    def _complete(self, smt: SmtSession, tag: str) -> tuple[View, View]:
        step = self._mid_step(smt, tag)
        loop = self._loop(smt, tag + "loop_", self.passes[-1])
        pre = View(_snapshot(step), loop, list(step.sched), [False] * self.n)
        scheduled = list(step.sched)
        produced = step.complete()
        return pre, self._boundary_view(step, scheduled, produced)

    # ------------------------------------------------------------------ candidates
    @cached_property
    def lemma_names(self) -> list[str]:
        step = self._new_step(SmtSession(), "names_", cancels=False)
        s = step.s
        return [name for name, _ in lemmas(Z3Ops, self.policy, step.params, s.slots, s.step, s.next_seq,
                                           self.env.step_us)]

    def candidates(self, location: str) -> list[Candidate]:
        o, policy, n = Z3Ops, self.policy, self.n
        step_us = self.env.step_us

        def structural(v: View) -> list[tuple[str, Term]]:
            if v.structural is None:
                s = v.step.s
                v.structural = lemmas(o, policy, v.step.params, s.slots, s.step, s.next_seq, step_us)
            return v.structural

        if self.tier == "full":
            out: list[Candidate] = [(name, lambda v, j=j: structural(v)[j][1])
                                    for j, name in enumerate(self.lemma_names)]
        else:  # the core lemmas alone (building all the structural lemmas costs more than their check)
            out = [(f"slot{i}.ranges", lambda v, i=i: slot_ranges(o, v.slots[i], v.step.s.next_seq)) for i in range(n)]
            out += [(name, lambda v, j=j: global_lemmas(o, policy, v.slots, v.step.s.step)[j][1])
                    for j, (name, _) in enumerate(global_lemmas(o, policy, _blank_slots(n), 0))]
        out += [(target_name(inv, params), lambda v, inv=inv, params=params: inv.holds(o, _ctx(policy, v), 0, params))
                for inv, params in self.targets]
        most = o.ceil_div(policy.max_model_len, policy.kv.block_size)  # no sequence is longer than max_model_len
        out += [(f"slot{i}.blocks_bounded", lambda v, i=i: v.slots[i]["blocks"] <= most) for i in range(n)]
        # the negation of each target's trigger: when it survives, the situation never occurs (VACUOUS)
        out += [(NEVER + target_name(inv, params),
                 lambda v, inv=inv, params=params: o.not_(inv.triggered(o, _ctx(policy, v), 0, params)))
                for inv, params in self.targets]
        if location == "P":
            return out
        batch = policy.batch

        def held(v: View, i: int, tokens: Term) -> Term:
            prm = v.step.params[i]
            need = o.ceil_div(tokens, policy.kv.block_size)
            if policy.kv.allocation is Allocation.FULL_RESERVATION:
                cap = o.min(prm.prompt_len + prm.max_output, policy.max_model_len) - 1
                need = o.max(need, o.ceil_div(cap, policy.kv.block_size))
            return need

        def running(v: View, i: int) -> Term:
            return v.slots[i]["status"] == int(Status.RUNNING)

        out += [
            ("budget_account", lambda v: sum_terms(v.step.sched) + v.step.budget == batch.max_num_batched_tokens),
            ("budget_nonnegative", lambda v: v.step.budget >= 0),
            ("prefill_budget_nonnegative", lambda v: v.step.prefill_budget >= 0),
            ("prefill_budget_at_most_budget_cap", lambda v: v.step.prefill_budget <= batch.prefill_token_cap),
            ("running_count", lambda v: v.step.running == sum_terms([o.b2i(running(v, i)) for i in range(n)])),
        ]
        full = self.tier == "full"
        for i in range(n):
            out += [
                (f"slot{i}.sched_range", lambda v, i=i: o.and_(v.step.sched[i] >= 0, v.step.sched[i] <= batch.max_num_batched_tokens)),
                (f"slot{i}.sched_only_running", lambda v, i=i: o.or_(v.step.sched[i] == 0, running(v, i))),
                (f"slot{i}.grown_range", lambda v, i=i: o.and_(v.step.grown[i] >= 0, v.step.grown[i] <= v.slots[i]["blocks"])),
                (f"slot{i}.grown_only_scheduled", lambda v, i=i: o.or_(v.step.grown[i] == 0, v.step.sched[i] > 0)),
            ] + ([] if not full else [
                (f"slot{i}.running_holds_scheduled", lambda v, i=i: o.or_(o.not_(running(v, i)), o.and_(
                    v.slots[i]["blocks"] == held(v, i, v.slots[i]["num_computed"] + v.step.sched[i]),
                    v.slots[i]["num_computed"] + v.step.sched[i] <= v.step.params[i].prompt_len + v.slots[i]["num_generated"],
                    v.slots[i]["num_computed"] + v.step.sched[i] >= 1, v.slots[i]["swapped_blocks"] == 0))),
            ]) + [
                (f"slot{i}.running_admitted", lambda v, i=i: o.or_(o.not_(running(v, i)), v.slots[i]["admitted_seq"] >= 1)),
                (f"slot{i}.pending_in_future", lambda v, i=i: o.or_(
                    v.slots[i]["status"] != int(Status.PENDING), v.step.params[i].arrival_us > v.step.now)),
                (f"slot{i}.arrived_by_now", lambda v, i=i: o.or_(
                    v.slots[i]["status"] == int(Status.PENDING), v.step.params[i].arrival_us <= v.step.now)),
                (f"slot{i}.preempted_not_running", lambda v, i=i: o.or_(o.not_(v.step.preempted[i]), o.not_(running(v, i)))),
            ]
        kinds = self.passes[int(location[1:])].loop_kinds
        out += [("prefill_budget_account", lambda v: v.step.prefill_budget + sum_terms(
            [o.ite(v.step.in_prefill(v.step.view(i)), v.step.sched[i], 0) for i in range(n)]) == batch.prefill_token_cap)]
        for i in range(n):
            out += self._loop_candidates(kinds, i)
        return out

    def _loop_candidates(self, kinds: dict[str, str], i: int) -> list[Candidate]:
        """Facts about a pass's loop variables at slot i (what the pass start makes true and its rounds keep)."""
        o = Z3Ops

        def is_(v: View, *statuses: Status) -> Term:
            return v.step.is_(i, *statuses)

        def first_left(v: View) -> Term:
            """Slot i is the first request the pass has left (by its order): none before it is left."""
            if "keys" in kinds:
                left = [o.and_(v.loop["snapshot"][j], o.not_(v.loop["processed"][j])) for j in range(self.n)]
                keys = v.loop["keys"]
            else:
                left = [o.and_(v.step.st(j) == int(Status.RUNNING), o.not_(v.loop["processed"][j]))
                        for j in range(self.n)]
                keys = [(slot["admitted_seq"],) for slot in v.slots]
            return o.and_(*(o.not_(o.and_(left[j], v.step.lex_lt(keys[j], keys[i]))) for j in range(self.n) if j != i))

        out: list[Candidate] = []
        if "want" in kinds:
            def reached(v: View) -> Term:  # reached earlier in the pass, not done, still running (and left)
                left = v.loop["snapshot"][i] if "snapshot" in kinds else True
                return o.and_(v.loop["want"][i] >= 0, o.not_(v.loop["processed"][i]), is_(v, Status.RUNNING), left)

            def within(v: View) -> Term:
                want, step = v.loop["want"][i], v.step
                r = step.view(i)
                return o.and_(want <= step.budget, want <= r["prompt_len"] + r["num_generated"] - r["num_computed"],
                              o.or_(o.not_(step.in_prefill(r)), want <= step.prefill_budget))

            out += [(f"slot{i}.want_range", lambda v: v.loop["want"][i] >= -1),
                    (f"slot{i}.want_within_budget", lambda v: o.or_(o.not_(reached(v)), within(v))),
                    (f"slot{i}.want_only_first", lambda v: o.or_(o.not_(reached(v)), first_left(v)))]
        if "tried" in kinds:
            out += [(f"slot{i}.untried_waiting", lambda v: o.or_(o.not_(v.loop["snapshot"][i]), v.loop["tried"][i],
                                                                 is_(v, Status.WAITING, Status.SWAPPED))),
                    (f"slot{i}.snapshot_unpreempted", lambda v: o.or_(o.not_(v.loop["snapshot"][i]),
                                                                      o.not_(v.step.preempted[i])))]
        if "snapshot" in kinds and "processed" in kinds:
            out.append((f"slot{i}.unprocessed_live", lambda v: o.or_(
                o.not_(v.loop["snapshot"][i]), v.loop["processed"][i],
                is_(v, Status.RUNNING, Status.WAITING, Status.SWAPPED))))
        return out


def stop_mid_step(smt: SmtSession, step: SymbolicStep, tag: str) -> SymbolicStep:
    """The step stopped between two actions of its schedule: every running variable fresh."""
    n = step.n
    step.sched = [smt.int_var(f"{tag}sched_{i}") for i in range(n)]
    step.grown = [smt.int_var(f"{tag}grown_{i}") for i in range(n)]
    step.preempted = [smt.bool_var(f"{tag}preempted_{i}") for i in range(n)]
    step.admitted = [smt.bool_var(f"{tag}admitted_{i}") for i in range(n)]
    step.growth_preempted = smt.bool_var(f"{tag}growth_preempted")
    for name in ("budget", "prefill_budget", "running", "running_at_start"):
        setattr(step, name, smt.int_var(f"{tag}{name}"))
    return step


def fresh_loop(smt: SmtSession, tag: str, pass_: Pass, n: int) -> dict:
    """The pass's loop variables over n slots, fresh. Queue keys become any distinct order: an integer per slot,
    the slot index breaking ties (every order the real keys can give is one of these)."""
    loop: dict = {}
    for name, kind in pass_.loop_kinds.items():
        if kind == "bool":
            loop[name] = smt.bool_var(f"{tag}{name}")
        elif kind == "bools":
            loop[name] = [smt.bool_var(f"{tag}{name}_{i}") for i in range(n)]
        elif kind == "ints":
            loop[name] = [smt.int_var(f"{tag}{name}_{i}") for i in range(n)]
        else:  # "keys"
            loop[name] = [(smt.int_var(f"{tag}{name}_{i}"), i) for i in range(n)]
    return loop


def _blank_slots(n: int) -> list[dict[str, int]]:
    return [{"status": 0, "blocks": 0, "swapped_blocks": 0} for _ in range(n)]


def _snapshot(step: SymbolicStep) -> SymbolicStep:
    """A copy of the step's variables before an action runs (actions mutate the step in place)."""
    copy = SymbolicStep(step.o, step.p, step.params, step.s, step.now, step.cancels)
    copy.env_step_us = step.env_step_us
    for name in ("sched", "grown", "preempted", "admitted"):
        setattr(copy, name, list(getattr(step, name)))
    for name in ("growth_preempted", "budget", "prefill_budget", "running", "running_at_start"):
        setattr(copy, name, getattr(step, name))
    return copy


def _ctx(policy: Policy, v: View) -> TraceContext:
    return TraceContext(policy, tuple(v.step.params), [v.frame()])


Target = tuple[Invariant, dict[str, int]]
TIERS = ("core", "full")


NEVER = "never triggered: "


def target_name(inv: Invariant, params: dict[str, int]) -> str:
    return f"invariant {inv.name}" + "".join(f" {k}={v}" for k, v in sorted({**inv.defaults, **params}.items()))


@dataclass
class Houdini:
    """What survived: per location the candidate names, and the last sweep's queries (the certificate)."""

    status: str  # "done" or "unknown"
    alive: dict[str, set[str]]
    certificate: str = ""
    summary: str = ""
    broken_by: dict[str, str] = field(default_factory=dict)  # target -> the action that dropped it
    seconds: float = 0.0  # how long the run took


_DONE: dict[tuple, Houdini] = {}  # (policy, environment, targets, tier) -> result, within one process


def prove(policy: Policy, inv: Invariant, params: dict[str, int], env: Environment, timeout_s: float) -> InductionResult:
    """PROVED when the invariant survives Houdini over the actions (see the module docstring). The state
    invariants are proved together (one Houdini run serves all four; its result is kept for the next
    call), first with the core candidates, then with all."""
    refuse_proof_with_connector(policy)
    if not supported(inv):
        return InductionResult("unsupported")
    started = time.monotonic()
    name = target_name(inv, params)
    try:  # building the queries, the engine probes and the solving all count against timeout_s (issue 19)
        with _building(started + timeout_s):
            status, tier, result = _survives(policy, inv, params, env, name, timeout_s)
    except BuildTimeout:
        status = "unknown"
    if status == "unknown":
        return InductionResult("unknown", time.monotonic() - started)
    if status == "dropped":
        return _failed(started, result.broken_by.get(name, "initial state"))
    kept = sorted(n for n in result.alive["P"] if not n.startswith(("invariant ", NEVER)))
    return InductionResult("proved", time.monotonic() - started, kept, certificate=result.certificate, k=1,
                           cti=[f"{tier} candidates; {result.summary}"], tier=tier,
                           alive={loc: sorted(names) for loc, names in result.alive.items()})


def recheck_rebuilt(policy: Policy, inv: Invariant, params: dict[str, int], env: Environment, tier: str,
                    alive: dict[str, list[str]], timeout_s: float) -> tuple[str, str]:
    """Rebuild an action-wise proof from the policy and the candidates that survived (a certificate's binding)
    and decide it with fresh solvers: the invariant is among the step-boundary candidates, the initial state
    satisfies them, and each action, from the candidates where it starts, keeps the ones where it ends. Returns
    ("unsat", "") when the proof holds, else the solver's answer and where ("sat", "the prefix")."""
    model = ActionModel(policy, _targets(inv, params), env, tier)
    locations = ["P"] + [f"M{k}" for k in range(len(model.passes))]
    kept = {loc: set(alive.get(loc, ())) for loc in locations}
    if target_name(inv, params) not in kept["P"]:
        return "sat", f"the step-boundary candidates (they do not hold {target_name(inv, params)})"
    deadline = time.monotonic() + timeout_s
    initially_false = _false_initially(model, kept["P"], deadline)
    if initially_false is None:
        return "unknown", "the initial state"
    if initially_false:
        return "sat", "the initial state"
    for action in model.actions():
        smt = SmtSession(timeout_ms=max(1, int((deadline - time.monotonic()) * 1000)))
        pre, post = action.run(smt, "")
        smt.add(*(fn(pre) for name, fn in model.candidates(action.pre) if name in kept[action.pre]))
        goals = [fn(post) for name, fn in model.candidates(action.post) if name in kept[action.post]]
        goal = smt.bool_var("goal_broken")
        smt.add(smt.implies(goal, Z3Ops.not_(Z3Ops.and_(*goals))))
        result = smt.check(goal)
        if result != "unsat":
            return result, action.name
    return "unsat", ""


def _targets(inv: Invariant, params: dict[str, int]) -> tuple[Target, ...]:
    """The state invariants proved together (one Houdini run serves all four), in a stable order."""
    return tuple(sorted([(inv, params)] + [(CATALOGUE[n], {}) for n in STATE_INVARIANTS if n != inv.name],
                        key=lambda t: target_name(*t)))


def never_triggered(policy: Policy, inv: Invariant, params: dict[str, int], env: Environment,
                    rlimit: int) -> bool:
    """Whether the invariant's situation never occurs, at any depth: the negation of its trigger is
    inductive (it survives Houdini, proved alongside the invariants). A side check: each of its queries is
    bounded by z3's resource count ``rlimit``, not by the clock, so that it concludes the same on every run
    whatever the load (a tier the proof already ran is looked up, not run again)."""
    return _survives(policy, inv, params, env, NEVER + target_name(inv, params), None, rlimit=rlimit)[0] == "survives"


def _survives(policy: Policy, inv: Invariant, params: dict[str, int], env: Environment, name: str,
              timeout_s: float | None, rlimit: int = 0) -> tuple[str, str, Houdini | None]:
    """Run (or look up) Houdini tier by tier until the candidate ``name`` survives: ("survives", tier,
    result), ("dropped", last tier, result) or ("unknown", tier, None) when a query was not decided within
    ``timeout_s`` seconds in all (None: no clock) or, with ``rlimit``, within that resource count."""
    started = time.monotonic()
    targets = _targets(inv, params)
    result = None
    for tier in TIERS:
        key = (policy.model_dump_json(), env, tuple(target_name(i, p) for i, p in targets), tier)
        if key not in _DONE:
            left = float("inf") if timeout_s is None else timeout_s - (time.monotonic() - started)
            if left <= 0:
                return "unknown", tier, None
            began = time.monotonic()
            result = _houdini(ActionModel(policy, targets, env, tier), began + left, rlimit)
            if result.status == "unknown":
                return "unknown", tier, None
            result.seconds = time.monotonic() - began
            _DONE[key] = result
        result = _DONE[key]
        if name in result.alive["P"]:
            return "survives", tier, result
    return "dropped", TIERS[-1], result


def _houdini(model: ActionModel, deadline: float, rlimit: int = 0) -> Houdini:
    actions = model.actions()
    locations = ["P"] + [f"M{k}" for k in range(len(model.passes))]
    alive = {loc: {name for name, _ in model.candidates(loc)} for loc in locations}
    targets = {prefix + target_name(i, p) for i, p in model.targets for prefix in ("", NEVER)}
    # (the loop runs while one of them may still survive; what survives the end is at the fixpoint)
    # a situation an engine probe reaches is no candidate for "never occurs" (dropped everywhere up front)
    reached = {NEVER + target_name(i, p) for (i, p), how in zip(model.targets, engine_witnesses(
        model.policy, list(model.targets), model.env)) if how is not None}
    for loc in locations:
        alive[loc] -= reached
    initially_false = _false_initially(model, alive["P"], deadline)
    if initially_false is None:
        return Houdini("unknown", alive)
    broken_by = {name: "initial state" for name in initially_false & targets}
    alive["P"] -= initially_false
    blocks: dict[str, str] = {}
    queue = list(actions)  # an action is checked again only when its pre-location lost a candidate
    while queue and targets & alive["P"]:
        action = queue.pop(0)
        if deadline <= time.monotonic():
            return Houdini("unknown", alive)
        status, dropped, block = _check_action(model, action, alive, deadline, rlimit)
        if status == "unknown":
            return Houdini("unknown", alive)
        blocks[action.name] = block
        if dropped:
            alive[action.post] -= dropped
            for name in dropped & targets:  # the first action that broke it, at any point of the step
                broken_by.setdefault(name, action.name)
            queue += [a for a in actions if a.pre == action.post and a not in queue]
    # each action's last query assumed the final lemmas where it starts (and asked for at least the final
    # ones where it ends): together they are the certificate
    certificate = "\n".join(f"{CERTIFICATE_BLOCK}{action.name}\n{blocks[action.name]}"
                            for action in actions if action.name in blocks)
    lemmas_p = len([n for n in alive["P"] if n not in targets])
    k_mid = sum(len(alive[loc]) for loc in locations[1:])
    return Houdini("done", alive, certificate, f"{lemmas_p} step-boundary lemmas, {k_mid} mid-step lemmas over "
                                               f"{len(actions)} actions", broken_by)


def _failed(started: float, by: str) -> InductionResult:
    return InductionResult("cti", time.monotonic() - started,
                           cti=[(f"action-wise induction: the invariant is not preserved by the {by} from the "
                                 "states the surviving lemmas allow (not a counterexample: the lemmas may be too weak)")])


def _false_initially(model: ActionModel, names: set[str], deadline: float) -> set[str] | None:
    """P candidates the initial state (nothing arrived) breaks; None when the deadline passed first (not all of
    them are known: a proof must not go on without them)."""
    from checker.verify.bmc import initial_state

    smt = SmtSession()
    try:
        with _building(deadline):  # building counts against the time limit (budget.py)
            params, _, cons = model._boundary(smt, "init_")
            smt.add(*cons)
            step = SymbolicStep(Z3Ops, model.policy, params, initial_state(model.n, model.env.tenants), 0,
                                [False] * model.n)
            step.env_step_us = model.env.step_us
            view = model._boundary_view(step)
            goals = [(name, fn(view)) for name, fn in model.candidates("P") if name in names]
    except BuildTimeout:
        return None
    result, dropped, _ = _drop_until_unsat(smt, goals, deadline=deadline)
    return None if result == "unknown" else dropped


def _drop_until_unsat(smt: SmtSession, goals: list[tuple[str, Term]], assumptions: list[Term] | None = None,
                      tag: str = "", deadline: float | None = None) -> tuple[str, set[str], object]:
    """Ask whether some goal can be false (under the assumptions); while it can, drop every goal false in
    the model and ask again. Returns the last answer ("unsat", or "unknown": also once ``deadline`` has
    passed, each query getting only the time left), the dropped names and the last query's literal."""
    dropped: set[str] = set()
    for attempt in range(len(goals) + 1):
        live = [(name, term) for name, term in goals if name not in dropped]
        lit = smt.bool_var(f"broken_{tag}{attempt}")
        smt.add(smt.implies(lit, Z3Ops.not_(Z3Ops.and_(*(term for _, term in live)))))
        if deadline is not None and math.isfinite(deadline):  # infinite: bounded by the rlimit alone
            left_ms = (deadline - time.monotonic()) * 1000
            if left_ms < 1:
                return "unknown", dropped, lit
            smt.set_timeout(left_ms)
        result = smt.check(lit, *(assumptions or []))
        if result != "sat":
            return result, dropped, lit
        dropped |= {name for name, term in live if smt.value(term) is False}
    raise AssertionError("a satisfiable query with every goal dropped")


def _check_action(model: ActionModel, action: Action, alive: dict[str, set[str]],
                  deadline: float, rlimit: int = 0) -> tuple[str, set[str], str]:
    """Assume the pre-location's live candidates, run the action, and drop the post-location's candidates it
    can break: one query for all of them; while it is satisfiable, drop every candidate false in the model
    and ask again. An action that starts and ends at the same location (a round) is repeated in the same
    solver until it drops nothing: its pre-candidates are assumptions, withdrawn as they are dropped.
    Returns the status, the dropped names and the final (unsat) query as SMT-LIB2. Building the query and
    every query asked count against ``deadline`` ("unknown" once it has passed)."""
    smt = SmtSession()
    smt.set_rlimit(rlimit)
    loop = action.pre == action.post
    assumed: dict[str, Term] = {}
    try:
        with _building(deadline):  # building counts against the time limit (budget.py)
            pre, post = action.run(smt, "")
            for name, fn in model.candidates(action.pre):
                if name in alive[action.pre]:
                    if loop:
                        assumed[name] = smt.bool_var(f"assume {name}")
                        smt.add(smt.implies(assumed[name], fn(pre)))
                    else:
                        smt.add(fn(pre))
            goals = [(name, fn(post)) for name, fn in model.candidates(action.post) if name in alive[action.post]]
    except BuildTimeout:
        return "unknown", set(), ""
    dropped: set[str] = set()
    while True:
        live = [(name, term) for name, term in goals if name not in dropped]
        result, now, lit = _drop_until_unsat(smt, live, [a for name, a in assumed.items() if name not in dropped],
                                             tag=f"{len(dropped)}_", deadline=deadline)
        dropped |= now
        if result == "unknown":
            return "unknown", dropped, ""
        if not (loop and now):
            break
    smt.add(*(a for name, a in assumed.items() if name not in dropped))
    return "ok", dropped, _block(smt, lit)


def _building(deadline: float):
    """Building a query under the clock (budget.within) until ``deadline``; an infinite one (a side check bounded
    by z3's resource count alone) is not timed."""
    return contextlib.nullcontext() if math.isinf(deadline) else within(deadline - time.monotonic())


def _block(smt: SmtSession, lit: Term) -> str:
    """The solver's assertions with the final query's literal asserted: unsat, rechecked alone."""
    smt.add(lit)
    return smt.to_smt2()
