"""Benchmark: bug reports and run timelines. Seconds to write a report per shipped counterexample, and for
`simulate --plot`: simulating with every step recorded, building the timeline, drawing the PNG, and the
peak memory, on chat_mixed and (when ../shared/data is there) the one-hour Azure conversation trace.

    python bench/plot_speed.py
"""

from __future__ import annotations

import resource
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from checker.api import run_report, run_simulation  # noqa: E402
from checker.bugreport.build import run_timeline  # noqa: E402
from checker.bugreport.plot import render_png  # noqa: E402
from checker.errors import InputError  # noqa: E402

AZURE = ROOT.parent / "shared" / "data" / "traces" / "azure_conv_2023.csv"


def reports() -> None:
    with tempfile.TemporaryDirectory() as out:
        for path in sorted((ROOT / "counterexamples").glob("*.json")):
            started = time.perf_counter()
            try:
                run_report(path, out)
            except InputError as exc:  # a kind the report does not render yet (e.g. liveness lassos)
                print(f"report {path.name}: not rendered: {exc}")
                continue
            print(f"report {path.name}: {time.perf_counter() - started:.2f} s")


def plot(label: str, **source) -> None:
    started = time.perf_counter()
    result = run_simulation(ROOT / "spec" / "policies" / "vllm_v1.yaml", record=True, **source)
    simulated = time.perf_counter()
    timeline = run_timeline(result)
    built = time.perf_counter()
    png = render_png(timeline)
    drawn = time.perf_counter()
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"plot {label}: {len(result.decisions):,} iterations; simulate+record {simulated - started:.1f} s, "
          f"timeline {built - simulated:.1f} s, draw {drawn - built:.1f} s, PNG {len(png) / 1024:.0f} KiB, "
          f"peak RSS {peak_mb:.0f} MiB")


if __name__ == "__main__":
    reports()
    plot("chat_mixed", workload=ROOT / "spec" / "workloads" / "chat_mixed.yaml")
    if AZURE.exists():
        plot("azure_conv_2023 (1 h)", trace=AZURE)
    else:
        print(f"skipped the Azure trace: {AZURE} not found")
