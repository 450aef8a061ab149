"""Benchmark: fuzzing speed. Examples per second on 20-request traces (no violation, so no shrinking),
and time to the first (shrunk, replayed) counterexample for each planted weakness.

    python bench/fuzz_speed.py
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hypothesis import HealthCheck, given, settings  # noqa: E402

from checker.api import load_policy, run_fuzz  # noqa: E402
from checker.engine import simulate  # noqa: E402
from checker.fuzz.slo import SLOFile, evaluate  # noqa: E402
from checker.fuzz.strategies import adversarial, to_requests  # noqa: E402
from checker.loading import load_model  # noqa: E402
from checker.profile import load_profile  # noqa: E402
from checker.workload import Workload  # noqa: E402

W = ROOT / "spec" / "workloads"


def examples_per_second() -> None:
    policy = load_policy(ROOT / "spec" / "policies" / "vllm_v1.yaml")
    workload = load_model(Workload, W / "chat_mixed.yaml")
    props = load_model(SLOFile, W / "chat_mixed.slo.yaml").properties
    profile = load_profile(None)
    sizes = []

    @settings(max_examples=400, deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(adversarial(workload, policy, max_requests=20))
    def body(trace):
        sizes.append(len(trace))
        summary = simulate(policy, to_requests(trace, workload), profile).summary()
        for prop in props:
            evaluate(prop, summary)

    t0 = time.perf_counter()
    body()
    seconds = time.perf_counter() - t0
    print(f"examples/s (vllm_v1, chat_mixed, all stresses, 5 properties, generation included): "
          f"{len(sizes) / seconds:.0f} ({len(sizes)} examples in {seconds:.2f} s; mean trace "
          f"{statistics.mean(sizes):.1f} requests, max {max(sizes)})")


def time_to_counterexample() -> None:
    cases = [("vllm_v0_no_chunking", W / "chat_mixed.slo.yaml", "interactive_max_tbt"),
             ("vllm_v0_no_chunking", W / "chat_mixed.slo.yaml", "interactive_tpot_p99"),
             ("strict_priority", ROOT / "spec" / "slo" / "starvation.slo.yaml", "background_queue_max"),
             ("broken/unchecked_growth", ROOT / "spec" / "slo" / "kv_safety.slo.yaml", "kv_within_pool"),
             ("vllm_v0_no_chunking", W / "chat_mixed.slo.yaml", "background_degrades_first")]
    times = []
    for policy, slo, prop in cases:
        t0 = time.perf_counter()
        (r,) = run_fuzz(ROOT / "spec" / "policies" / f"{policy}.yaml", W / "chat_mixed.yaml", slo, [prop], 200, 120,
                        seed=1, out_dir=None, database_dir=None)
        dt = time.perf_counter() - t0
        times.append(dt)
        print(f"{policy:<24} {prop:<28} found={r.violated} shrunk to {len(r.trace)} requests in {dt:.1f} s "
              f"({r.examples} runs incl. shrinking)")
    print(f"time to counterexample: median {statistics.median(times):.1f} s, max {max(times):.1f} s")


if __name__ == "__main__":
    examples_per_second()
    time_to_counterexample()
