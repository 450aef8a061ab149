"""Benchmark: `batchcheck sweep` serially against `--jobs N` (issue 21: the sweep of 64 configurations on a local
2-worker cluster in about half the serial time).

    python bench/sweep_speed.py [--pairs 5] [--jobs 2] [--dask] [--root DIR] [--limit N]

Runs `python -m checker.cli sweep prefix_capped --knob replicas=1,2,3,4 --knob batch.max_num_seqs=4,8,16,32
--knob batch.max_num_batched_tokens=1024,2048,4096,8192 --json` (64 configurations, 240 requests each) as a
whole process, alternating serial (A) and --jobs N (B) pair by pair (and, with --dask, --scheduler on a Dask
LocalCluster of N workers started once, outside the timings), with the 1-minute load average beside each run and
the cores other processes kept busy in the second before it (/proc/stat: the load average lags, counting the
previous run).
Reports per way the process's wall time, the sweep's own `seconds` (the configurations' runs, without start-up
and loading) and the CPU time of the process and its local workers (not a Dask cluster's), min and median, and the
B/A ratios pair by pair; checks that every run gives the same results (every
row but its wall_s, the best configuration). `--root DIR`: time the batchcheck tree in DIR instead of this one;
`--baseline DIR`: also the tree in DIR (an older revision exported there), serial and --jobs N, in the same pairs. Figures go to docs/benchmarks.md by hand.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
KNOBS = ["replicas=1,2,3,4", "batch.max_num_seqs=4,8,16,32", "batch.max_num_batched_tokens=1024,2048,4096,8192"]


def busy_cores(seconds: float = 1.0) -> float | None:
    """How many cores other processes kept busy over the last ``seconds`` (from /proc/stat; None where there is
    none): the load the run meets, without the lag of the load average, which counts the previous run too."""
    def sample() -> tuple[int, int]:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        return sum(fields), fields[3] + fields[4]  # all, idle + iowait

    try:
        total0, idle0 = sample()
        time.sleep(seconds)
        total1, idle1 = sample()
    except OSError:
        return None
    return (os.cpu_count() or 1) * (1 - (idle1 - idle0) / max(1, total1 - total0))


def run_once(root: Path, how: list[str], limit: int | None) -> dict:
    """One whole `sweep` process: its wall time, the sweep's own seconds, the load before it, its results."""
    argv = [sys.executable, "-m", "checker.cli", "sweep", str(ROOT / "spec" / "fleets" / "prefix_capped.yaml"),
            *(a for k in KNOBS for a in ("--knob", k)), "--json", *how]
    if limit is not None:
        argv += ["--limit", str(limit)]
    env = {**os.environ, "PYTHONPATH": str(root), "BATCHCHECK_PROGRESS": "off"}
    busy, load = busy_cores(), os.getloadavg()[0]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    done = subprocess.run(argv, cwd=root, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)  # the process and the local workers it waited for
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    if done.returncode not in (0, 1):
        raise SystemExit(f"sweep {' '.join(how)} exited {done.returncode}: {done.stderr[-2000:]}")
    doc = json.loads(done.stdout)
    figures = ([{k: v for k, v in r.items() if k != "wall_s"} for r in doc["results"]], doc["best"])
    return {"wall": wall, "seconds": doc["seconds"], "cpu": cpu, "load": load, "busy": busy, "figures": figures,
            "where": doc["where"]}


def summary(label: str, runs: list[dict]) -> str:
    walls, secs, cpus = [r["wall"] for r in runs], [r["seconds"] for r in runs], [r["cpu"] for r in runs]
    loads, busy = [r["load"] for r in runs], [r["busy"] for r in runs if r["busy"] is not None]
    others = f", others busy {min(busy):.2f}-{max(busy):.2f} cores" if busy else ""
    return (f"{label:<22} process wall min {min(walls):5.2f} s median {statistics.median(walls):5.2f} s | sweep's own "
            f"min {min(secs):5.2f} s median {statistics.median(secs):5.2f} s | CPU min {min(cpus):5.2f} s median "
            f"{statistics.median(cpus):5.2f} s | load {min(loads):.2f}-{max(loads):.2f}{others}")


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
    parser.add_argument("--baseline", type=Path, help="also time the tree in this folder (an older revision exported "
                        "there), its runs in the same pairs")
    args = parser.parse_args()
    sys.path.insert(0, str(args.root))  # the Dask workers' batchcheck (spawned with this process's path)
    print(f"{platform.machine()} {os.cpu_count()} CPUs, Python {platform.python_version()}, tree {args.root}, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    ways: dict[str, tuple[Path, list[str]]] = {"A serial": (args.root, []),
                                               f"B --jobs {args.jobs}": (args.root, ["--jobs", str(args.jobs)])}
    if args.baseline is not None:  # the same two ways on an older tree, in the same pairs
        ways |= {"A0 serial, baseline": (args.baseline, []),
                 f"B0 --jobs {args.jobs}, baseline": (args.baseline, ["--jobs", str(args.jobs)])}
    cluster = None
    if args.dask:
        from distributed import LocalCluster

        cluster = LocalCluster(n_workers=args.jobs, threads_per_worker=1, processes=True, dashboard_address=None)
        ways[f"C Dask, {args.jobs} workers"] = (args.root, ["--scheduler", cluster.scheduler_address])
    runs: dict[str, list[dict]] = {label: [] for label in ways}
    figures = None
    try:
        for pair in range(args.pairs):
            order = list(ways.items())
            if pair % 2:  # alternate which way runs first
                order.reverse()
            for label, (root, how) in order:
                run = run_once(root, how, args.limit)
                figures = figures or run["figures"]
                if run["figures"] != figures:
                    raise SystemExit(f"{label}: results differ from the first run's")
                runs[label].append(run)
                print(f"  pair {pair + 1} {label:<22} wall {run['wall']:6.2f} s, sweep's own {run['seconds']:6.2f} s, "
                      f"CPU {run['cpu']:6.2f} s, load {run['load']:.2f}, others busy "
                      f"{'-' if run['busy'] is None else format(run['busy'], '.2f')} cores ({run['where']})", flush=True)
    finally:
        if cluster is not None:
            cluster.close()
    print(f"{len(figures[0])} configurations; best: row {figures[1]}; every run gave the same results")
    for label, done in runs.items():
        print(summary(label, done))
    labels = list(runs)
    compared = [(label, labels[0]) for label in labels[1:] if not label.startswith(("A0", "B0"))]
    if args.baseline is not None:
        compared += [(labels[3], labels[2]), (labels[0], labels[2]), (labels[1], labels[3])]  # B0/A0, new/old
    for label, base in compared:
        print(ratios(f"{label} / {base} process wall", runs[base], runs[label], "wall"))
        print(ratios(f"{label} / {base} sweep's own", runs[base], runs[label], "seconds"))

if __name__ == "__main__":
    main()
