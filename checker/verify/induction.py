"""Unbounded proofs by induction: the invariant, strengthened by structural lemmas, holds initially
and is preserved by every step, for N request slots and any number of iterations.

The lemmas describe the states the step can reach (e.g. a waiting request holds no blocks; a running
request under on-demand allocation holds exactly the blocks of its computed tokens; sequence numbers
are below the counter). They are conditioned on the policy's rules, proved together with the invariant
(never assumed alone), and written with the verdict as a certificate that ``batchcheck recheck``
verifies with a fresh solver. When the step query is satisfiable, the model is a
counterexample-to-induction (CTI): a state the lemmas allow from which one step breaks something; it is
reported, and the verdict stays bounded.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from checker.frames import Frame, TraceContext
from checker.verify.budget import BuildTimeout, within
from checker.policy import Allocation, Policy, PreemptMode
from checker.semantics.blocked import refuse as refuse_blocked
from checker.semantics.state import FIELDS, Status
from checker.smt.encode import SlotParams, SlotState, max_context, slot_fields, symbolic_step
from checker.smt.ops import SmtSession, Term, Z3Ops, sum_terms
from checker.verify.env import Environment
from invariants.catalogue import Invariant

# Invariants whose check reads only the frame it is evaluated at (1-step induction applies).
STATE_INVARIANTS = frozenset({"kv_never_overcommitted", "token_budget", "seq_cap", "request_conservation"})
# Invariants that read the frame before too, with the parameter that sets how far back they look: with a
# lookback of one they are properties of one step (before -> after), proved by the same query: from any
# state the lemmas allow, one step keeps the lemmas and satisfies the property.
STEP_INVARIANTS = {"decode_progress": "gap", "cancellation_releases": "steps", "degradation_order": "gap"}
# Invariants of one step that read only the frame after it (what the step preempted or scheduled, and the state after
# it): proved by the same query. Not state invariants: action-wise induction (checker/verify/actions.py) leaves them.
FRAME_INVARIANTS = frozenset({"bounded_preemptions_per_step", "preemption_frees_capacity", "lookahead_fits"})


def supported(inv: Invariant, params: dict[str, int]) -> bool:
    if inv.name in STATE_INVARIANTS or inv.name in FRAME_INVARIANTS:
        return True
    key = STEP_INVARIANTS.get(inv.name)
    return key is not None and {**inv.defaults, **params}[key] == 1

LIVE = (Status.WAITING, Status.SWAPPED, Status.RUNNING)


def lemmas(o, policy: Policy, params: list[SlotParams], slots: list[dict[str, Term]], step: Term,
           next_seq: Term, step_us: int) -> list[tuple[str, Term]]:
    """Named structural facts about reachable states, conditioned on the policy's rules."""
    kv, max_len = policy.kv, policy.max_model_len
    swap = policy.preemption.mode is PreemptMode.SWAP
    lag = policy.cancellation.release_lag_steps
    out: list[tuple[str, Term]] = []

    def ceil(x: Term) -> Term:
        return o.ceil_div(x, kv.block_size)

    def held(i: int, tokens: Term) -> Term:
        """The blocks a request holds for `tokens` computed tokens."""
        if kv.allocation is Allocation.FULL_RESERVATION:
            prm = params[i]
            return o.max(ceil(tokens), ceil(o.min(prm.prompt_len + prm.max_output, max_len) - 1))
        return ceil(tokens)

    spec = policy.speculative
    ahead = spec.num_tokens + spec.reserved_slots if spec.enabled else 0

    def holds(i: int, blocks: Term, tokens: Term) -> Term:
        """A request's blocks for ``tokens`` computed tokens: exactly held(); with speculative decoding at least
        those and at most those of its drafts and reserved lookahead slots past them (rejected drafts keep theirs)."""
        if not ahead:
            return blocks == held(i, tokens)
        return o.and_(blocks >= held(i, tokens), blocks <= ceil(o.min(tokens + ahead, max_len)))

    for i, (s, prm) in enumerate(zip(slots, params)):
        st = s["status"]

        def is_(*xs: Status, st: Term = st) -> Term:
            return o.or_(*(st == int(x) for x in xs))

        arrived_step = prm.arrival_us / step_us  # arrival_us is a multiple of step_us
        out += [
            (f"slot{i}.ranges", slot_ranges(o, s, next_seq)),
            (f"slot{i}.pending", o.or_(o.not_(is_(Status.PENDING)), o.and_(
                arrived_step >= step, s["num_computed"] == 0, s["num_generated"] == 0, s["blocks"] == 0,
                s["swapped_blocks"] == 0, s["admitted_seq"] == 0, s["requeue_seq"] == 0, s["num_preemptions"] == 0,
                s["release_step"] == -1))),
            (f"slot{i}.arrived", o.or_(is_(Status.PENDING), arrived_step < step)),
            (f"slot{i}.live_fits", o.or_(o.not_(is_(*LIVE)), o.and_(
                prm.prompt_len + s["num_generated"] < max_len, s["num_generated"] < prm.output_len,
                s["num_computed"] + 1 <= prm.prompt_len + s["num_generated"]))),
            (f"slot{i}.admitted_prompt", o.or_(is_(Status.PENDING, Status.REJECTED), prm.prompt_len < max_len)),
            (f"slot{i}.waiting", o.or_(o.not_(is_(Status.WAITING)), o.and_(
                s["blocks"] == 0, s["num_computed"] == 0, s["swapped_blocks"] == 0))),
            (f"slot{i}.running", o.or_(o.not_(is_(Status.RUNNING)), o.and_(
                holds(i, s["blocks"], s["num_computed"]), s["num_computed"] >= 1, s["admitted_seq"] >= 1,
                s["swapped_blocks"] == 0))),
            (f"slot{i}.ended", o.or_(o.not_(is_(Status.FINISHED, Status.REJECTED)), o.and_(
                s["blocks"] == 0, s["swapped_blocks"] == 0))),
            (f"slot{i}.rejected", o.or_(o.not_(is_(Status.REJECTED)), o.and_(
                s["admitted_seq"] == 0, s["num_computed"] == 0, s["num_generated"] == 0))),
            (f"slot{i}.holds_only_running", o.or_(is_(Status.RUNNING, Status.CANCELLED), s["blocks"] == 0)),
            # a request that generated a token or was preempted was admitted (preemption keeps admitted_seq)
            (f"slot{i}.served_was_admitted", o.or_(o.and_(s["num_generated"] == 0, s["num_preemptions"] == 0),
                                                   s["admitted_seq"] >= 1)),
        ]
        if spec.enabled:  # drafts only after a step that left it decoding (a cancelled request keeps them)
            out.append((f"slot{i}.drafts", o.or_(s["drafts"] == 0, o.and_(
                s["drafts"] == spec.num_tokens, is_(Status.RUNNING, Status.CANCELLED), s["num_generated"] >= 1,
                s["num_computed"] + 1 == prm.prompt_len + s["num_generated"]))))
        if swap:
            out.append((f"slot{i}.swapped", o.or_(o.not_(is_(Status.SWAPPED)), o.and_(
                s["blocks"] == 0, s["num_computed"] >= 1, holds(i, s["swapped_blocks"], s["num_computed"])))))
            out.append((f"slot{i}.swap_only_swapped", o.or_(is_(Status.SWAPPED), s["swapped_blocks"] == 0)))
        else:
            out.append((f"slot{i}.never_swapped", o.and_(o.not_(is_(Status.SWAPPED)), s["swapped_blocks"] == 0)))
        if lag == 0:
            out.append((f"slot{i}.released", o.and_(s["release_step"] == -1,
                                                     o.or_(o.not_(is_(Status.CANCELLED)), s["blocks"] == 0))))
        else:
            out.append((f"slot{i}.release_pending", o.or_(
                s["release_step"] == -1,
                o.and_(is_(Status.CANCELLED), s["release_step"] >= step, s["release_step"] <= step - 1 + lag))))
            out.append((f"slot{i}.released", o.or_(o.not_(is_(Status.CANCELLED)), s["release_step"] != -1,
                                                    s["blocks"] == 0)))
            out.append((f"slot{i}.release_only_cancelled", o.or_(s["release_step"] == -1, is_(Status.CANCELLED))))
    for i in range(len(slots)):
        for j in range(i + 1, len(slots)):
            both = o.and_(slots[i]["status"] == int(Status.RUNNING), slots[j]["status"] == int(Status.RUNNING))
            out.append((f"slots{i},{j}.distinct_admission", o.or_(o.not_(both),
                                                                   slots[i]["admitted_seq"] != slots[j]["admitted_seq"])))
    return out + global_lemmas(o, policy, slots, step)


def _lemmas_for(inv: Invariant, o, policy: Policy, params: list[SlotParams], slots: list[dict[str, Term]], step: Term,
                next_seq: Term, step_us: int) -> list[tuple[str, Term]]:
    """The structural lemmas, and for the frame invariants (only: the other proofs keep their lemma sets) that a
    request admission let in can fit the pool alone where the policy rejects those that never fit."""
    out = lemmas(o, policy, params, slots, step, next_seq, step_us)
    if inv.name in FRAME_INVARIANTS and policy.admission.reject_never_fits:
        size, pool = policy.kv.block_size, policy.kv.num_blocks
        for i, s in enumerate(slots):
            let_in = o.and_(s["status"] != int(Status.PENDING), s["status"] != int(Status.REJECTED))
            most = max_context(o, policy, params[i].prompt_len, params[i].max_output)
            out.append((f"slot{i}.fits_alone", o.or_(o.not_(let_in), o.ceil_div(most, size) <= pool)))
    return out


def slot_ranges(o, s: dict[str, Term], next_seq: Term) -> Term:
    """A slot's fields within their ranges, its sequence numbers below the counter."""
    st = s["status"]
    return o.and_(st >= int(Status.PENDING), st <= int(Status.CANCELLED), s["num_generated"] >= 0,
                  s["num_computed"] >= 0, s["blocks"] >= 0, s["swapped_blocks"] >= 0, s["num_preemptions"] >= 0,
                  s["admitted_seq"] >= 0, s["requeue_seq"] >= 0, s["admitted_seq"] < next_seq,
                  s["requeue_seq"] < next_seq)


def global_lemmas(o, policy: Policy, slots: list[dict[str, Term]], step: Term) -> list[tuple[str, Term]]:
    """The sequence cap, the pools (where the policy checks them) and the step counter."""
    kv = policy.kv
    running = sum_terms([o.b2i(s["status"] == int(Status.RUNNING)) for s in slots])
    out = [("seq_cap", running <= policy.batch.max_num_seqs)]
    if kv.check_allocation:
        out.append(("kv_within_pool", sum_terms([s["blocks"] for s in slots]) <= kv.num_blocks))
    out.append(("swap_within_space", sum_terms([s["swapped_blocks"] for s in slots]) <= kv.swap_blocks))
    out.append(("step_nonnegative", step >= 0))
    return out


@dataclass
class InductionResult:
    status: str  # "proved", "cti" (step query satisfiable), "unknown", "unsupported"
    seconds: float = 0.0
    lemmas: list[str] = field(default_factory=list)
    certificate: str = ""  # SMT-LIB2 of the step query (unsat = proof)
    cti: list[str] = field(default_factory=list)  # what breaks, and the state before the step
    k: int = 1  # the induction depth that proved it
    tier: str = ""  # action-wise: the Houdini candidate tier that proved it
    alive: dict[str, list[str]] = field(default_factory=dict)  # action-wise: the surviving candidates per location


def _symbolic_state(smt: SmtSession, env: Environment, n: int, tag: str, policy: Policy | None = None):
    o = Z3Ops
    if policy is not None:  # no lemmas for blocked waiting states (their ready steps) yet
        refuse_blocked(policy, "proofs (induction)")
    fields = FIELDS if policy is None else slot_fields(policy)
    params, slots, cons = [], [], []
    for i in range(n):
        a = smt.int_var(f"{tag}arrival_step_{i}")
        prm = SlotParams(a * env.step_us, smt.int_var(f"{tag}prompt_{i}"), smt.int_var(f"{tag}output_{i}"),
                         smt.int_var(f"{tag}max_output_{i}"), smt.int_var(f"{tag}priority_{i}"),
                         smt.int_var(f"{tag}tenant_{i}"))
        cons += [a >= 0, prm.prompt_len >= env.prompt[0], prm.prompt_len <= env.prompt[1],
                 prm.output_len >= env.output[0], prm.output_len <= env.output[1], prm.max_output >= prm.output_len,
                 prm.max_output <= env.max_output_cap, o.or_(*(prm.priority == p for p in env.priorities)),
                 prm.tenant >= 0, prm.tenant < env.tenants]
        if params:
            cons.append(params[-1].arrival_us <= prm.arrival_us)
        params.append(prm)
        slots.append({f: smt.int_var(f"{tag}{f}_{i}") for f in fields})
    state = SlotState(slots, smt.int_var(f"{tag}next_seq"), smt.int_var(f"{tag}step"),
                      [smt.int_var(f"{tag}counter_{t}") for t in range(env.tenants)])
    cons += [c >= 0 for c in state.counters]
    return params, state, cons


def prove(policy: Policy, inv: Invariant, params_: dict[str, int], env: Environment, timeout_s: float,
          k: int = 1) -> InductionResult:
    """k-induction: from any state the lemmas allow, if the lemmas and the invariant hold over k-1 steps, they
    hold after the k-th (k = 1: plain induction). The base case checks every path of k-1 steps from the
    initial state."""
    if not supported(inv, params_):
        return InductionResult("unsupported")
    started = time.monotonic()
    try:
        with within(timeout_s):  # building counts against the time limit (checker/verify/budget.py)
            smt, broken, goal, pre, first, params = _step_query(policy, inv, params_, env, timeout_s, k)
    except BuildTimeout:
        return InductionResult("unknown", time.monotonic() - started)
    smt.set_timeout(max(1, int(1000 * (timeout_s - (time.monotonic() - started)))))
    verdict = smt.check(broken)
    seconds = time.monotonic() - started
    names = [name for name, _ in pre]
    if verdict == "unsat":
        if not _base_case(policy, inv, params_, env, k):
            return InductionResult("cti", seconds, names, cti=["the initial state breaks a lemma (a bug in the lemmas)"])
        smt.add(broken)
        return InductionResult("proved", seconds, names, certificate=smt.to_smt2(), k=k)
    if verdict == "unknown":
        return InductionResult("unknown", seconds, names)
    cti = [f"breaks: {name}" for name, term in goal if smt.value(term) is False]
    for i, s in enumerate(first.slots):
        prm = params[i]
        cti.append(f"slot {i} {k} step(s) before: " + ", ".join(f"{f}={smt.value(s[f])}" for f in FIELDS)
                   + f"; prompt={smt.value(prm.prompt_len)} output={smt.value(prm.output_len)}")
    return InductionResult("cti", seconds, names, cti=cti)


def certificate_query(policy: Policy, inv: Invariant, params_: dict[str, int], env: Environment, k: int) -> str:
    """The step query of a k-induction proof with its goal literal asserted, as SMT-LIB2: what ``prove`` writes
    as the certificate (``batchcheck recheck --policy`` rebuilds it and compares)."""
    smt, broken, *_ = _step_query(policy, inv, params_, env, 1.0, k)
    smt.add(broken)
    return smt.to_smt2()


def _step_query(policy: Policy, inv: Invariant, params_: dict[str, int], env: Environment, timeout_s: float, k: int,
                lemmas_proved: bool = False):
    """The k-induction step query (its goal literal not asserted): the session, the goal literal, the goal's
    terms, the lemmas before the steps, the first state and the slots' parameters. ``lemmas_proved``: the lemmas
    were shown inductive on their own (checker/verify/temporal_induction.py), so they are assumed after the last
    step too, and the goal is the invariant alone."""
    o = Z3Ops
    n = env.requests
    smt = SmtSession(timeout_ms=int(timeout_s * 1000))
    params, state, cons = _symbolic_state(smt, env, n, "", policy)
    smt.add(*cons)
    pre = _lemmas_for(inv, o, policy, params, state.slots, state.step, state.next_seq, env.step_us)
    zeros = tuple([0] * n)
    frames = [Frame(tuple(state.slots), zeros, tuple([False] * n), tuple([False] * n), state.kv_used,
                    (state.step - 1) * env.step_us, tuple(state.counters))]
    for _, term in pre:
        smt.add(term)
    smt.add(inv.holds(o, TraceContext(policy, tuple(params), list(frames)), 0, params_))
    first = state
    for j in range(1, k + 1):
        # the intermediate states get names (small terms, readable CTIs); the last one stays a term
        state = _step_into(smt, policy, params, state, env, frames, f"s{j}_" if j < k else None, f"cancel_{j}_")
        ctx = TraceContext(policy, tuple(params), list(frames))
        now = _lemmas_for(inv, o, policy, params, state.slots, state.step, state.next_seq, env.step_us)
        if j < k:
            smt.add(inv.holds(o, ctx, j, params_), *(t for _, t in now))
    if lemmas_proved:
        smt.add(*(t for _, t in now))
    goal = [(inv.name, inv.holds(o, ctx, k, params_))] + ([] if lemmas_proved else now)
    broken = smt.bool_var("goal_broken")
    smt.add(smt.implies(broken, o.not_(o.and_(*(t for _, t in goal)))))
    return smt, broken, goal, pre, first, params


def _step_into(smt: SmtSession, policy: Policy, params: list[SlotParams], state: SlotState, env: Environment,
               frames: list[Frame], tag: str | None, cancel_tag: str) -> SlotState:
    """One symbolic step from ``state`` (any client may cancel): append its frame, return the state after it
    (held in fresh variables named with ``tag``, or as terms when ``tag`` is None)."""
    cancels = [smt.bool_var(f"{cancel_tag}{i}") for i in range(len(state.slots))]
    accepted = None
    if policy.speculative.enabled:  # the verifier's choice per slot (0..k), as in the bounded unrolling
        accepted = [smt.int_var(f"{cancel_tag}accepted_{i}") for i in range(len(state.slots))]
        smt.add(*(a >= 0 for a in accepted), *(a <= policy.speculative.num_tokens for a in accepted))
    result = symbolic_step(Z3Ops, policy, params, state, state.step * env.step_us, cancels, accepted)
    if tag is not None:
        result = _named(smt, result, tag)
    frames.append(Frame(tuple(result.state.slots), tuple(result.scheduled), tuple(result.produced),
                        tuple(result.preempted), result.state.kv_used, state.step * env.step_us,
                        tuple(result.state.counters)))
    return result.state


def _named(smt: SmtSession, result, tag: str):
    """The step result with its state held in fresh variables (equal to the step's terms)."""
    from dataclasses import replace

    def fresh(name: str, term):
        var = smt.int_var(tag + name)
        smt.add(var == term)
        return var

    st = result.state
    slots = [{f: fresh(f"{f}_{i}", term) for f, term in slot.items()} for i, slot in enumerate(st.slots)]
    named = SlotState(slots, fresh("next_seq", st.next_seq), fresh("step", st.step),
                      [fresh(f"counter_{t}", c) for t, c in enumerate(st.counters)])
    return replace(result, state=named)


def _base_case(policy: Policy, inv: Invariant, params_: dict[str, int], env: Environment, k: int = 1) -> bool:
    """The initial state (nothing arrived, counters at their start), and every state k-1 steps or fewer
    from it, satisfies the lemmas and the invariant."""
    from checker.verify.bmc import initial_state

    o = Z3Ops
    smt = SmtSession()
    params, _, cons = _symbolic_state(smt, env, env.requests, "init_", policy)
    smt.add(*cons)
    init = initial_state(env.requests, env.tenants, policy)
    n = env.requests
    frame = Frame(tuple(init.slots), tuple([0] * n), tuple([False] * n), tuple([False] * n), 0, 0, tuple(init.counters))
    ctx = TraceContext(policy, tuple(params), [frame])
    terms = [t for _, t in _lemmas_for(inv, o, policy, params, init.slots, init.step, init.next_seq, env.step_us)]
    frames, state = [frame], init
    for j in range(1, k):  # k-induction: every path of k-1 steps from the initial state, too
        state = _step_into(smt, policy, params, state, env, frames, f"init_s{j}_", f"init_cancel_{j}_")
        ctx_j = TraceContext(policy, tuple(params), list(frames))
        terms += [inv.holds(o, ctx_j, j, params_)]
        terms += [t for _, t in _lemmas_for(inv, o, policy, params, state.slots, state.step, state.next_seq,
                                            env.step_us)]
    broken = smt.bool_var("init_broken")
    smt.add(smt.implies(broken, o.not_(o.and_(inv.holds(o, ctx, 0, params_), *terms))))
    return smt.check(broken) == "unsat"
