"""Benchmark: `batchcheck sweep` serially against `--jobs N` (issue 21: the sweep of 64 configurations on a local
2-worker cluster in about half the serial time).

    python bench/sweep_speed.py [--pairs 5] [--jobs 2] [--dask] [--root DIR] [--limit N]

Runs `python -m checker.cli sweep prefix_capped --knob replicas=1,2,3,4 --knob batch.max_num_seqs=4,8,16,32
--knob batch.max_num_batched_tokens=1024,2048,4096,8192 --json` (64 configurations, 240 requests each) as a
whole process, alternating serial (A) and --jobs N (B) pair by pair (and, with --dask, --scheduler on a Dask
LocalCluster of N workers started once, outside the timings), with the 1-minute load average read beside each run.
Reports per way the process's wall time and the sweep's own `seconds` (the configurations' runs, without start-up
and loading), min and median, and the B/A ratios pair by pair; checks that every run gives the same results (every
row but its wall_s, the best configuration). `--root DIR`: time the batchcheck tree in DIR (an older revision
exported there) instead of this one. Figures go to docs/benchmarks.md by hand.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
KNOBS = ["replicas=1,2,3,4", "batch.max_num_seqs=4,8,16,32", "batch.max_num_batched_tokens=1024,2048,4096,8192"]


def run_once(root: Path, how: list[str], limit: int | None) -> dict:
    """One whole `sweep` process: its wall time, the sweep's own seconds, the load before it, its results."""
    argv = [sys.executable, "-m", "checker.cli", "sweep", str(ROOT / "spec" / "fleets" / "prefix_capped.yaml"),
            *(a for k in KNOBS for a in ("--knob", k)), "--json", *how]
    if limit is not None:
        argv += ["--limit", str(limit)]
    env = {**os.environ, "BATCHCHECK_PROGRESS": "off"}
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    done = subprocess.run(argv, cwd=root, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if done.returncode not in (0, 1):
        raise SystemExit(f"sweep {' '.join(how)} exited {done.returncode}: {done.stderr[-2000:]}")
    doc = json.loads(done.stdout)
    figures = ([{k: v for k, v in r.items() if k != "wall_s"} for r in doc["results"]], doc["best"])
    return {"wall": wall, "seconds": doc["seconds"], "load": load, "figures": figures, "where": doc["where"]}


def summary(label: str, runs: list[dict]) -> str:
    walls, secs = [r["wall"] for r in runs], [r["seconds"] for r in runs]
    loads = [r["load"] for r in runs]
    return (f"{label:<28} process wall min {min(walls):6.2f} s median {statistics.median(walls):6.2f} s | sweep's own "
            f"min {min(secs):6.2f} s median {statistics.median(secs):6.2f} s | load {min(loads):.2f}-{max(loads):.2f}")


def ratios(label: str, a: list[dict], b: list[dict], key: str) -> str:
    r = sorted(y[key] / x[key] for x, y in zip(a, b))
    return f"{label}, pair by pair: min {r[0]:.3f} median {statistics.median(r):.3f} max {r[-1]:.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--dask", action="store_true", help="also on a Dask LocalCluster of --jobs workers")
    parser.add_argument("--root", type=Path, default=ROOT, help="the batchcheck tree to time (default: this one)")
    parser.add_argument("--limit", type=int, help="only the first N requests")
    args = parser.parse_args()
    os.environ["PYTHONPATH"] = str(args.root)  # the sweeps' batchcheck
    sys.path.insert(0, str(args.root))  # and the Dask workers' (spawned with this process's path)
    print(f"{platform.machine()} {os.cpu_count()} CPUs, Python {platform.python_version()}, tree {args.root}, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    ways = {"A serial": [], f"B --jobs {args.jobs}": []}
    cluster = None
    if args.dask:
        from distributed import LocalCluster

        cluster = LocalCluster(n_workers=args.jobs, threads_per_worker=1, processes=True, dashboard_address=None)
        ways[f"C Dask, {args.jobs} workers"] = []
    hows = [[], ["--jobs", str(args.jobs)]] + ([["--scheduler", cluster.scheduler_address]] if cluster else [])
    figures = None
    try:
        for pair in range(args.pairs):
            order = list(zip(ways, hows))
            if pair % 2:  # alternate which way runs first
                order.reverse()
            for label, how in order:
                run = run_once(args.root, how, args.limit)
                figures = figures or run["figures"]
                if run["figures"] != figures:
                    raise SystemExit(f"{label}: results differ from the first run's")
                ways[label].append(run)
                print(f"  pair {pair + 1} {label:<22} wall {run['wall']:6.2f} s, sweep's own {run['seconds']:6.2f} s, "
                      f"load {run['load']:.2f} ({run['where']})", flush=True)
    finally:
        if cluster is not None:
            cluster.close()
    print(f"{len(figures[0])} configurations; best: row {figures[1]}; every run gave the same results")
    for label, runs in ways.items():
        print(summary(label, runs))
    a, *others = list(ways.values())
    for label, b in zip(list(ways)[1:], others):
        print(ratios(f"{label} / A process wall", a, b, "wall"))
        print(ratios(f"{label} / A sweep's own", a, b, "seconds"))


if __name__ == "__main__":
    main()
