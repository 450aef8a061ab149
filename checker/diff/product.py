"""The product encoding: two policies unrolled on the same symbolic arrivals, and a z3 query for a
trace on which one of them keeps an invariant and the other breaks it.

``witness(keeps, breaks, ...)`` asks, depth by depth, for arrivals on which ``breaks`` violates the
invariant at iteration d-1 while ``keeps`` satisfies it at every iteration 0..d-1. The first
satisfiable depth is ``breaks``'s first violation (a shorter one would have been found at a smaller
depth); then fewer requests are tried at that depth bound, as in ``verify``. Both policies' runs are
replayed on the engine before the witness is returned: a disagreement is a bug in batchcheck.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from checker.errors import InternalError
from checker.policy import Policy
from checker.requests import RequestSpec
from checker.smt.ops import SmtSession, Z3Ops
from checker.verify.bmc import Deadline, Progress, Unrolling
from checker.verify.env import Environment, concrete_requests, symbolic_requests
from checker.verify.replay import first_violation, frame_differences, replay_fixed_clock
from invariants.catalogue import Invariant


@dataclass
class Witness:
    """A trace on which ``breaks`` violates the invariant at ``violation`` and ``keeps`` does not (up to
    and including that iteration)."""

    specs: list[RequestSpec]
    depth: int  # iterations: the violation is at depth - 1
    breaks_frames: list[dict]  # the breaking policy's solver frames (what the counterexample file stores)
    minimal: bool  # fewest requests checked, then fewest iterations
    notes: list[str] = field(default_factory=list)

    @property
    def violation(self) -> int:
        return self.depth - 1


@dataclass
class WitnessSearch:
    status: str  # "found", "none" (no such trace within the bounds), "unknown" (timeout)
    depth_reached: int
    witness: Witness | None = None


def _shortest(keeps: Policy, breaks: Policy, inv: Invariant, params: dict[str, int], env: Environment, n: int,
              deadline: Deadline, progress: Progress | None) -> tuple[str, int, Witness | None]:
    smt = SmtSession()
    caching = next((p for p in (keeps, breaks) if p.kv.prefix_caching.enabled), None)
    if caching is not None:  # the prompts' identities too, over finite domains that cover both pools
        from checker.verify.cache_bmc import cache_requests
        env = product_domains(keeps, breaks, env)
        requests = cache_requests(smt, Z3Ops, caching, env, n)
    else:
        requests = symbolic_requests(smt, Z3Ops, env, n)
    smt.add(*requests.constraints)
    good = Unrolling(smt, keeps, env, n, requests, tag="keeps.")
    bad = Unrolling(smt, breaks, env, n, requests, tag="breaks.")
    kept = Z3Ops.bool(True)
    for depth in range(1, env.depth + 1):
        if deadline.passed:
            return "unknown", depth - 1, None
        if progress is not None:
            progress(f"{inv.name}: {breaks.name} vs {keeps.name}, {n} requests, depth {depth}/{env.depth}")
        good.extend()
        bad.extend()
        t = depth - 1
        kept_here = smt.bool_var(f"kept@{t}")
        smt.add(kept_here == Z3Ops.and_(kept, inv.holds(Z3Ops, good.ctx, t, params)))
        kept = kept_here
        differs = smt.bool_var(f"differs@{t}")
        smt.add(smt.implies(differs, Z3Ops.and_(kept, Z3Ops.not_(inv.holds(Z3Ops, bad.ctx, t, params)))))
        smt.set_timeout(max(1, deadline.left_ms()))
        result = smt.check(differs)
        if result == "unknown":
            return "unknown", t, None
        if result == "sat":
            specs = concrete_requests(smt, requests, env, depth)
            if caching is not None:
                from checker.verify.cache_bmc import with_contents
                specs = with_contents(smt, requests, caching, specs)
            return "found", depth, Witness(specs, depth, bad.frame_values(depth), minimal=False)
    return "none", env.depth, None


def product_domains(a: Policy, b: Policy, env: Environment) -> Environment:
    """With prefix caching: the finite domains of both policies' explicit searches together (prompt lengths at
    either pool's boundaries), as z3 BMC over the pool encoding takes them (checker/verify/cache_bmc.py)."""
    from checker.verify.cache_bmc import PoolEnvironment, domain_environment

    if isinstance(env, PoolEnvironment):
        return env
    x, y = (domain_environment(p, env, []) for p in (a, b))
    why = dict(zip(y.prompts, y.prompt_why))
    why.update(zip(x.prompts, x.prompt_why))
    prompts = tuple(sorted(why))
    return replace(x, prompts=prompts, prompt_why=tuple(why[p] for p in prompts),
                   outputs=tuple(sorted(set(x.outputs) | set(y.outputs))),
                   max_outputs=tuple(dict.fromkeys(x.max_outputs + y.max_outputs)),
                   search_priorities=tuple(sorted(set(x.search_priorities) | set(y.search_priorities))),
                   search_tenants=max(x.search_tenants, y.search_tenants))


def witness(keeps: Policy, breaks: Policy, inv: Invariant, params: dict[str, int], env: Environment,
            timeout_s: float, progress: Progress | None = None) -> WitnessSearch:
    """The smallest trace (fewest requests, then fewest iterations) on which ``breaks`` violates the
    invariant and ``keeps`` does not, within the environment's bounds; replayed on the engine."""
    deadline = Deadline(timeout_s)
    status, reached, found = _shortest(keeps, breaks, inv, params, env, env.requests, deadline, progress)
    if status != "found":
        return WitnessSearch(status, reached)
    assert found is not None
    best, minimal = found, True
    for n in range(1, env.requests):
        status, _, smaller = _shortest(keeps, breaks, inv, params, env, n, deadline, progress)
        if status == "found":
            best = smaller
            break
        if status == "unknown":
            minimal = False
            best.notes.append(f"fewer than {env.requests} requests not excluded (timeout while checking {n})")
            break
    assert best is not None
    best.minimal = minimal
    confirm(keeps, breaks, inv, params, env, best)
    return WitnessSearch("found", reached, best)


def confirm(keeps: Policy, breaks: Policy, inv: Invariant, params: dict[str, int], env: Environment,
            w: Witness) -> None:
    """Replay the witness under both policies on the engine; any disagreement with the solver is a bug."""
    bad = replay_fixed_clock(breaks, w.specs, w.depth, env.step_us, env.tenants)
    good = replay_fixed_clock(keeps, w.specs, w.depth, env.step_us, env.tenants)
    diffs = frame_differences(bad, w.breaks_frames)
    bad_step, good_step = first_violation(inv, params, bad), first_violation(inv, params, good)
    if diffs or bad_step != w.violation or good_step is not None:
        raise InternalError(
            f"engine and solver disagree on a regression witness for {inv.name}: the solver says {breaks.name} "
            f"fails at iteration {w.violation} and {keeps.name} holds; the engine's replay says {breaks.name} "
            f"{'holds' if bad_step is None else f'fails at iteration {bad_step}'} and {keeps.name} "
            f"{'holds' if good_step is None else f'fails at iteration {good_step}'}; first differences: {diffs[:5]}")
