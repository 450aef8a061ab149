"""Is an invariant's situation reachable at all? (A proof of a property whose trigger never happens says
nothing: VACUOUS, not PROVED.)

First a few concrete runs of the engine inside the environment's assumptions (every slot arriving at
once, the longest and the shortest prompts, the longest outputs): a run that reaches the trigger shows it
is reachable, at any depth (in an environment derived to fill the KV pool, also probes that fill it:
``_fill_probes``). Only when none does, z3 searches the unrolling up to the bounded depth (after
action-wise induction has tried to prove that it never occurs: checker/verify/run.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from checker.policy import Allocation, Policy
from checker.requests import RequestSpec
from checker.smt.ops import IntOps, SmtSession, Z3Ops
from checker.verify.env import Environment
from checker.verify.replay import replay_fixed_clock
from invariants.catalogue import Invariant

# Iterations an engine probe runs.
PROBE_STEPS = 256
_REPLAYS: dict[tuple, list] = {}  # (policy, environment) -> the probes' replays, within one process


@dataclass(frozen=True)
class Reach:
    status: str  # "reachable", "unreachable" (within the bounded depth) or "unknown"
    how: str  # what showed it


def _probes(policy: Policy, env: Environment) -> list[list[RequestSpec]]:
    n, (lo_p, hi_p), (_, hi_o) = env.requests, env.prompt, env.output
    cap, prio = max(env.max_output_cap, hi_o), min(env.priorities)
    hi_p = max(lo_p, min(hi_p, policy.max_model_len - 1 - hi_o))  # the longest prompt admission accepts

    def spec(i: int, prompt: int) -> RequestSpec:
        return RequestSpec(i, 0, prompt, hi_o, cap, prio, i % env.tenants)

    probes = [[spec(i, hi_p) for i in range(n)], [spec(i, lo_p) for i in range(n)],
              [spec(i, hi_p if i % 2 == 0 else lo_p) for i in range(n)]]
    # prompts that fill the pool exactly once all are admitted and prefilled (a KV-full situation needs an
    # exact fit): under full reservation a request holds the blocks of prompt + declared max output - 1
    bs, blocks = policy.kv.block_size, policy.kv.num_blocks
    reserved = cap - 1 if policy.kv.allocation is Allocation.FULL_RESERVATION else 0
    shares = [blocks // n] * (n - 1) + [blocks - blocks // n * (n - 1)]
    exact = [b * bs - reserved for b in shares]
    if all(lo_p <= p <= hi_p for p in exact):
        probes.append([spec(i, p) for i, p in enumerate(exact)])
    return probes + _fill_probes(policy, env)


def _fill_probes(policy: Policy, env: Environment) -> list[list[RequestSpec]]:
    """In an environment derived to fill the KV pool (env.fill_blocks): every slot at once with the longest
    outputs, prompts that hold the pool less a slack of g blocks once prefilled (g = 0, N, 2N, 4N, 8N, and the
    admission watermark beyond each), so that decode growth, one block at a time, takes the slack; prompts end
    1, 2, ... tokens short of a block (so requests cross a block boundary in different steps) or on one. Under
    full reservation a request holds prompt + max output - 1 tokens from admission on, so the slack is 0."""
    target = env.fill_blocks
    if not target:
        return []
    n, bs, hi_o = env.requests, policy.kv.block_size, env.output[1]
    lo_p, hi_p = env.prompt[0], min(env.prompt[1], policy.max_model_len - 1)  # (arrival's bound)
    full = policy.kv.allocation is Allocation.FULL_RESERVATION
    wm = policy.kv.watermark_blocks
    probes, balanced = [], []
    for g in (0,) if full else sorted({0, n, 2 * n, 4 * n, 8 * n} | {wm + g for g in (0, n, 2 * n, 4 * n, 8 * n)}):
        q, r = divmod(target - g, n)
        # the remainder on the last request, then (tried after every one of those) spread one block each over the
        # first ones: where the last request's share would need a prompt beyond the longest one admission takes
        # (many requests of nearly max_model_len tokens each fill a production pool), only the spread one fits
        for shares, into in (([q] * (n - 1) + [q + r], probes), ([q + 1] * r + [q] * (n - r), balanced)):
            if into is balanced and (r <= 1 or n == 1):
                continue  # the same shares as above
            for stagger in (True, False):
                prompts = [b * bs - (i % bs if stagger else 0) - (hi_o - 1 if full else 0)
                           for i, b in enumerate(shares)]
                if all(lo_p <= p <= hi_p for p in prompts):
                    into.append([RequestSpec(i, 0, p, hi_o, max(env.max_output_cap, hi_o), min(env.priorities),
                                             i % env.tenants) for i, p in enumerate(prompts)])
    return probes + balanced


def engine_witness(policy: Policy, inv: Invariant, params: dict[str, int], env: Environment) -> str | None:
    """A description of an engine run that reaches the trigger, or None."""
    return engine_witnesses(policy, [(inv, params)], env)[0]


def engine_witness_within_depth(policy: Policy, inv: Invariant, params: dict[str, int], env: Environment) -> str | None:
    """An engine probe that reaches the trigger within the environment's depth (iterations 0..K-1), or None: each
    probe is a trace of the environment (N requests arriving at once, lengths in its ranges), so the trigger is
    reachable in the bounded unrolling (the z3 step agrees with the engine: tests/conformance). Not for prefix
    caching or a KV connector (their probes would need prompt identities and external tiers)."""
    if policy.kv.prefix_caching.enabled or policy.connector.enabled:
        return None
    return engine_witnesses(policy, [(inv, params)], env, env.depth)[0]


def engine_witnesses(policy: Policy, targets: list[tuple[Invariant, dict[str, int]]],
                     env: Environment, within: int = PROBE_STEPS) -> list[str | None]:
    """For each (invariant, parameters): a description of an engine probe that reaches its trigger at an
    iteration below ``within``, or None (each probe is replayed once for all of them)."""
    found: list[str | None] = [None] * len(targets)
    key = (policy.model_dump_json(), env)
    if key not in _REPLAYS:  # the four state invariants, and the Houdini run before them, share the probes
        _REPLAYS[key] = [(specs, replay_fixed_clock(policy, specs, PROBE_STEPS, env.step_us, env.tenants))
                         for specs in _probes(policy, env)]
    for specs, replay in _REPLAYS[key]:
        for t in range(min(within, len(replay.frames))):
            for k, (inv, params) in enumerate(targets):
                if found[k] is None and inv.triggered(IntOps, replay.ctx, t, params):
                    found[k] = (f"its situation occurs at iteration {t} of an engine run ({len(specs)} requests "
                                f"arriving at once, prompts of {min(s.prompt_len for s in specs)}-"
                                f"{max(s.prompt_len for s in specs)} tokens)")
            if all(found):
                return found
    return found


# z3's resource count (rlimit) each side check of vacuity may spend on one query: a count of solver steps, the same on
# every run of the same query whatever the machine's load, so that the check concludes the same on every run
# (a clock limit would make VACUOUS on an idle machine PROVED or HOLDS_UP_TO on a busy one). 10 M: 8.6 s of solving
# at load 6 on the project's 2-core machine (docs/benchmarks.md, "verify's defaults").
VACUITY_RLIMIT = 10_000_000


def search_within_depth(policy: Policy, inv: Invariant, params: dict[str, int], env: Environment,
                        rlimit: int = VACUITY_RLIMIT) -> Reach:
    """z3's search for the trigger in the unrolling up to the environment's depth, bounded by ``rlimit``
    (not by the clock)."""
    from checker.verify.bmc import Unrolling

    smt = SmtSession()
    smt.set_rlimit(rlimit)
    u = Unrolling(smt, policy, env, env.requests)
    seen = []
    for t in range(env.depth):
        u.extend()
        seen.append(inv.triggered(Z3Ops, u.ctx, t, params))
    return reach_answer(smt.check(Z3Ops.or_(*seen)), env)


def reach_answer(result: str, env: Environment) -> Reach:
    """The vacuity side check's answer from z3's ("sat", "unsat" or "unknown" within the resource count)."""
    if result == "sat":
        return Reach("reachable", f"z3 reaches its situation within {env.depth} iterations")
    if result == "unsat":
        return Reach("unreachable", f"its situation never occurs within {env.requests} requests, {env.depth} iterations")
    return Reach("unknown", "vacuity not decided: no engine probe reached its situation and z3 did not decide "
                            "within its fixed budget whether it can occur within the bounds")
