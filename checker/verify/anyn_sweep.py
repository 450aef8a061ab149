"""Soundness sweep of the any-N proofs: no PROVED for a property that another method violates.

For each policy and state invariant, the any-N verdict (checker/verify/anyn.py) is compared with
- bounded model checking at a small N (z3 over the concrete N-slot encoding, checker/verify/bmc.py), and
- the engine on generated traces with many requests (tens to hundreds, on the policy's own pool, with
  cancellations), where every frame is checked.
A PROVED verdict together with a violation from either is a soundness bug (``Row.unsound``). Used by
tests/quality/test_anyn_sweep.py (a few policies) and bench/anyn_sweep.py (every shipped policy).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from checker.policy import Policy
from checker.requests import RequestSpec
from checker.smt.ops import IntOps
from checker.verify import anyn
from checker.verify.anyn_model import not_covered
from invariants.catalogue import CATALOGUE


@dataclass
class Row:
    policy: str
    invariant: str
    any_n: str  # "PROVED", "not proved", "not covered: ..."
    bmc: str  # "VIOLATED", "HOLDS_UP_TO", "VACUOUS", "UNKNOWN", "-"
    engine: str  # "violated at iteration T with R requests", "holds on T traces", "-"

    @property
    def unsound(self) -> bool:
        return self.any_n == "PROVED" and (self.bmc == "VIOLATED" or self.engine.startswith("violated"))


def engine_traces(policy: Policy, traces: int, requests: int, steps: int, seed: int = 0,
                  prompt_cap: int | None = None) -> list[list[RequestSpec]]:
    """Random request sets that load the policy's pool: long and short prompts (up to ``prompt_cap``), outputs
    long enough to grow, some cancellations, arrivals spread over the first steps."""
    rng = random.Random(seed)
    out = []
    longest = max(2, min(policy.max_model_len - 1, prompt_cap or policy.max_model_len))
    for _ in range(traces):
        specs = []
        for rid in range(requests):
            if prompt_cap:  # a heavy load: every prompt near the cap, long outputs (decode growth)
                prompt, output = rng.randint(max(1, longest // 2), longest), rng.randint(64, 256)
            else:
                prompt = rng.choice([rng.randint(1, 64), rng.randint(1, longest // 8), rng.randint(1, longest)])
                output = rng.randint(1, 64)
            arrival = rng.randint(0, max(0, steps // 2)) * 10_000
            cancel = arrival + rng.randint(1, steps) * 10_000 if rng.random() < 0.1 else None
            specs.append(RequestSpec(rid, arrival, prompt, output, output + rng.randint(0, 32),
                                     priority=rng.randint(0, 2), cancel_us=cancel))
        specs.sort(key=lambda s: s.arrival_us)
        out.append([RequestSpec(i, s.arrival_us, s.prompt_len, s.output_len, s.max_output, priority=s.priority,
                                cancel_us=s.cancel_us) for i, s in enumerate(specs)])
    return out


def engine_check(policy: Policy, inv_name: str, traces: int, requests: int, steps: int, seed: int = 0,
                 prompt_cap: int | None = None) -> str:
    from checker.verify.replay import replay_fixed_clock

    inv = CATALOGUE[inv_name]
    for specs in engine_traces(policy, traces, requests, steps, seed, prompt_cap):
        replay = replay_fixed_clock(policy, specs, steps, 10_000, 1)
        for t in range(len(replay.frames)):
            if not inv.holds(IntOps, replay.ctx, t):
                return f"violated at iteration {t} with {requests} requests"
    return f"holds on {traces} traces of {requests} requests x {steps} iterations"


def bmc_check(policy: Policy, inv_name: str, requests: int, depth: int, timeout_s: float) -> str:
    from checker.verify.run import run_verify

    _, results = run_verify(policy, [inv_name], requests, depth, timeout_s, out_dir=None, proof_dir=None)
    return results[0].verdict.value


def sweep_policy(name: str, policy: Policy, bmc: tuple[int, int] | None = (2, 3), engine: tuple[int, int, int] | None
                 = (3, 40, 30), timeout_s: float = 60.0, invariants: tuple[str, ...] = anyn.TARGETS) -> list[Row]:
    """One row per invariant; ``bmc``: (N, depth) or None; ``engine``: (traces, requests, steps) or None."""
    rules = not_covered(policy)
    proof = None if rules else anyn.prove(policy, timeout_s)
    rows = []
    for inv in invariants:
        if rules:
            verdict = f"not covered: {rules[0]}"
        else:
            verdict = "PROVED" if proof.proved(inv) else "not proved"
        b = bmc_check(policy, inv, bmc[0], bmc[1], timeout_s) if bmc and not rules else "-"
        e = engine_check(policy, inv, *engine) if engine else "-"
        rows.append(Row(name, inv, verdict, b, e))
    return rows
