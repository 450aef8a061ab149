"""Benchmark: replay the whole Azure conversation trace (19,366 real requests) through the engine.

    python bench/replay_azure.py [--policy spec/policies/vllm_v1.yaml] [--repeat 3] [--plain]

Prints wall time, requests/s and request-steps/s (a request-step is one request scheduled in one
step), best of --repeat runs. --plain also times the engine without fast-forward. Needs
../shared/data/traces/azure_conv_2023.csv. Results go to docs/benchmarks.md by hand.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from checker.api import load_policy  # noqa: E402
from checker.engine import simulate  # noqa: E402
from checker.profile import load_profile  # noqa: E402
from checker.traces import load_azure_csv  # noqa: E402

TRACE = ROOT.parent / "shared" / "data" / "traces" / "azure_conv_2023.csv"


def run(policy_path: Path, fast_forward: bool, repeat: int, limit: int | None) -> None:
    policy = load_policy(policy_path)
    t0 = time.perf_counter()
    requests = load_azure_csv(TRACE, limit=limit)
    load_s = time.perf_counter() - t0
    profile = load_profile(None)
    best = None
    for _ in range(repeat):
        result = simulate(policy, requests, profile, fast_forward=fast_forward)
        if best is None or result.wall_s < best.wall_s:
            best = result
    s = best.summary()
    n = len(requests.specs)
    print(f"policy={policy.name} fast_forward={fast_forward} requests={n} trace_load_s={load_s:.2f}")
    print(f"  engine wall {best.wall_s:.2f} s (best of {repeat}), steps {best.steps}, request-steps {best.request_steps}")
    print(f"  {n / best.wall_s:,.0f} requests/s, {best.request_steps / best.wall_s:,.0f} request-steps/s, "
          f"{1e6 * best.wall_s / best.request_steps:.2f} us per request-step")
    o = s["overall"]
    print(f"  simulated {s['engine']['simulated_s']} s, preemptions {o['preemptions']}, "
          f"recomputed tokens {o['recomputed_tokens']}, KV peak {s['engine']['kv_peak_pct']}%, "
          f"TTFT p50/p99 {o['ttft_ms']['p50']}/{o['ttft_ms']['p99']} ms, TPOT p50 {o['tpot_ms']['p50']} ms")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--policy", default=str(ROOT / "spec" / "policies" / "vllm_v1.yaml"))
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--plain", action="store_true", help="also time plain stepping (no fast-forward)")
    args = parser.parse_args()
    if not TRACE.exists():
        sys.exit(f"needs {TRACE} (the shared data folder)")
    print(f"machine: {platform.processor() or platform.machine()}, python {platform.python_version()}")
    run(Path(args.policy), True, args.repeat, args.limit)
    if args.plain:
        run(Path(args.policy), False, 1, args.limit)


if __name__ == "__main__":
    main()
