"""Benchmark: fuzzing speed. Examples per second on 20-request traces (no violation, so no shrinking),
and time to the first (shrunk, replayed) counterexample for each planted weakness.

    python bench/fuzz_speed.py [--repeats N] [--examples N] [--skip-finds]

Examples per second are complete examples, single process: Hypothesis generates the trace, the engine
runs it, the property is checked. They are measured through ``checker.fuzz.run.run_property`` (what
``batchcheck fuzz`` runs once per property, with a fresh example database as the CLI keeps one), on
vllm_v1 and chat_mixed with all stresses, for kv_within_pool: the one SLO property shipped for chat_mixed
that holds on these traces (the others fail within a few hundred examples, and a failure stops the search
and shrinks). A second row checks all five chat_mixed.slo.yaml properties on each example through
``run.hunt`` (the search loop run_property uses; the judge evaluates five properties and fails none).
Best of ``--repeats`` runs (the machine is shared), with the median and the load average; beside the
wall-clock rate, the rate per CPU second of this process (what the rate would be with the cores to itself:
on a loaded 2-core machine the wall-clock rate falls with the load).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from checker.api import load_policy, run_fuzz  # noqa: E402
from checker.engine import simulate  # noqa: E402
from checker.fuzz.run import hunt, run_property  # noqa: E402
from checker.fuzz.slo import SLOFile, evaluate  # noqa: E402
from checker.fuzz.strategies import adversarial, request_maker  # noqa: E402
from checker.loading import load_model  # noqa: E402
from checker.metrics import lazy_summary  # noqa: E402
from checker.profile import load_profile  # noqa: E402
from checker.workload import Workload  # noqa: E402

W = ROOT / "spec" / "workloads"
SHAPES = {  # label: (min_requests, max_requests, max_segments)
    "20 requests (one segment, min = max = 20)": (20, 20, 1),
    "default shape (1-3 segments of 1-20)": (1, 20, 3),
}


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def _report(label: str, rates: list[tuple[float, float]], mean_requests: float, examples: int) -> None:
    wall, cpu = [w for w, _ in rates], [c for _, c in rates]
    print(f"  {label:<56} wall best {max(wall):4.0f}/s median {statistics.median(wall):4.0f}/s; per CPU second best "
          f"{max(cpu):4.0f}/s median {statistics.median(cpu):4.0f}/s (mean trace {mean_requests:.1f} requests, "
          f"{examples} examples per run, load {_load()})", flush=True)


class _Clock:
    def __enter__(self):
        self.wall, self.cpu = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc):
        self.wall, self.cpu = time.perf_counter() - self.wall, time.process_time() - self.cpu

    def rates(self, examples: int) -> tuple[float, float]:
        return examples / self.wall, examples / self.cpu


def examples_per_second(repeats: int, examples: int) -> None:
    policy = load_policy(ROOT / "spec" / "policies" / "vllm_v1.yaml")
    workload = load_model(Workload, W / "chat_mixed.yaml")
    chat = load_model(SLOFile, W / "chat_mixed.slo.yaml").properties
    kv = load_model(SLOFile, ROOT / "spec" / "slo" / "kv_safety.slo.yaml").properties
    holding = kv
    profile = load_profile(None)
    requests = request_maker(workload)
    print("examples/s (vllm_v1, chat_mixed, all stresses, generation + engine + property checks, one process):")
    for shape, (low, high, segments) in SHAPES.items():
        print(f" {shape}")
        for prop in holding:
            rates, sizes = [], []
            for i in range(repeats):
                with tempfile.TemporaryDirectory() as db, _Clock() as clock:
                    r = run_property(policy, workload, profile, prop, examples, 600, i + 1, Path(db), high,
                                     min_requests=low, max_segments=segments)
                if r.violated:
                    raise SystemExit(f"{prop.name} failed on a trace: the rate would include shrinking")
                rates.append(clock.rates(r.examples))
                sizes.append(r.requests_run / r.examples)
            _report(f"run_property ({prop.name})", rates, statistics.mean(sizes), examples)

        def judge(trace):
            summary = lazy_summary(simulate(policy, requests(trace), profile))
            for p in chat:
                evaluate(p, summary)
            return False, None, 0.0

        rates, sizes = [], []
        for i in range(repeats):
            with _Clock() as clock:
                h = hunt(adversarial(workload, policy, high, None, low, segments), judge, examples, 600, i + 1, None)
            rates.append(clock.rates(h.examples))
            sizes.append(h.requests_run / h.examples)
        _report("hunt, five chat_mixed properties per example", rates, statistics.mean(sizes), examples)


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
              f"({r.examples} runs incl. shrinking)", flush=True)
    print(f"time to counterexample: median {statistics.median(times):.1f} s, max {max(times):.1f} s (load {_load()})")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--examples", type=int, default=400)
    parser.add_argument("--skip-finds", action="store_true")
    args = parser.parse_args()
    examples_per_second(args.repeats, args.examples)
    if not args.skip_finds:
        time_to_counterexample()
