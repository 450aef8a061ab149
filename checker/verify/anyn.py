"""PROVED for any number of requests: the action-wise proof over an aggregate abstraction (docs/invariants.md).

The state invariants kv_never_overcommitted, token_budget, seq_cap and request_conservation compare sums over the
slots (blocks held, requests running, tokens scheduled) with the policy's limits, or say something of each slot
alone. The step is a sequence of actions (checker/verify/actions.py): per-slot maps (the prefix: release, arrive,
cancel, expire; a pass's start; the completion), each changing every slot by itself, and rounds, each serving one
slot (the cursor) and maybe preempting one other (the victim). The predicate proved at each point is

    G(sums, step globals)  and  for every slot i: S(i)  and  for every two slots i != j: R(i, j)

with S and R from a fixed list of candidates (Houdini keeps the ones no action breaks). Each action is checked
on an **instance** (checker/verify/anyn_model.py): a round on the cursor, the victim (or another slot) and a
bystander kept whole (the bystander, untouched, stands for every slot of the rest: its S and R facts are checked
under the round's new globals) plus sums over all the others; a per-slot map on one slot kept whole (its S facts,
and that it never gains blocks or starts running), then on the sums alone (the sums after a map are sums of slots
that each kept those facts). No N appears in any query: the sums are unbounded integers, so one proof covers every
N and, by induction over the actions, every depth. The sides of the argument that the queries cannot see:

1. the instance computes what the concrete N-slot action computes on the kept slots, leaves the other slots
   untouched and reads them only through the sums: proved by z3 from every state of the predicate at N = 2..5
   (checker/verify/anyn_symbolic.py) and compared on random states of N = 1..6 (checker/verify/anyn_conformance.py),
   at every run (``side_conditions``); tests/conformance/test_anyn_conformance.py shows both catch a wrong instance;
2. the cursor is the first candidate of the pass: the instance lets it be any candidate, except that a slot whose
   tokens the pass fixed when it first reached it (``want``) is the cursor until it is done, which holds because
   a round never adds a candidate nor changes a candidate's key (a goal of every round query, "structure: ...");
3. the aggregate forms of the invariants are the catalogue's invariants on the concrete frames (checked on the
   same random states).

Policies whose rules read other slots beyond these sums are refused by name (anyn_model.not_covered).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from checker.frames import Frame, TraceContext
from checker.policy import Policy
from checker.semantics.state import FIELDS, Status
from checker.smt.encode import Pass, SlotParams, SymbolicStep, WAITING_STATES
from checker.smt.ops import CERTIFICATE_BLOCK, SmtSession, Term, Z3Ops
from checker.verify.actions import _drop_until_unsat, fresh_loop, stop_mid_step
from checker.verify.anyn_model import (
    STATUSES,
    Rest,
    RestState,
    RestStep,
    Scene,
    blank_fields,
    copy_loop,
    snapshot_step,
)
from invariants.catalogue import CATALOGUE

METHOD = "aggregate abstraction: cursor, victim and one bystander slot kept whole, sums over the rest"
TARGETS = ("kv_never_overcommitted", "token_budget", "seq_cap", "request_conservation")
STRUCTURE = "structure: "
KEPT = 3  # slots a round's instance keeps whole: the cursor, the victim (or any other), a bystander of the rest
# Candidates the abstraction itself needs wherever they are: running requests have distinct admission numbers
# (the victim is then one slot, never none), each below next_seq (so a new admission's number differs from the
# rest's, which the instance does not see)
NEEDED = ("pair.running_distinct_admitted", "slot.admitted_below_next_seq")


# ---------------------------------------------------------------------------------------------- candidates
SlotFn = Callable[[Scene, int], Term]
GlobalFn = Callable[[Scene], Term]
PairFn = Callable[[Scene, int, int], Term]


def aggregate_form(policy: Policy, name: str, o, kv: Term, run: Term, scheduled: Term) -> Term:
    """The invariant as a comparison of sums (checked equal to the catalogue's on concrete frames: tests)."""
    if name == "kv_never_overcommitted":
        return kv <= policy.kv.num_blocks
    if name == "seq_cap":
        return run <= policy.batch.max_num_seqs
    if name == "token_budget":
        return scheduled <= policy.step_token_bound
    raise KeyError(name)


def _one_slot_frame(sc: Scene, i: int) -> TraceContext:
    slot = sc.slot(i)
    frame = Frame((slot,), (sc.sched[i],), (False,), (False,), slot["blocks"], 0, ())
    return TraceContext(sc.step.p, (sc.step.params[i],), [frame])


def slot_candidates(policy: Policy, kind: str) -> list[tuple[str, SlotFn]]:
    """Facts of one slot (and the step's globals) at a location: "P" or the kind of the pass under way. Among the
    globals they read only next_seq and the budget, which a per-slot map's one-slot instance computes exactly (the
    running count it computes from the rest's sums before the map is not the step's: no slot fact may read it)."""
    rc = CATALOGUE["request_conservation"]

    def is_(sc: Scene, i: int, *statuses: Status) -> Term:
        return sc.o.or_(*(sc.slot(i)["status"] == int(s) for s in statuses))

    out: list[tuple[str, SlotFn]] = [
        ("request_conservation", lambda sc, i: rc.holds(sc.o, _one_slot_frame(sc, i), 0)),
        ("sched_nonnegative", lambda sc, i: sc.sched[i] >= 0),
        ("admitted_below_next_seq", lambda sc, i: sc.o.or_(sc.o.not_(sc.running(i)), sc.o.and_(
            sc.slot(i)["admitted_seq"] >= 1, sc.slot(i)["admitted_seq"] < sc.step.s.next_seq))),
        ("computed_nonnegative", lambda sc, i: sc.slot(i)["num_computed"] >= 0),
        ("never_swapped", lambda sc, i: sc.o.and_(sc.slot(i)["status"] != int(Status.SWAPPED),
                                                  sc.slot(i)["swapped_blocks"] == 0)),
    ]
    if kind == "P":
        return out
    out.append(("sched_only_running", lambda sc, i: sc.o.or_(sc.sched[i] == 0, sc.running(i))))
    if kind in ("RunningPass", "MixedPass"):
        out += [("want_range", lambda sc, i: sc.loop["want"][i] >= -1),
                ("reached_within_budget", lambda sc, i: sc.o.or_(sc.o.not_(sc.reached(i)),
                                                                 sc.loop["want"][i] <= sc.step.budget))]
    if kind == "WaitingPass":
        out.append(("untried_waiting", lambda sc, i: sc.o.or_(sc.o.not_(sc.cand(i)), is_(sc, i, *WAITING_STATES))))
    if kind == "MixedPass":
        out.append(("unprocessed_live", lambda sc, i: sc.o.or_(sc.o.not_(sc.cand(i)),
                                                               is_(sc, i, Status.RUNNING, *WAITING_STATES))))
    return out


def global_candidates(policy: Policy, kind: str) -> list[tuple[str, GlobalFn]]:
    out: list[tuple[str, GlobalFn]] = [
        ("kv_never_overcommitted", lambda sc: aggregate_form(policy, "kv_never_overcommitted", sc.o, sc.kv, 0, 0)),
        ("seq_cap", lambda sc: aggregate_form(policy, "seq_cap", sc.o, 0, sc.run, 0)),
        ("next_seq_positive", lambda sc: sc.step.s.next_seq >= 1),
    ]
    if kind == "P":
        return out + [("token_budget", lambda sc: aggregate_form(policy, "token_budget", sc.o, 0, 0, sc.scheduled))]
    b = policy.batch.max_num_batched_tokens
    return out + [
        ("running_count", lambda sc: sc.step.running == sc.run),
        ("budget_account", lambda sc: sc.scheduled + sc.step.budget == b),
        ("budget_nonnegative", lambda sc: sc.step.budget >= 0),
    ]


def pair_candidates(policy: Policy, kind: str) -> list[tuple[str, PairFn]]:
    return [("running_distinct_admitted", lambda sc, i, j: sc.o.or_(
        sc.o.not_(sc.running(i)), sc.o.not_(sc.running(j)), sc.slot(i)["admitted_seq"] != sc.slot(j)["admitted_seq"]))]


def candidate_terms(policy: Policy, kind: str, sc: Scene, alive: set[str] | None) -> list[tuple[str, Term]]:
    """(name, term) of the candidates at a location on a scene: a slot fact over every kept slot, a pair fact
    over every two, a global fact once (``alive``: only these names; None: all)."""
    o, n = sc.o, sc.n
    out = []
    for name, fn in slot_candidates(policy, kind):
        if n and (alive is None or "slot." + name in alive):
            out.append(("slot." + name, o.and_(*(fn(sc, i) for i in range(n)))))
    for name, fn in pair_candidates(policy, kind):
        if n >= 2 and (alive is None or "pair." + name in alive):
            out.append(("pair." + name, o.and_(*(fn(sc, i, j) for i in range(n) for j in range(i + 1, n)))))
    for name, fn in global_candidates(policy, kind):
        if alive is None or name in alive:
            out.append((name, fn(sc)))
    return out


def all_names(policy: Policy, kind: str) -> set[str]:
    return ({"slot." + n for n, _ in slot_candidates(policy, kind)}
            | {"pair." + n for n, _ in pair_candidates(policy, kind)}
            | {n for n, _ in global_candidates(policy, kind)})


# ---------------------------------------------------------------------------------------------- instances
@dataclass
class Query:
    """One action on an instance: the scenes before and after, what the instance assumes, and the structural
    goals (the abstraction's own side conditions, not candidates: one that fails ends the proof)."""

    pre: Scene | None
    post: Scene
    pre_kind: str
    post_kind: str
    assumed: list[Term] = field(default_factory=list)
    required: list[tuple[str, Term]] = field(default_factory=list)
    per_slot_pre: bool = True  # False: the pre scene is the sums only (its candidates: globals)
    goals: str = "all"  # "slot": one kept slot's facts (a per-slot map); "global": the sums' facts


class Instances:
    """Fresh instances of one policy's actions (z3 terms)."""

    def __init__(self, policy: Policy):
        self.policy = policy
        probe = SymbolicStep(Z3Ops, policy, [], RestState([], 0, 0, []), 0, [])
        self.passes: list[Pass] = probe.passes()

    def kinds(self) -> list[str]:
        return [type(p).__name__ for p in self.passes]

    def location_kind(self, loc: str) -> str:
        return "P" if loc == "P" else self.kinds()[int(loc[1:])]

    # -- fresh pieces
    @staticmethod
    def _params(smt: SmtSession, tag: str) -> tuple[SlotParams, list[Term]]:
        a = smt.int_var(f"{tag}arrival_us")
        prm = SlotParams(a, smt.int_var(f"{tag}prompt"), smt.int_var(f"{tag}output"), smt.int_var(f"{tag}max_output"),
                         smt.int_var(f"{tag}priority"), 0)
        return prm, [a >= 0, prm.prompt_len >= 1, prm.output_len >= 1, prm.max_output >= prm.output_len]

    @staticmethod
    def _rest(smt: SmtSession, tag: str) -> tuple[Rest, list[Term]]:
        counts = {int(s): smt.int_var(f"{tag}rest_count_{s.name.lower()}") for s in STATUSES}
        rest = Rest(smt.int_var(f"{tag}rest_blocks"), smt.int_var(f"{tag}rest_sched"), counts,
                    smt.bool_var(f"{tag}rest_candidate"))
        return rest, [rest.blocks >= 0, rest.sched >= 0] + [c >= 0 for c in counts.values()]

    def _step(self, smt: SmtSession, tag: str, n: int, rest: Rest, mid: bool) -> tuple[RestStep, list[Term]]:
        cons: list[Term] = []
        params = []
        for i in range(n):
            prm, c = self._params(smt, f"{tag}s{i}_")
            params.append(prm)
            cons += c
        slots = [{f: smt.int_var(f"{tag}s{i}_{f}") for f in FIELDS} for i in range(n)]
        state = RestState(slots, smt.int_var(f"{tag}next_seq"), smt.int_var(f"{tag}step"), [0], rest_blocks=rest.blocks)
        now = smt.int_var(f"{tag}now_us")
        cons += [state.step >= 0, now >= 0]
        cancels = [smt.bool_var(f"{tag}s{i}_cancel") for i in range(n)]
        step = RestStep(Z3Ops, self.policy, params, state, now, cancels, rest,
                        lambda name: smt.bool_var(f"{tag}{name}"))
        if mid:
            stop_mid_step(smt, step, tag)
        else:  # a step boundary: the tokens of the step that just ended
            step.sched = [smt.int_var(f"{tag}sched_{i}") for i in range(n)]
        return step, cons

    def _loop(self, smt: SmtSession, tag: str, k: int, n: int) -> dict:
        """Fresh loop variables (keys: any order; the instance's cursor does not read them, a round must keep
        them)."""
        return fresh_loop(smt, tag, self.passes[k], n)

    def _fresh_globals(self, smt: SmtSession, tag: str, loop: dict, k: int) -> None:
        """A pass's Boolean loop globals (enabled, stopped, admitting) as any values: they read the whole step
        (the previous pass's tokens, the running count at the start), so the abstraction lets them be anything."""
        for name, kind in self.passes[k].loop_kinds.items():
            if kind == "bool":
                loop[name] = smt.bool_var(f"{tag}{name}")

    # -- actions
    def round(self, smt: SmtSession, k: int) -> Query:
        """Slot 0 the cursor, slot 1 the victim (or any other slot), slot 2 a bystander: a slot of the rest kept
        whole, which the round must not touch, so that its facts (and its pairs with the others) are checked
        under the round's new globals, as every slot of the rest is some instance's bystander."""
        kind = self.kinds()[k]
        rest, cons = self._rest(smt, "")
        step, c2 = self._step(smt, "", KEPT, rest, mid=True)
        loop = self._loop(smt, "loop_", k, KEPT)
        pre = Scene(snapshot_step(step), copy_loop(loop), list(step.sched), rest, kind)
        self.passes[k].round(step, loop)
        post = Scene(step, loop, list(step.sched), rest, kind)
        o = Z3Ops
        b = KEPT - 1
        assumed = cons + c2 + step.assumed + [o.not_(pre.reached(j)) for j in range(1, KEPT)]
        required = [(STRUCTURE + "a round never adds a candidate of its pass nor changes a candidate's key", o.and_(*(
            o.or_(o.not_(post.cand(j)), o.and_(pre.cand(j), *(x == y for x, y in zip(post.key(j), pre.key(j)))))
            for j in range(KEPT)))),
            (STRUCTURE + "next_seq never decreases", post.step.s.next_seq >= pre.step.s.next_seq),
            (STRUCTURE + "the bystander is untouched", o.and_(
                *(post.slot(b)[f] == pre.slot(b)[f] for f in FIELDS), post.sched[b] == pre.sched[b],
                *(_same(post.loop[name][b], pre.loop[name][b]) for name, v in loop.items() if isinstance(v, list))))]
        if kind in ("RunningPass", "MixedPass"):
            required.append((STRUCTURE + "only the cursor has tokens fixed by the pass",
                             o.and_(*(o.not_(post.reached(j)) for j in range(1, KEPT)))))
        return Query(pre, post, kind, kind, assumed, required)

    def _map_slot(self, smt: SmtSession, pre_kind: str, post_kind: str, mid: bool, k: int | None,
                  act: Callable[[RestStep, dict | None], dict | None]) -> Query:
        """A per-slot map on one kept slot: its facts after, and that it gains no blocks and starts no run."""
        rest, cons = self._rest(smt, "")
        step, c2 = self._step(smt, "", 1, rest, mid=mid)
        loop = self._loop(smt, "loop_", k, 1) if k is not None else None
        pre = Scene(snapshot_step(step), copy_loop(loop), list(step.sched), rest, "" if pre_kind == "P" else pre_kind)
        new_loop = act(step, loop)
        post = Scene(step, new_loop, list(step.sched), rest, "" if post_kind == "P" else post_kind)
        o = Z3Ops
        required = [
            (STRUCTURE + "a per-slot map never adds blocks", post.slot(0)["blocks"] <= pre.slot(0)["blocks"]),
            (STRUCTURE + "a per-slot map starts no request running", o.or_(o.not_(post.running(0)), o.and_(
                pre.running(0), post.slot(0)["admitted_seq"] == pre.slot(0)["admitted_seq"]))),
            (STRUCTURE + "a per-slot map keeps next_seq", post.step.s.next_seq == pre.step.s.next_seq)]
        if post_kind in ("RunningPass", "MixedPass"):
            required.append((STRUCTURE + "no slot has tokens fixed when a pass starts", o.not_(post.reached(0))))
        if post_kind != "P" and pre_kind != "P":  # a pass's start: the slot itself is untouched
            required.append((STRUCTURE + "a pass start changes no slot field", o.and_(
                *(post.slot(0)[f] == pre.slot(0)[f] for f in FIELDS), post.sched[0] == pre.sched[0])))
        return Query(pre, post, pre_kind, post_kind, cons + c2, required, goals="slot")

    def _map_sums(self, smt: SmtSession, pre_kind: str, post_kind: str, mid: bool,
                  act: Callable[[RestStep], None], change: str) -> Query:
        """A per-slot map on the sums alone: blocks and the running count only fall (each slot's facts, proved
        on one slot: "falls"), or nothing changes (a pass start: "same"); the tokens of the step are kept, or a new
        step starts at none ("new step")."""
        before, cons = self._rest(smt, "pre_")
        after, c2 = self._rest(smt, "post_")
        step, c3 = self._step(smt, "", 0, before, mid=mid)
        pre = Scene(snapshot_step(step), None, [], before, "")
        step.rest = after
        step.s.rest_blocks = after.blocks
        act(step)
        post = Scene(step, None, [], after, "")
        if change == "same":
            lifted = [after.blocks == before.blocks, after.sched == before.sched, after.cand == before.cand] + \
                [after.counts[s] == before.counts[s] for s in before.counts]
        else:
            lifted = [after.blocks <= before.blocks, after.running <= before.running,
                      after.sched == (0 if change == "new step" else before.sched)]
        return Query(pre, post, pre_kind, post_kind, cons + c2 + c3 + lifted, [], per_slot_pre=False, goals="global")

    def prefix_slot(self, smt: SmtSession) -> Query:
        def act(step: RestStep, loop):
            step.sched = [0] * step.n  # a new step: nothing scheduled yet
            return step.prefix(self.passes)
        q = self._map_slot(smt, "P", self.kinds()[0], False, None, act)
        self._fresh_globals(smt, "start_", q.post.loop, 0)
        return q

    def prefix_sums(self, smt: SmtSession) -> Query:
        def act(step: RestStep):
            step.sched = []
            step.prefix(self.passes)
        return self._map_sums(smt, "P", self.kinds()[0], False, act, "new step")

    def handover_slot(self, smt: SmtSession, k: int) -> Query:
        q = self._map_slot(smt, self.kinds()[k], self.kinds()[k + 1], True, k,
                           lambda step, loop: self.passes[k + 1].start(step))
        self._fresh_globals(smt, "start_", q.post.loop, k + 1)
        return q

    def handover_sums(self, smt: SmtSession, k: int) -> Query:
        return self._map_sums(smt, self.kinds()[k], self.kinds()[k + 1], True,
                              lambda step: self.passes[k + 1].start(step), "same")

    def complete_slot(self, smt: SmtSession) -> Query:
        last = len(self.passes) - 1

        def act(step: RestStep, loop):
            step.complete()
            return None
        return self._map_slot(smt, self.kinds()[last], "P", True, last, act)

    def complete_sums(self, smt: SmtSession) -> Query:
        return self._map_sums(smt, self.kinds()[-1], "P", True, lambda step: step.complete(), "falls")

    def initial(self, smt: SmtSession) -> Query:
        """Every slot not yet arrived: two kept (blank) slots, the rest all pending and holding nothing."""
        rest, cons = self._rest(smt, "")
        step, c2 = self._step(smt, "", 2, rest, mid=False)
        for i in range(2):
            cons += [step.s.slots[i][f] == v for f, v in blank_fields().items()] + [step.sched[i] == 0]
        cons += [rest.blocks == 0, rest.sched == 0, step.s.next_seq == 1]
        cons += [c == 0 for s, c in rest.counts.items() if s != int(Status.PENDING)]
        return Query(None, Scene(step, None, list(step.sched), rest, ""), "", "P", cons + c2)


def _same(a, b):
    if isinstance(a, tuple):
        return Z3Ops.and_(*(x == y for x, y in zip(a, b)))
    return a == b


@dataclass
class Action:
    name: str
    pre: str  # location: "P", "M0", ... ("" for the initial state)
    post: str
    build: Callable[[SmtSession], Query]


def actions(inst: Instances) -> list[Action]:
    last = len(inst.passes) - 1
    out = [Action("initial state", "", "P", inst.initial),
           Action("prefix (one slot)", "P", "M0", inst.prefix_slot),
           Action("prefix (sums)", "P", "M0", inst.prefix_sums)]
    for k, kind in enumerate(inst.kinds()):
        out.append(Action(f"round of pass {k} ({kind})", f"M{k}", f"M{k}", lambda smt, k=k: inst.round(smt, k)))
        if k < last:
            out.append(Action(f"pass {k} -> pass {k + 1} (one slot)", f"M{k}", f"M{k + 1}",
                              lambda smt, k=k: inst.handover_slot(smt, k)))
            out.append(Action(f"pass {k} -> pass {k + 1} (sums)", f"M{k}", f"M{k + 1}",
                              lambda smt, k=k: inst.handover_sums(smt, k)))
    out += [Action("complete (one slot)", f"M{last}", "P", inst.complete_slot),
            Action("complete (sums)", f"M{last}", "P", inst.complete_sums)]
    return out


# ---------------------------------------------------------------------------------------------- the proof
@dataclass
class AnyNProof:
    status: str  # "done", "failed" (a structural goal broke: the abstraction does not apply), "unknown"
    alive: dict[str, list[str]]
    certificate: str = ""
    reason: str = ""
    seconds: float = 0.0
    broken_by: dict[str, str] = field(default_factory=dict)
    side_conditions: str = ""

    def proved(self, target: str) -> bool:
        return self.status == "done" and target_name(target) in self.alive.get("P", [])


def target_name(inv_name: str) -> str:
    return "slot." + inv_name if inv_name == "request_conservation" else inv_name


def _pose(inst: Instances, action: Action, smt: SmtSession, alive: dict[str, set[str]]
          ) -> tuple[Query, list[tuple[str, Term]]]:
    """Build the action's query: assert its assumptions and the live candidates where it starts; return the goals
    (the live candidates where it ends, and its structural goals)."""
    q = action.build(smt)
    smt.add(*q.assumed)
    if q.pre is not None:
        pre_kind = inst.location_kind(action.pre)
        pre_alive = alive[action.pre]
        if not q.per_slot_pre:
            pre_alive = {n for n in pre_alive if not n.startswith(("slot.", "pair."))}
        smt.add(*(t for _, t in candidate_terms(inst.policy, pre_kind, q.pre, pre_alive)))
    post_alive = alive[action.post]
    if q.goals == "global":
        post_alive = {n for n in post_alive if not n.startswith(("slot.", "pair."))}
    elif q.goals == "slot":  # pair facts follow from the structural goals (no run starts, numbers kept)
        post_alive = {n for n in post_alive if n.startswith("slot.")}
    goals = candidate_terms(inst.policy, inst.location_kind(action.post), q.post, post_alive) + q.required
    return q, goals


def prove(policy: Policy, timeout_s: float = 60.0) -> AnyNProof:
    """Houdini over the actions on their instances (module docstring); the certificate is each action's last
    query (unsat) as SMT-LIB2."""
    key = policy.model_dump_json()
    if key in _DONE:
        return _DONE[key]
    started = time.monotonic()
    deadline = started + timeout_s
    inst = Instances(policy)
    acts = actions(inst)
    locations = ["P"] + [f"M{k}" for k in range(len(inst.passes))]
    alive = {loc: all_names(policy, inst.location_kind(loc)) for loc in locations}
    blocks: dict[str, str] = {}
    broken_by: dict[str, str] = {}
    changed = True
    while changed:
        changed = False
        for action in acts:
            left = deadline - time.monotonic()
            if left <= 0:
                return AnyNProof("unknown", _sorted(alive), reason="timeout", seconds=time.monotonic() - started)
            smt = SmtSession(timeout_ms=int(left * 1000))
            q, goals = _pose(inst, action, smt, alive)
            if smt.check() != "sat":  # premises that contradict themselves would prove anything
                return AnyNProof("failed", _sorted(alive), reason=f"{action.name}: the instance's premises are not "
                                 "satisfiable (the query would prove nothing)", seconds=time.monotonic() - started)
            result, dropped, lit = _drop_until_unsat(smt, goals, tag="q")
            if result != "unsat":
                return AnyNProof("unknown", _sorted(alive), reason=f"the solver said {result} on {action.name}",
                                 seconds=time.monotonic() - started)
            structural = sorted(n for n in dropped if n.startswith(STRUCTURE))
            if structural:
                return AnyNProof("failed", _sorted(alive), reason=f"{action.name}: {structural[0][len(STRUCTURE):]} "
                                 "does not hold on the instance", seconds=time.monotonic() - started,
                                 broken_by=broken_by)
            if dropped:
                for name in dropped:
                    broken_by.setdefault(name, action.name)
                alive[action.post] -= dropped
                changed = True
            smt.add(lit)
            blocks[action.name] = smt.to_smt2()
    for loc in locations:  # the victim choice and the rest's admission numbers rest on these (module docstring)
        lost = sorted(n for n in NEEDED if n not in alive[loc])
        if lost:
            return AnyNProof("failed", _sorted(alive), reason=f"{lost[0]} is not kept at {loc} (broken by "
                             f"{broken_by.get(lost[0], '?')}): the abstraction's victim choice needs it",
                             seconds=time.monotonic() - started, broken_by=broken_by)
    certificate = "\n".join(f"{CERTIFICATE_BLOCK}{a.name}\n{blocks[a.name]}" for a in acts)
    proof = AnyNProof("done", _sorted(alive), certificate, seconds=time.monotonic() - started, broken_by=broken_by)
    _DONE[key] = proof
    return proof


_DONE: dict[str, AnyNProof] = {}


def _sorted(alive: dict[str, set[str]]) -> dict[str, list[str]]:
    return {loc: sorted(names) for loc, names in alive.items()}


def recheck_rebuilt(policy: Policy, alive: dict[str, list[str]], timeout_s: float) -> tuple[str, str]:
    """Rebuild every action query from the policy and the candidates that survived (a certificate's binding) and
    decide it with a fresh solver: ("unsat", "") when the proof holds, else the answer and the action."""
    inst = Instances(policy)
    kept = {loc: set(names) for loc, names in alive.items()}
    deadline = time.monotonic() + timeout_s
    for action in actions(inst):
        if action.post not in kept or (action.pre and action.pre not in kept):
            return "sat", f"{action.name} (no candidates recorded for its locations)"
        smt = SmtSession(timeout_ms=max(1, int((deadline - time.monotonic()) * 1000)))
        _, goals = _pose(inst, action, smt, kept)
        lit = smt.bool_var("goal_broken")
        smt.add(smt.implies(lit, Z3Ops.not_(Z3Ops.and_(*(t for _, t in goals)))))
        answer = smt.check(lit)
        if answer != "unsat":
            return answer, action.name
    return "unsat", ""


# ---------------------------------------------------------------------------------------------- side conditions
# N (up to two slots in the rest) at which z3 proves instance = concrete action from every state of the predicate
SYMBOLIC_SIZES = (2, 3, 4, 5)


@dataclass(frozen=True)
class SideConditions:
    states: int  # random concrete states compared, all actions and N together
    sizes: tuple[int, ...]
    mismatches: list[str]
    queries: int = 0  # z3 equality queries proved (instance = concrete action), SYMBOLIC_SIZES together
    symbolic: tuple[int, ...] = ()
    undecided: tuple[str, ...] = ()  # z3 equality queries not decided (timeout, unknown): the proof is not complete

    def summary(self) -> str:
        proved = (f"instance = concrete action proved by z3 from every state of the predicate at N = "
                  f"{min(self.symbolic)}..{max(self.symbolic)} ({self.queries} queries) and " if self.symbolic else
                  "instance = concrete action ")
        return (f"{proved}compared on {self.states} random states of N = {min(self.sizes)}..{max(self.sizes)}, the "
                "rest untouched, the invariants' sum forms equal to the catalogue's")


def side_conditions(policy: Policy, alive: dict[str, list[str]] | None = None, states_per_size: int = 30,
                    sizes: tuple[int, ...] = (1, 2, 3, 4, 5, 6), seed: int = 0,
                    timeout_s: float = 120.0) -> SideConditions:
    """Compare the instances with the concrete actions on random states (checker/verify/anyn_conformance.py) and,
    given the proof's surviving candidates, prove them equal from every state of the predicate at SYMBOLIC_SIZES
    (checker/verify/anyn_symbolic.py)."""
    from checker.verify import anyn_symbolic
    from checker.verify.anyn_conformance import compare_random

    mismatches, count = compare_random(policy, states_per_size, sizes, seed)
    if alive is None:
        return SideConditions(count, sizes, mismatches)
    before = anyn_symbolic.QUERIES[0]
    problems: list[str] = []
    for n in SYMBOLIC_SIZES:
        problems += anyn_symbolic.check_rounds(policy, n, alive, timeout_s)
        problems += anyn_symbolic.check_maps(policy, n, alive, timeout_s)
    mismatches += [p for p in problems if p.endswith(": sat")]
    undecided = tuple(p for p in problems if not p.endswith(": sat"))
    return SideConditions(count, sizes, mismatches, anyn_symbolic.QUERIES[0] - before, SYMBOLIC_SIZES, undecided)
