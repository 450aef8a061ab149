"""Liveness explorer speed: canonical states explored per second, and the largest instance explored within
a time budget, with symmetry reduction on (docs/benchmarks.md, "Liveness state graphs").

    python bench/liveness_states.py [--budget 60] [--policy spec/policies/vllm_v1.yaml]

For each instance (requests in flight N = 1, 2, ...) it explores the complete graph of vLLM v1 on a 16-block
pool with prompts {16, 48, 96} and outputs {1, 2, 4} until one exploration hits the budget. "Unreduced" is the
number of slot-indexed states the canonical states stand for: a canonical state with m requests holding
places out of N stands for N!/(N-m)! slot assignments, divided by the orderings of identical requests.
"""

from __future__ import annotations

import argparse
import math
import time
from collections import Counter
from pathlib import Path

from checker.api import apply_overrides, load_policy
from checker.liveness.canon import FIELDS_PER_HOLDING, FIELDS_PER_REQUEST
from checker.liveness.explore import LivenessEnv, explore

ROOT = Path(__file__).resolve().parent.parent


def unreduced(key: tuple, slots: int, timed: bool) -> int:
    m = key[0]
    requests = [key[1 + i * FIELDS_PER_REQUEST: 1 + (i + 1) * FIELDS_PER_REQUEST] for i in range(m)]
    pos = 1 + m * FIELDS_PER_REQUEST + (m if timed and m else 0)
    h = key[pos]
    holding = [key[pos + 1 + FIELDS_PER_HOLDING * j: pos + 1 + FIELDS_PER_HOLDING * (j + 1)] for j in range(h)]
    placed = m + h
    count = math.perm(slots, placed)
    for same in list(Counter(requests).values()) + list(Counter(holding).values()):
        count //= math.factorial(same)
    return count


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--budget", type=float, default=60.0, help="seconds per exploration")
    ap.add_argument("--policy", default=str(ROOT / "spec" / "policies" / "vllm_v1.yaml"))
    ap.add_argument("--max-requests", type=int, default=6)
    args = ap.parse_args()
    policy = apply_overrides(load_policy(args.policy), ["kv.num_blocks=16"])
    print("| requests in flight | canonical states | edges | complete | seconds | states/s | states/min "
          "| choices | schedules run | us per choice | unreduced states |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for n in range(1, args.max_requests + 1):
        env = LivenessEnv(n, (16, 48, 96), (1, 2, 4))
        started = time.perf_counter()
        sg = explore(policy, env, max_states=10 ** 8, timeout_s=args.budget)
        seconds = time.perf_counter() - started
        rate = sg.states / seconds
        total = sum(unreduced(k, n, sg.canon.timed) for k in sg.keys)
        print(f"| {n} | {sg.states:,} | {sg.edges:,} | {'yes' if sg.complete else 'no (budget)'} | {seconds:.1f} "
              f"| {rate:,.0f} | {60 * rate:,.0f} | {sg.choices_run:,} | {sg.steps_run:,} "
              f"| {1e6 * seconds / sg.choices_run:.0f} | {total:,} |", flush=True)
        if not sg.complete:
            break


if __name__ == "__main__":
    main()
