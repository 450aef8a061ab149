"""Bounded model checking: unroll the symbolic step over K iterations and ask z3 for a violation.

Each iteration's state gets fresh variables (the step's terms stay small and the model is easy to
read back). Depth d is checked under an assumption literal that turns on "the invariant fails at
iteration d", so one incremental solver serves all depths (the issue's experiment found this far faster
than push/pop or a fresh solver per depth). The first satisfiable depth is the shortest violation.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from checker.frames import Frame, TraceContext
from checker.policy import Policy
from checker.semantics.state import FIELDS, RequestSpec, Status
from checker.smt.encode import SlotState, symbolic_step
from checker.smt.ops import SmtSession, Z3Ops
from checker.verify.env import Environment, SymbolicRequests, concrete_requests, symbolic_requests
from invariants.catalogue import Invariant


def initial_state(n: int, tenants: int) -> SlotState:
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
        if requests is None:
            requests = symbolic_requests(smt, Z3Ops, env, n)
            smt.add(*requests.constraints)
        self.requests: SymbolicRequests = requests
        self.state = initial_state(n, env.tenants)
        self.frames: list[Frame] = []
        self.ctx = TraceContext(policy, tuple(self.requests.params), self.frames)

    def extend(self) -> None:
        smt, k = self.smt, len(self.frames)
        now = k * self.env.step_us
        result = symbolic_step(Z3Ops, self.policy, self.requests.params, self.state, now,
                               self.requests.cancels_at(Z3Ops, k))

        def fresh(name: str, term, boolean: bool = False):
            name = self.tag + name
            var = smt.bool_var(name) if boolean else smt.int_var(name)
            smt.add(var == term)
            return var

        slots = [{f: fresh(f"{f}_{i}@{k}", slot[f]) for f in FIELDS} for i, slot in enumerate(result.state.slots)]
        st = result.state
        self.state = SlotState(slots=slots, next_seq=fresh(f"next_seq@{k}", st.next_seq),
                               step=fresh(f"step@{k}", st.step),
                               counters=[fresh(f"counter_{t}@{k}", c) for t, c in enumerate(st.counters)])
        self.frames.append(Frame(
            slots=tuple(slots),
            scheduled=tuple(fresh(f"scheduled_{i}@{k}", x) for i, x in enumerate(result.scheduled)),
            produced=tuple(fresh(f"produced_{i}@{k}", x, True) for i, x in enumerate(result.produced)),
            preempted=tuple(fresh(f"preempted_{i}@{k}", x, True) for i, x in enumerate(result.preempted)),
            kv_used=self.state.kv_used, now_us=now, counters=tuple(self.state.counters)))

    def frame_values(self, upto: int) -> list[dict]:
        """The model's frames 0..upto-1 as plain values (what the counterexample file stores)."""
        v = self.smt.value
        out = []
        for f in self.frames[:upto]:
            out.append({
                "now_us": f.now_us, "kv_used": v(f.kv_used),
                "requests": [{**{name: v(slot[name]) for name in FIELDS}, "scheduled": v(f.scheduled[i]),
                              "produced": bool(v(f.produced[i])), "preempted": bool(v(f.preempted[i]))}
                             for i, slot in enumerate(f.slots)]})
        return out


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
                        progress: Progress | None = None) -> tuple[str, int, Found | None, bool]:
    """Check depths 1..max_depth with n slots. Returns (status, depth reached, found, trigger reachable)."""
    smt = SmtSession()
    u = Unrolling(smt, policy, env, n)
    trigger_seen = []
    for depth in range(1, max_depth + 1):
        if deadline.passed:
            return "unknown", depth - 1, None, True
        if progress is not None:
            progress(f"{inv.name}: {n} requests, depth {depth}/{max_depth}")
        u.extend()
        t = depth - 1
        fails = smt.bool_var(f"fails@{t}")
        smt.add(smt.implies(fails, Z3Ops.not_(inv.holds(Z3Ops, u.ctx, t, params))))
        if check_trigger:
            trigger_seen.append(inv.triggered(Z3Ops, u.ctx, t, params))
        smt.set_timeout(deadline.left_ms())
        result = smt.check(fails)
        if result == "unknown":
            return "unknown", depth - 1, None, True
        if result == "sat":
            found = Found(n, depth, concrete_requests(smt, u.requests, env, depth), u.frame_values(depth))
            return "violated", depth, found, True
    reachable = True
    if check_trigger:
        seen = smt.bool_var("trigger_seen")
        smt.add(smt.implies(seen, Z3Ops.or_(*trigger_seen)))
        smt.set_timeout(max(1, deadline.left_ms()))
        reachable = smt.check(seen) != "unsat"
    return "holds", max_depth, None, reachable


def search(policy: Policy, inv: Invariant, params: dict[str, int], env: Environment, timeout_s: float,
           progress: Progress | None = None) -> Search:
    """The shortest violation with the fewest requests, or how far the invariant holds."""
    deadline = Deadline(timeout_s)
    status, reached, found, reachable = _shortest_violation(policy, inv, params, env, env.requests, env.depth,
                                                             deadline, check_trigger=True, progress=progress)
    if status == "unknown":
        return Search("unknown", reached)
    if status == "holds":
        return Search("holds", reached, vacuous=not reachable)
    best = found
    for n in range(1, env.requests):  # fewest requests first, then fewest iterations
        status, _, smaller, _ = _shortest_violation(policy, inv, params, env, n, env.depth, deadline,
                                                    progress=progress)
        if status == "violated":
            best = smaller
            break
        if status == "unknown":
            return Search("violated", reached, best, minimal_checked=False,
                          notes=[f"shortest with {best.requests} slots; fewer requests not excluded "
                                 f"(timeout while checking {n})"])
    return Search("violated", reached, best, minimal_checked=True)
