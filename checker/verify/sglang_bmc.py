"""Bounded model checking of SGLang's rules (``scheduler: sglang``, radix cache off) with z3: the bounded search of
checker/verify/bmc.py over the SGLang encoding (checker/smt/sglang.py), selected by ``verify --cache-method z3``.

The requests are the plain unrolling's (ranges, not finite domains: z3 picks any prompt and output within them).
The new-token ratio is exact (an integer count of 1/unit) with a float error bound. The search runs on *exact* paths only: each step asserts
that no comparison of the prefill adder was within the bound (the step's ``inexact`` term is false), where the engine's
float and the exact value lead the same way; so a counterexample is a path the engine takes too (it is replayed on the
engine, any disagreement is a bug in batchcheck, exit 101). A bounded "holds" is decided only when a second query shows
that no inexact step is reachable within the bounds (then the exact paths are all the engine's paths); otherwise the
verdict is UNKNOWN, saying so (docs/semantics.md, "SGLang in z3"). Where no retraction fits the bounds and no decayed
ratio lands near an integer multiple, arithmetic settles that second question without the solver.
"""

from __future__ import annotations

import time
from pathlib import Path

from checker.frames import Frame, TraceContext
from checker.policy import Policy
from checker.semantics.state import FIELDS
from checker.smt.ops import SmtSession, Z3Ops
from checker.smt.sglang import (SGLANG_FIELDS, SGLangGlobals, SGLangSlotState, capped_params, initial_globals,
                                ratio_unit, require_sglang_encodable, sglang_blank_slot, sglang_step,
                                statically_exact)
from checker.semantics.sglang import longest_prompt
from checker.verify.bmc import Deadline, Unrolling
from checker.verify.env import Environment, symbolic_requests
from invariants.catalogue import Invariant

METHOD = "z3 bounded model checking of SGLang's rules (radix cache off, exact new-token ratio)"


class SGLangUnrolling(Unrolling):
    """The symbolic trace of n slots under SGLang's rules. Each step's exactness (no ambiguous comparison) is asserted
    under the literal ``exact``, which every check of the session assumes; the last unrolling of N slots
    (``SGLangUnrolling.last``) then answers, on the same incremental solver, whether an inexact step is reachable."""

    last: SGLangUnrolling | None = None

    def __init__(self, smt: SmtSession, policy: Policy, env: Environment, n: int):
        require_sglang_encodable(policy)
        self.smt, self.policy, self.env, self.n, self.tag = smt, policy, env, n, ""
        self.requests = symbolic_requests(smt, Z3Ops, env, n)
        smt.add(*self.requests.constraints)
        self.state = SGLangSlotState(slots=[sglang_blank_slot(policy) for _ in range(n)], next_seq=1, step=0,
                                     counters=[0] * env.tenants,
                                     g=initial_globals(policy, ratio_unit(policy, n, env.max_output_cap)))
        self.fields = FIELDS + SGLANG_FIELDS
        self.shape = None
        self.frames: list[Frame] = []
        self.most_output = env.max_output_cap  # (the ratio's unit, ratio_unit, is fixed by it and n)
        self.ctx = TraceContext(policy, tuple(capped_params(Z3Ops, policy, self.requests.params)), self.frames)
        self.verdicts: list = []  # Unrolling's verifier choices: none (speculative decoding is refused above)
        self.inexact: list = []  # per step: a comparison of the adder was ambiguous
        self.exact = True  # fewer slots than N: exactness asserted outright (no inexact query is asked of them)
        if n == env.requests:
            self.exact = smt.bool_var("exact_paths")
            plain = smt.check
            smt.check = lambda *assumptions: plain(*assumptions, self.exact)  # the search sees exact paths only
            self.check_any_path = plain
            SGLangUnrolling.last = self

    def extend(self) -> None:
        smt, k = self.smt, len(self.frames)
        now = k * self.env.step_us
        result = sglang_step(Z3Ops, self.policy, self.requests.params, self.state, now,
                             self.requests.cancels_at(Z3Ops, k), self.most_output)

        def fresh(name: str, term, kind: str = "int"):
            var = smt.bool_var(name) if kind == "bool" else smt.int_var(name)
            smt.add(var == term)
            return var

        st, g = result.state, result.state.g
        slots = [{f: fresh(f"{f}_{i}@{k}", slot[f]) for f in self.fields} for i, slot in enumerate(st.slots)]
        globals_ = SGLangGlobals(fresh(f"chunked@{k}", g.chunked), fresh(f"full@{k}", g.full, "bool"),
                                 fresh(f"shrunk@{k}", g.shrunk, "bool"), fresh(f"ran_batch@{k}", g.ran_batch, "bool"),
                                 fresh(f"ratio@{k}", g.ratio), fresh(f"age@{k}", g.age),
                                 fresh(f"next_entry@{k}", g.next_entry))
        inexact = fresh(f"inexact@{k}", result.inexact, "bool")
        self.inexact.append(inexact)
        smt.add(Z3Ops.not_(inexact) if self.exact is True else smt.implies(self.exact, Z3Ops.not_(inexact)))
        self.state = SGLangSlotState(slots=slots, next_seq=fresh(f"next_seq@{k}", st.next_seq),
                                     step=fresh(f"step@{k}", st.step),
                                     counters=[fresh(f"counter_{t}@{k}", c) for t, c in enumerate(st.counters)],
                                     g=globals_)
        self.frames.append(Frame(
            slots=tuple(slots),
            scheduled=tuple(fresh(f"scheduled_{i}@{k}", x) for i, x in enumerate(result.scheduled)),
            produced=tuple(fresh(f"produced_{i}@{k}", x, "bool") for i, x in enumerate(result.produced)),
            preempted=tuple(fresh(f"preempted_{i}@{k}", x, "bool") for i, x in enumerate(result.preempted)),
            kv_used=self.state.kv_used, now_us=now, counters=tuple(self.state.counters), pool=None))


def inexact_reachable(policy: Policy, env: Environment, deadline: Deadline) -> str:
    """Whether a step whose adder meets an ambiguous float comparison is reachable within N requests and K
    iterations: "sat", "unsat" (every engine path is an exact path) or "unknown". By arithmetic where it settles it
    (statically_exact), else asked of the N-slot search's own solver (its unrolling to depth K, without the
    exactness literal)."""
    u = SGLangUnrolling.last
    SGLangUnrolling.last = None
    longest = min(env.prompt[1], longest_prompt(policy))
    if statically_exact(policy, env.requests, env.depth, longest, env.max_output_cap):
        return "unsat"
    if u is None or u.n != env.requests or len(u.frames) != env.depth:
        return "unknown"
    u.smt.set_rlimit(0)
    u.smt.set_timeout(deadline.left_ms())
    first = [Z3Ops.and_(x, *(Z3Ops.not_(y) for y in u.inexact[:k])) for k, x in enumerate(u.inexact)]
    return u.check_any_path(Z3Ops.or_(*first))  # the first inexact step: an exact path up to it


def check_many(policy: Policy, policy_file: str | None, invariants: list[tuple[Invariant, dict[str, int]]],
               env: Environment, timeout_s: float, out_dir: Path | None, progress=None) -> list:
    """Verdicts for the invariants of an SGLang policy by z3 BMC over the SGLang encoding."""
    from checker.verify.bmc import search
    from checker.verify.run import Checked, Verdict, confirm_on_engine, save_counterexample

    require_sglang_encodable(policy)
    out = []
    for inv, params in invariants:
        started = time.monotonic()
        outcome = search(policy, inv, params, env, timeout_s, progress)
        if outcome.status == "unknown":
            out.append(Checked(inv, params, Verdict.UNKNOWN, env, time.monotonic() - started,
                               depth=outcome.depth_reached, method=METHOD))
        elif outcome.status == "holds":
            left = Deadline(max(1.0, timeout_s - (time.monotonic() - started)))
            reach = inexact_reachable(policy, env, left)
            seconds = time.monotonic() - started
            if reach != "unsat":
                why = ("inexact: a reachable state's prefill-adder comparison is within the float error bound of the "
                       "exact new-token ratio, so the exact paths may miss one of the engine's"
                       if reach == "sat" else "inexact: whether an ambiguous float comparison is reachable was not "
                       "decided in time")
                out.append(Checked(inv, params, Verdict.UNKNOWN, env, seconds, depth=outcome.depth_reached,
                                   method=METHOD, notes=[why]))
            else:
                verdict = Verdict.VACUOUS if outcome.vacuous else Verdict.HOLDS_UP_TO
                # (a VACUOUS line reads a note as its at-any-depth reason: none here, its situation is bounded)
                notes = [] if outcome.vacuous else [f"by {METHOD}; every path within the bounds exact"]
                out.append(Checked(inv, params, verdict, env, seconds, depth=outcome.depth_reached, method=METHOD,
                                   notes=notes))
        else:
            found = outcome.found
            step = confirm_on_engine(policy, inv, params, env, found)
            path = save_counterexample(policy, policy_file, inv, params, env, found.specs, step, found.frames,
                                       outcome.minimal_checked, "; ".join(outcome.notes), METHOD, out_dir)
            out.append(Checked(inv, params, Verdict.VIOLATED, env, time.monotonic() - started, depth=found.depth,
                               requests=len(found.specs), violation_step=step, counterexample=path,
                               notes=outcome.notes, specs=found.specs, method=METHOD))
    return out
