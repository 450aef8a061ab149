"""Bounded model checking: unroll the symbolic step over K iterations and ask z3 for a violation.

Each iteration's state gets fresh variables (the step's terms stay small and the model is easy to
read back). Depth d is checked under an assumption literal that turns on "the invariant fails at
iteration d", so one incremental solver serves all depths (the issue's experiment found this far faster
than push/pop or a fresh solver per depth). The first satisfiable depth is the shortest violation.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from checker.frames import Frame, TraceContext
from checker.policy import Policy, Scheduler
from checker.semantics.state import FIELDS, Status
from checker.requests import RequestSpec
from checker.smt.encode import SlotState, blank_slot, require_no_speculative, slot_fields, symbolic_step
from checker.smt.ops import SmtSession, Z3Ops
from checker.verify.budget import BuildTimeout, within
from checker.verify.env import Environment, SymbolicRequests, concrete_requests, symbolic_requests
from invariants.catalogue import Invariant


def initial_state(n: int, tenants: int, policy: Policy | None = None) -> SlotState:
    """Every slot not yet arrived; with ``policy``, the slot fields its encoding has (a KV connector's too)."""
    if policy is not None:
        return SlotState(slots=[blank_slot(policy) for _ in range(n)], next_seq=1, step=0, counters=[0] * tenants)
    blank = {f: 0 for f in FIELDS}
    blank["status"] = int(Status.PENDING)
    blank["release_step"] = -1
    return SlotState(slots=[dict(blank) for _ in range(n)], next_seq=1, step=0, counters=[0] * tenants)


class Unrolling:
    """The symbolic trace of n slots, one iteration at a time."""

    def __init__(self, smt: SmtSession, policy: Policy, env: Environment, n: int,
                 requests: SymbolicRequests | None = None, tag: str = ""):
        """``requests``: share the arrivals of another unrolling (a product of two policies on the same
        symbolic trace); ``tag`` prefixes this unrolling's variable names so the two stay apart."""
        self.smt, self.policy, self.env, self.n, self.tag = smt, policy, env, n, tag
        if tag:  # a product of two policies (diff): their verifiers' choices are not paired yet
            require_no_speculative(policy)
        caching = policy.kv.prefix_caching.enabled
        if requests is None:
            if caching:  # the prompts' identities too, from finite domains (checker/verify/cache_bmc.py)
                from checker.verify.cache_bmc import cache_requests
                requests = cache_requests(smt, Z3Ops, policy, env, n)
            else:
                requests = symbolic_requests(smt, Z3Ops, env, n)
            smt.add(*requests.constraints)
        self.requests: SymbolicRequests = requests
        self.state = initial_state(n, env.tenants, policy)
        self.fields = slot_fields(policy)
        self.shape = None
        if caching:  # the block pool with block identity (checker/smt/pool.py), empty at the start
            from checker.verify.cache_bmc import initial_pool
            self.shape, self.state.pool = initial_pool(policy, env, n)
        self.frames: list[Frame] = []
        self.ctx = TraceContext(policy, tuple(self.requests.params), self.frames)
        # speculative decoding: per iteration, whether each slot's row verified its drafts and how many it accepted
        self.verdicts: list[tuple[list, list]] = []

    def acceptance(self, k: int) -> list | None:
        """The verifier's choice per slot at iteration k (speculative decoding only): 0..num_tokens drafts accepted
        (clamped by the step to the drafts scheduled), an input of the environment like a cancel."""
        spec = self.policy.speculative
        if not spec.enabled:
            return None
        chosen = [self.smt.int_var(f"{self.tag}accepted_{i}@{k}") for i in range(self.n)]
        self.smt.add(*(a >= 0 for a in chosen), *(a <= spec.num_tokens for a in chosen))
        return chosen

    def extend(self) -> None:
        smt, k = self.smt, len(self.frames)
        now = k * self.env.step_us
        result = symbolic_step(Z3Ops, self.policy, self.requests.params, self.state, now,
                               self.requests.cancels_at(Z3Ops, k), self.acceptance(k))
        if result.verified:
            self.verdicts.append((result.verified, result.accepted))

        def fresh(name: str, term, boolean: bool = False):
            name = self.tag + name
            var = smt.bool_var(name) if boolean else smt.int_var(name)
            smt.add(var == term)
            return var

        slots = [{f: fresh(f"{f}_{i}@{k}", slot[f]) for f in self.fields} for i, slot in enumerate(result.state.slots)]
        st = result.state
        facts = None
        if st.pool is not None:
            from checker.verify.cache_bmc import fresh_pool
            pool, facts = fresh_pool(st.pool, [slot["blocks"] for slot in slots], self.requests.params, fresh, k)
        self.state = SlotState(slots=slots, next_seq=fresh(f"next_seq@{k}", st.next_seq),
                               step=fresh(f"step@{k}", st.step),
                               counters=[fresh(f"counter_{t}@{k}", c) for t, c in enumerate(st.counters)],
                               pool=None if facts is None else pool,
                               next_load=fresh(f"next_load@{k}", st.next_load) if self.policy.connector.enabled else 1)
        self.frames.append(Frame(
            slots=tuple(slots),
            scheduled=tuple(fresh(f"scheduled_{i}@{k}", x) for i, x in enumerate(result.scheduled)),
            produced=tuple(fresh(f"produced_{i}@{k}", x, True) for i, x in enumerate(result.produced)),
            preempted=tuple(fresh(f"preempted_{i}@{k}", x, True) for i, x in enumerate(result.preempted)),
            kv_used=self.state.kv_used if facts is None else facts.held, now_us=now,
            counters=tuple(self.state.counters), pool=facts,
            # blocked waiting states: the slots whose grammar the scan of this iteration found not ready
            blocked=tuple(slot["ready_step"] > k for slot in slots) if "ready_step" in self.fields else frozenset()))

    def concrete_requests(self, horizon: int) -> list[RequestSpec]:
        specs = concrete_requests(self.smt, self.requests, self.env, horizon)
        if self.verdicts:  # each request's accepted list: its verifying rows' choices in order (the engine reads it)
            v = self.smt.value
            specs = [replace(spec, accepted=tuple(v(taken[i]) for verified, taken in self.verdicts[:horizon]
                                                  if v(verified[i])))
                     for i, spec in enumerate(specs)]
        if self.shape is None:
            return specs
        from checker.verify.cache_bmc import with_contents
        return with_contents(self.smt, self.requests, self.policy, specs)

    def frame_values(self, upto: int) -> list[dict]:
        """The model's frames 0..upto-1 as plain values (what the counterexample file stores)."""
        v = self.smt.value
        out = []
        for k, f in enumerate(self.frames[:upto]):
            out.append({
                "now_us": f.now_us, "kv_used": v(f.kv_used),
                "requests": [{**{name: v(slot[name]) for name in FIELDS}, "scheduled": v(f.scheduled[i]),
                              "produced": bool(v(f.produced[i])), "preempted": bool(v(f.preempted[i])),
                              **self._speculative_values(k, i)}
                             for i, slot in enumerate(f.slots)]})
        return out


    def _speculative_values(self, k: int, i: int) -> dict:
        """What a frame of the counterexample file shows of speculative decoding (nothing without it): the drafts
        the request holds after iteration k, and the drafts its row accepted there (verifying rows only)."""
        if not self.verdicts:
            return {}
        v = self.smt.value
        verified, taken = self.verdicts[k]
        return {"drafts": v(self.frames[k].slots[i]["drafts"]),
                **({"accepted": v(taken[i])} if v(verified[i]) else {})}


@dataclass
class Found:
    requests: int  # slots in the encoding
    depth: int  # iterations up to and including the violating one
    specs: list[RequestSpec]
    frames: list[dict]


@dataclass
class Search:
    status: str  # "violated", "holds", "unknown"
    depth_reached: int = 0  # deepest depth decided for the widest encoding
    found: Found | None = None
    vacuous: bool = False
    vacuity_undecided: bool = False  # the trigger check was not decided within its resource count
    minimal_checked: bool = False
    notes: list[str] = field(default_factory=list)


class Deadline:
    def __init__(self, seconds: float):
        self.end = time.monotonic() + seconds

    def left_ms(self) -> int:
        return int(1000 * (self.end - time.monotonic()))

    @property
    def passed(self) -> bool:
        return self.left_ms() <= 0


Progress = Callable[[str], None]


def _shortest_violation(policy: Policy, inv: Invariant, params: dict[str, int], env: Environment, n: int,
                        max_depth: int, deadline: Deadline, check_trigger: bool = False,
                        progress: Progress | None = None) -> tuple[str, int, Found | None, str]:
    """Check depths 1..max_depth with n slots. Returns (status, depth reached, found, whether the trigger is
    reachable: "reachable", "unreachable" or "unknown"; with ``check_trigger``, decided within a fixed resource
    count, not the clock: the same answer on every run)."""
    smt = SmtSession()
    try:
        with within(deadline.left_ms() / 1000):  # building counts against the time limit (checker/verify/budget.py)
            u = _unrolling(smt, policy, env, n)
    except BuildTimeout:
        return "unknown", 0, None, "unknown"
    trigger_seen = []
    for depth in range(1, max_depth + 1):
        if deadline.passed:
            return "unknown", depth - 1, None, "unknown"
        if progress is not None:
            progress(f"{inv.name}: {n} requests, depth {depth}/{max_depth}")
        t = depth - 1
        try:
            with within(deadline.left_ms() / 1000):
                u.extend()
                fails = smt.bool_var(f"fails@{t}")
                smt.add(smt.implies(fails, Z3Ops.not_(inv.holds(Z3Ops, u.ctx, t, params))))
                if check_trigger:
                    trigger_seen.append(inv.triggered(Z3Ops, u.ctx, t, params))
        except BuildTimeout:
            return "unknown", depth - 1, None, "unknown"
        smt.set_timeout(deadline.left_ms())
        result = smt.check(fails)
        if result == "unknown":
            return "unknown", depth - 1, None, "unknown"
        if result == "sat":
            found = Found(n, depth, u.concrete_requests(depth), u.frame_values(depth))
            return "violated", depth, found, "reachable"
    reachable = "reachable"
    if check_trigger:  # a side check: an engine probe within the depth, else z3 bounded by its resource count, not
        # by the clock (vacuity.VACUITY_RLIMIT): the same answer on every run either way
        from checker.verify.vacuity import VACUITY_RLIMIT, engine_witness_within_depth, reach_answer

        if n == env.requests and max_depth == env.depth and engine_witness_within_depth(policy, inv, params, env):
            return "holds", max_depth, None, "reachable"

        seen = smt.bool_var("trigger_seen")
        smt.add(smt.implies(seen, Z3Ops.or_(*trigger_seen)))
        smt.set_timeout(NO_CLOCK_MS)
        smt.set_rlimit(VACUITY_RLIMIT)
        reachable = reach_answer(smt.check(seen), env).status
    return "holds", max_depth, None, reachable


def _unrolling(smt: SmtSession, policy: Policy, env: Environment, n: int) -> Unrolling:
    """The unrolling of the policy's rules: SGLang's (checker/verify/sglang_bmc.py) or the vLLM encoding's."""
    if policy.scheduler is Scheduler.SGLANG:
        from checker.verify.sglang_bmc import SGLangUnrolling
        return SGLangUnrolling(smt, policy, env, n)
    return Unrolling(smt, policy, env, n)


NO_CLOCK_MS = 2**32 - 1  # z3's "timeout" that never fires (a side check bounded by a resource count instead)


# Seconds an induction attempt may take to rule out violations with fewer requests before unrolling them.
INDUCTION_SHORTCUT_S = 3.0


def _proved_for_any_depth(policy: Policy, inv: Invariant, params: dict[str, int], env: Environment, n: int,
                          deadline: Deadline) -> bool:
    """Whether induction (the invariant with the structural lemmas) shows that n slots never violate it, at
    any depth: then no unrolling of n slots is needed. A failed or timed-out attempt proves nothing."""
    from checker.verify.induction import prove, supported

    if (not supported(inv, params) or policy.kv.prefix_caching.enabled or policy.connector.enabled
            or policy.scheduler is Scheduler.SGLANG):
        return False  # no induction over the pool, a KV connector's states or SGLang's rules (yet)
    seconds = min(INDUCTION_SHORTCUT_S, deadline.left_ms() / 1000)
    return seconds > 0 and prove(policy, inv, params, replace(env, requests=n), seconds).status == "proved"


def search(policy: Policy, inv: Invariant, params: dict[str, int], env: Environment, timeout_s: float,
           progress: Progress | None = None, check_trigger: bool = True) -> Search:
    """The shortest violation with the fewest requests, or how far the invariant holds.

    Fewer slots first (their encodings are far smaller): for n = 1, 2, ... N-1, either induction shows
    that n slots never violate the invariant, or the n-slot unrolling is searched up to the depth; the
    first violation found is minimal (fewest requests, then fewest iterations). The N-slot search then
    decides the rest and checks the trigger (vacuity; not with ``check_trigger`` False, when the caller
    knows the answer). The smaller searches get half the time at most; if
    they run out, the N-slot search goes on and a violation it finds is reported as not checked minimal."""
    deadline = Deadline(timeout_s)
    fewer = Deadline(timeout_s / 2)  # the smaller searches leave at least half the time to the N-slot one
    excluded = 0  # requests counts below this never violate up to the depth
    for n in range(1, env.requests):
        if _proved_for_any_depth(policy, inv, params, env, n, fewer):
            excluded = n
            continue
        status, _, found, _ = _shortest_violation(policy, inv, params, env, n, env.depth, fewer,
                                                  progress=progress)
        if status == "violated":
            return Search("violated", found.depth, found, minimal_checked=True)
        if status == "unknown":
            break
        excluded = n
    status, reached, found, reachable = _shortest_violation(policy, inv, params, env, env.requests, env.depth,
                                                             deadline, check_trigger, progress=progress)
    if status == "unknown":
        return Search("unknown", reached)
    if status == "holds":
        return Search("holds", reached, vacuous=reachable == "unreachable", vacuity_undecided=reachable == "unknown")
    if excluded >= env.requests - 1:
        return Search("violated", reached, found, minimal_checked=True)
    return Search("violated", reached, found, minimal_checked=False,
                  notes=[f"shortest with {found.requests} slots; fewer requests not excluded "
                         f"(timeout while checking {excluded + 1})"])
