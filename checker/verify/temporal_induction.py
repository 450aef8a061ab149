"""k-induction for the windowed temporal invariants (decode_progress(gap), cancellation_releases(steps),
bounded_starvation(steps)): PROVED for N request slots and any number of iterations.

A windowed invariant P(t) reads the frames t-w .. t (w: its window, the parameter named in WINDOWS); frame t is
the step of iteration t and the state after it (the bounded search's frames; checker/verify/bmc.py). With the
structural lemmas L of checker/verify/induction.py as the strengthening (never assumed unproved), and k >= w:

- lemmas: L alone is inductive (one step from any L-state keeps L); one query per policy and N, cached. Where
  it is not, L is proved together with P instead (in the step query's goal, and along the base case's paths);
- base: L holds in the initial state, and P at each frame of every path of k steps from it (bounded model
  checking to depth k: verify's bounded search, which goes at least that deep, is not repeated);
- step: from any state x0 that satisfies L, taken as frame 0 (the state after some step: what the windows read of
  their first frame is its state and the clock of its step, which the state's step counter gives), along any k
  steps (frames 1 .. k, states x1 .. xk): if L holds in x1 .. x(k-1) (and xk, once L is proved alone) and P at
  every frame j < k (where its window fits, j >= w; it is true by definition where it does not), then P holds at
  frame k (its window k-w .. k lies in the path) (and L in xk, where L is not proved alone). This is whole-step
  induction's query (checker/verify/induction.py) with k >= w.

No frame before x0 is read, and x0's step information (what was scheduled or produced) is never read, so the
hypotheses are exactly what the induction hypothesis gives at iteration t >= k (frame 0 = the frame of iteration
t-k), and P at every iteration follows. Paths are simple by construction (the step counter is part of the state
and grows by one per step), so a simple-path constraint would add nothing. When the step query is satisfiable
its model is a counterexample to induction (a path the lemmas allow, not shown reachable): the verdict stays
bounded (HOLDS_UP_TO), never PROVED.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

from checker.policy import Policy
from checker.semantics.state import FIELDS
from checker.smt.ops import SmtSession, Z3Ops
from checker.verify.budget import BuildTimeout, within
from checker.verify.env import Environment
from invariants.catalogue import Invariant

# The temporal invariants, with the parameter that is their window (how many iterations back they read)
WINDOWS = {"decode_progress": "gap", "cancellation_releases": "steps", "bounded_starvation": "steps"}
MAX_WINDOW = 8  # k-induction unrolls k >= window steps: beyond 8 the step query is too large to be useful
# k tried beyond the window while the step query has a counterexample to induction
EXTRA_K = 1

METHOD = "temporal-induction"  # the certificate's method (checker/verify/certificate.py)


def window(inv: Invariant, params: dict[str, int]) -> int | None:
    """The invariant's window in iterations, None if it is not a windowed temporal invariant."""
    key = WINDOWS.get(inv.name)
    return None if key is None else {**inv.defaults, **params}[key]


def refusal(inv: Invariant, params: dict[str, int], policy: Policy) -> str | None:
    """Why the temporal k-induction does not apply (None when it does)."""
    w = window(inv, params)
    if w is None:
        return f"a windowed temporal invariant ({', '.join(WINDOWS)}), not {inv.name}"
    if not 1 <= w <= MAX_WINDOW:
        return (f"a window of 1..{MAX_WINDOW} iterations, not {WINDOWS[inv.name]}={w} (k-induction unrolls k >= "
                "window steps)")
    if policy.kv.prefix_caching.enabled or policy.connector.enabled:
        return ("a policy without prefix caching or a KV connector (no structural lemmas for the prefix cache's or "
                "a connector's states)")
    return None


@dataclass
class TemporalResult:
    status: str  # "proved", "cti" (step query satisfiable), "base" (the base case fails), "unknown"
    k: int
    seconds: float = 0.0
    lemmas: list[str] = field(default_factory=list)
    certificate: str = ""  # SMT-LIB2 of the step query with its goal literal asserted (unsat = the step holds)
    cti: list[str] = field(default_factory=list)  # what breaks, and the path's first state
    tier: str = ""  # LEMMAS_FIRST: the lemmas were proved inductive on their own, then assumed in the step query


def _step_query(policy: Policy, inv: Invariant, params_: dict[str, int], env: Environment, k: int,
                timeout_s: float, lemmas_proved: bool):
    """The step query of k-induction (goal literal not asserted): session, goal literal, goal terms, lemma names,
    the first state and the slots' parameters. Whole-step induction's query (checker/verify/induction.py) with
    k >= the window: its first frame is the state x0 alone (no step info; its clock is the one of the step that
    produced it), which is all the windows read of it (the module docstring), and the invariant is assumed at
    each frame j < k (true by definition where its window does not fit, j < w). ``lemmas_proved``: the lemmas
    are assumed after the last step too (shown inductive on their own by the lemma query), the goal is P alone."""
    from checker.verify.induction import _step_query as whole_step_query

    assert k >= window(inv, params_)
    smt, broken, goal, pre, first, params = whole_step_query(policy, inv, params_, env, timeout_s, k, lemmas_proved)
    return smt, broken, goal, [name for name, _ in pre], first, params


def _lemma_query(policy: Policy, inv: Invariant, env: Environment, timeout_s: float):
    """The lemmas alone are inductive: from any state that satisfies them, one step (any arrivals, lengths,
    cancellations) keeps them. Session and goal literal (not asserted)."""
    from checker.verify.induction import _lemmas_for, _step_into, _symbolic_state

    o = Z3Ops
    smt = SmtSession(timeout_ms=max(1, int(timeout_s * 1000)))
    params, state, cons = _symbolic_state(smt, env, env.requests, "", policy)
    smt.add(*cons)

    def lemmas_at(s):
        return [t for _, t in _lemmas_for(inv, o, policy, params, s.slots, s.step, s.next_seq, env.step_us)]

    smt.add(*lemmas_at(state))
    after = _step_into(smt, policy, params, state, env, [], None, "cancel_0_")
    broken = smt.bool_var("lemmas_broken")
    smt.add(smt.implies(broken, o.not_(o.and_(*lemmas_at(after)))))
    return smt, broken


# The lemma query's answer and certificate text per (policy, environment less its depth): shared by the temporal
# invariants and windows of one verify run (the lemmas do not depend on them)
_LEMMAS: dict[tuple[str, Environment], tuple[str, str]] = {}
LEMMAS_FIRST = "lemmas-first"  # the certificate's tier: the lemma query, then the step query assuming them


def _lemmas_inductive(policy: Policy, inv: Invariant, env: Environment, timeout_s: float) -> tuple[str, str]:
    key = (policy.model_dump_json(), replace(env, depth=1))
    if key not in _LEMMAS:
        smt, broken = _lemma_query(policy, inv, env, timeout_s)
        answer = smt.check(broken)
        if answer == "unknown":
            return answer, ""
        smt.add(broken)
        _LEMMAS[key] = (answer, smt.to_smt2() if answer == "unsat" else "")
    return _LEMMAS[key]


def _blocks(lemma_text: str, step_text: str) -> str:
    from checker.smt.ops import CERTIFICATE_BLOCK
    return f"{CERTIFICATE_BLOCK}lemmas\n{lemma_text}\n{CERTIFICATE_BLOCK}step\n{step_text}"


def certificate_query(policy: Policy, inv: Invariant, params_: dict[str, int], env: Environment, k: int,
                      tier: str = "") -> str:
    """The certificate's queries, goal literals asserted, as SMT-LIB2 (``batchcheck recheck --policy`` rebuilds
    them): with tier LEMMAS_FIRST the lemma query and the step query assuming the lemmas, else the step query
    with the lemmas in its goal."""
    smt, broken, *_ = _step_query(policy, inv, params_, env, k, 1.0, tier == LEMMAS_FIRST)
    smt.add(broken)
    if tier != LEMMAS_FIRST:
        return smt.to_smt2()
    lemma_smt, lemma_broken = _lemma_query(policy, inv, env, 1.0)
    lemma_smt.add(lemma_broken)
    return _blocks(lemma_smt.to_smt2(), smt.to_smt2())


def base_case(policy: Policy, inv: Invariant, params_: dict[str, int], env: Environment, k: int,
              timeout_s: float, lemmas_alone: bool = False, searched: int = 0) -> str:
    """Bounded model checking to depth k: "unsat" when every path of k steps from the initial state keeps the
    lemmas in each state and the invariant at each frame; "sat" or "unknown" otherwise. ``lemmas_alone``: the
    lemmas were shown inductive on their own, so they need checking in the initial state only, and the invariant
    is searched depth by depth (checker/verify/bmc.py), not at all where the caller's bounded search already
    covered ``searched`` >= k iterations with N slots."""
    from checker.verify.bmc import Deadline, Unrolling, _shortest_violation
    from checker.verify.induction import _lemmas_for

    o = Z3Ops
    started = time.monotonic()
    smt = SmtSession(timeout_ms=max(1, int(timeout_s * 1000)))
    u = Unrolling(smt, policy, replace(env, depth=k), env.requests)
    params = u.requests.params

    def lemmas_at(s):
        return [t for _, t in _lemmas_for(inv, o, policy, params, s.slots, s.step, s.next_seq, env.step_us)]

    terms = lemmas_at(u.state)
    for t in range(0 if lemmas_alone else k):
        u.extend()
        terms += lemmas_at(u.state) + [inv.holds(o, u.ctx, t, params_)]
    broken = smt.bool_var("base_broken")
    smt.add(smt.implies(broken, o.not_(o.and_(*terms))))
    answer = smt.check(broken)
    if answer != "unsat" or not lemmas_alone or searched >= k:
        return answer
    left = timeout_s - (time.monotonic() - started)
    status, *_ = _shortest_violation(policy, inv, params_, replace(env, depth=k), env.requests, k, Deadline(left))
    return {"holds": "unsat", "violated": "sat"}.get(status, "unknown")


def prove(policy: Policy, inv: Invariant, params_: dict[str, int], env: Environment, timeout_s: float,
          k: int | None = None, searched: int = 0) -> TemporalResult:
    """k-induction with k = the window (then up to EXTRA_K more while a counterexample to induction remains), or
    the k given. The base case last (only when the step holds). ``searched``: the depth to which the caller's
    bounded search (N slots, this environment) found no violation of the invariant."""
    why = refusal(inv, params_, policy)
    if why is not None:
        raise ValueError(why)
    w = window(inv, params_)
    started = time.monotonic()
    deadline = started + timeout_s
    result = TemporalResult("unknown", w)
    for kk in ([k] if k is not None else range(w, w + EXTRA_K + 1)):
        left = deadline - time.monotonic()
        if left <= 0:
            break
        result = _prove_k(policy, inv, params_, env, kk, left, searched)
        if result.status != "cti":
            break
    result.seconds = time.monotonic() - started
    return result


def _prove_k(policy: Policy, inv: Invariant, params_: dict[str, int], env: Environment, k: int,
             timeout_s: float, searched: int) -> TemporalResult:
    started = time.monotonic()
    lemma_answer, lemma_text = _lemmas_inductive(policy, inv, env, timeout_s)
    if lemma_answer == "unknown":
        return TemporalResult("unknown", k)
    split = lemma_answer == "unsat"  # else the lemmas stay in the step query's goal
    left = timeout_s - (time.monotonic() - started)
    try:
        with within(left):  # building counts against the time limit (checker/verify/budget.py)
            smt, broken, goal, names, first, params = _step_query(policy, inv, params_, env, k, left, split)
    except BuildTimeout:
        return TemporalResult("unknown", k)
    smt.set_timeout(max(1, int(1000 * (timeout_s - (time.monotonic() - started)))))
    answer = smt.check(broken)
    if answer == "unknown":
        return TemporalResult("unknown", k, lemmas=names)
    if answer == "sat":
        cti = [f"breaks: {name}" for name, term in goal if smt.value(term) is False]
        for i, s in enumerate(first.slots):
            cti.append(f"slot {i} {k} step(s) before: " + ", ".join(f"{f}={smt.value(s[f])}" for f in FIELDS)
                       + f"; arrival step={smt.value(params[i].arrival_us) // env.step_us}, "
                       f"prompt={smt.value(params[i].prompt_len)} output={smt.value(params[i].output_len)}")
        return TemporalResult("cti", k, lemmas=names, cti=cti)
    smt.add(broken)
    certificate = _blocks(lemma_text, smt.to_smt2()) if split else smt.to_smt2()
    left = timeout_s - (time.monotonic() - started)
    if left <= 0:
        return TemporalResult("unknown", k, lemmas=names)
    base = base_case(policy, inv, params_, env, k, left, split, searched)
    if base != "unsat":
        return TemporalResult("base" if base == "sat" else "unknown", k, lemmas=names)
    return TemporalResult("proved", k, lemmas=names, certificate=certificate, tier=LEMMAS_FIRST if split else "")


def method_words(policy: Policy, result: TemporalResult, env: Environment) -> str:
    """What a PROVED verdict says about its method."""
    how = "proved inductive on their own first" if result.tier == LEMMAS_FIRST else "proved with it"
    return (f"k-induction, k={result.k}, N={env.requests}, pool={policy.kv.num_blocks} blocks; strengthened by "
            f"{len(result.lemmas)} structural lemmas {how}; base case: bounded model checking to depth {result.k}")


def search_environment(inv: Invariant, params: dict[str, int], env: Environment) -> Environment:
    """The bounded search's environment: at least as deep as the deepest base case k-induction may need (so a
    violation within it is found by the search, and replayed on the engine, not only by the base case)."""
    return replace(env, depth=max(env.depth, window(inv, params) + EXTRA_K))


def upgrade(checked, policy: Policy, timeout_s: float, proof_dir, policy_file: str | None = None) -> None:
    """A HOLDS_UP_TO verdict of verify --temporal-induction to PROVED when k-induction proves it; else the verdict
    stays bounded and a note says why (a counterexample to induction, a timeout)."""
    from checker.verify.run import Verdict, _write_certificate

    inv, env = checked.invariant, checked.env
    result = prove(policy, inv, checked.params, env, max(1.0, timeout_s), searched=checked.depth)
    ks = f"k={window(inv, checked.params)}..{result.k}" if result.k > window(inv, checked.params) else f"k={result.k}"
    if result.status == "proved":
        checked.verdict = Verdict.PROVED
        checked.lemmas, checked.induction_depth = len(result.lemmas), result.k
        checked.method = method_words(policy, result, env)
        checked.certificate = _write_certificate(
            policy, inv, env, proof_dir, result.certificate,
            ("lemma query below is unsat iff one step from any state the lemmas allow keeps them, and the " if
             result.tier else "")
            + f"step query below is unsat iff every {result.k}-step path from a state the lemmas allow, keeping the "
            f"lemmas and {inv.name} before its last step, keeps {'it' if result.tier else 'them'} after it "
            f"({result.k}-induction; base case: bounded model checking to depth {result.k})", result.lemmas,
            params=checked.params, method=METHOD, k=result.k, tier=result.tier, policy_file=policy_file)
    elif result.status == "cti":
        checked.notes.append(f"k-induction ({ks}) not proved: counterexample to induction (a path the lemmas allow, "
                             "not shown reachable): " + "; ".join(result.cti[:3]))
    elif result.status == "base":
        checked.notes.append(f"k-induction ({ks}) not proved: a path of {result.k} steps from the initial state breaks "
                             "a structural lemma (a bug in the lemmas)")
    else:
        checked.notes.append(f"k-induction ({ks}) did not finish within the time given")


def refuse_unless_applies(policy: Policy, chosen: list[tuple[Invariant, dict[str, int]]], unbounded: bool | None,
                          any_n: bool) -> None:
    """verify --temporal-induction: refused by name (exit 2) with a proof turned off, with --any-n, on a policy
    checked on the engine or without the structural lemmas, or for a windowed invariant whose window is beyond
    MAX_WINDOW."""
    from checker.errors import InputError, Problem
    from checker.policy import Scheduler

    if any_n:
        raise InputError(Problem("--temporal-induction", True, "without --any-n: k-induction proves the temporal "
                                 "invariants for N slots; --any-n covers state invariants only"))
    if unbounded is False:
        raise InputError(Problem("--temporal-induction", True, "without --bounded-only (k-induction is a proof)"))
    if policy.scheduler is Scheduler.SGLANG:
        raise InputError(Problem("--temporal-induction", True, "a policy in the z3 encoding: scheduler sglang is "
                                 "checked on the engine (no k-induction)"))
    for inv, params in chosen:
        if inv.name in WINDOWS and (why := refusal(inv, params, policy)) is not None:
            raise InputError(Problem("--temporal-induction", inv.name, why))
