"""Benchmark: k-induction for the windowed temporal invariants (verify --temporal-induction;
checker/verify/temporal_induction.py) on a policy's own pool: for each invariant and window, N = 2, 3, ... until
the proof is not found within the time limit (or a counterexample to induction stops it, or a proof took more
than --cpu-limit CPU seconds: on a loaded machine the wall clock overstates the cost, the CPU seconds do not). One row per run:
the status (proved / cti / base / unknown), the k that decided it, wall and CPU seconds of the proof (the lemma
query, the step queries for k = window .. window+1 and the base case, its bounded search included: verify skips
that search where its own bounded search already reached depth k).

    python bench/temporal_induction.py                          # vllm_v1, the default ladder, 60 s each
    python bench/temporal_induction.py --policy spec/policies/orca.yaml --timeout 120
    python bench/temporal_induction.py --case bounded_starvation:3 --n 2 3 4
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from checker.api import load_policy  # noqa: E402
from checker.verify import temporal_induction  # noqa: E402
from checker.verify.env import default_environment  # noqa: E402
from checker.verify.run import parse_invariant  # noqa: E402

CASES = ("cancellation_releases:1", "cancellation_releases:2", "cancellation_releases:8", "decode_progress:1",
         "decode_progress:2", "decode_progress:8", "bounded_starvation:2", "bounded_starvation:3",
         "bounded_starvation:8")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--policy", default=str(ROOT / "spec/policies/vllm_v1.yaml"))
    ap.add_argument("--case", nargs="*", default=list(CASES))
    ap.add_argument("--n", nargs="*", type=int, default=[2, 3, 4, 6, 8])
    ap.add_argument("--depth", type=int, default=5, help="the environment's depth (sets the output range 1..2K)")
    ap.add_argument("--timeout", type=float, default=60.0, help="wall seconds per proof (z3's clock)")
    ap.add_argument("--cpu-limit", type=float, default=60.0, help="stop a ladder after a proof that took more CPU")
    args = ap.parse_args()
    pol = load_policy(args.policy)
    print("| invariant | N | status | k | wall s | CPU s |\n|---|---|---|---|---|---|", flush=True)
    for case in args.case:
        inv, params = parse_invariant(case)
        for n in args.n:
            env = default_environment(pol, n, args.depth)
            temporal_induction._LEMMAS.clear()  # each row pays for its lemma query (verify shares it between rows)
            wall, cpu = time.monotonic(), time.process_time()
            r = temporal_induction.prove(pol, inv, params, env, args.timeout)
            print(f"| {case} | {n} | {r.status} | {r.k} | {time.monotonic() - wall:.1f} | "
                  f"{time.process_time() - cpu:.1f} |", flush=True)
            if r.status != "proved" or time.process_time() - cpu > args.cpu_limit:
                break


if __name__ == "__main__":
    main()
