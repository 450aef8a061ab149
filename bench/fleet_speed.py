"""Benchmark: the fleet's speed targets (issue 21).

    python bench/fleet_speed.py azure [--replicas 8] [--rate-scale 8] [--window START:END] [--repeat 1] [--plain]
                                      [--disaggregated P]
    python bench/fleet_speed.py sweep [--jobs 2] [--dask]

azure: N vLLM v1 replicas behind least_outstanding on the Azure conversation trace at X times its rate
(default: the whole trace, 8 replicas, 8x; target <= 30 s on one core). Needs
../shared/data/traces/azure_conv_2023.csv.
sweep: the 64-configuration sweep of prefix_capped (replicas 1-4 x max_num_seqs 4/8/16/32 x
max_num_batched_tokens 1024/2048/4096/8192), serially and on --jobs local processes, and with --dask on a
Dask LocalCluster of --jobs workers (target: about half the serial time on 2 workers); checks that every way
gives the same results. Results go to docs/benchmarks.md by hand.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from checker.fleet.metrics import summarize_fleet  # noqa: E402
from checker.fleet.run import fleet_requests  # noqa: E402
from checker.fleet.simulation import simulate_fleet  # noqa: E402
from checker.fleet.spec import load_fleet  # noqa: E402
from checker.fleet.sweep import fleet_sweep  # noqa: E402
from checker.traces import TraceOptions  # noqa: E402

TRACE = ROOT.parent / "shared" / "data" / "traces" / "azure_conv_2023.csv"
SWEEP_KNOBS = ["replicas=1,2,3,4", "batch.max_num_seqs=4,8,16,32", "batch.max_num_batched_tokens=1024,2048,4096,8192"]


def azure(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "azure8.yaml"
        policy = ROOT / "spec" / "policies" / "vllm_v1.yaml"
        if args.disaggregated:  # P prefill replicas and the rest decode replicas, 20 ms transfers
            p = args.disaggregated
            groups = (f"  - {{name: p, policy: {policy}, count: {p}, set: ['connector.kind=prefill_node']}}\n"
                      f"  - {{name: d, policy: {policy}, count: {args.replicas - p}, "
                      "set: ['connector.kind=decode_node']}\n"
                      "pools: {kind: disaggregated, prefill: [p], decode: [d], transfer_ms: 20}\n")
        else:
            groups = f"  - {{name: r, policy: {policy}, count: {args.replicas}}}\n"
        path.write_text(f"format: batchcheck-fleet\nname: azure_{args.replicas}\nreplicas:\n{groups}"
                        "router: {strategy: least_outstanding}\n")
        fleet = load_fleet(path)
    window = tuple(float(x) for x in args.window.split(":")) if args.window else None
    t0 = time.perf_counter()
    requests = fleet_requests(fleet, None, TRACE, options=TraceOptions(window_s=window, rate_scale=args.rate_scale))
    load_s = time.perf_counter() - t0
    print(f"{args.replicas} replicas, Azure conversation trace x{args.rate_scale:g}"
          f"{' window ' + args.window if args.window else ' (whole)'}: {len(requests.specs)} requests "
          f"(trace read in {load_s:.2f} s)")
    figures = {}
    for fast in ([True, False] if args.plain else [True]):
        walls = []
        for _ in range(args.repeat):
            result = simulate_fleet(fleet, requests, fast_forward=fast)
            walls.append(result.wall_s)
        s = summarize_fleet(result)
        s["engine"].pop("wall_s")
        figures[fast] = s
        walls.sort()
        print(f"  {'stretches' if fast else 'plain stepping'}: fleet wall min {walls[0]:.2f} s, median "
              f"{walls[len(walls) // 2]:.2f} s of {args.repeat}; {result.steps} replica steps, "
              f"{s['engine']['simulated_s']} s simulated; TTFT p50/p99 {s['overall']['ttft_ms']['p50']}/"
              f"{s['overall']['ttft_ms']['p99']} ms")
    if args.plain:
        print(f"  same summary both ways: {figures[True] == figures[False]}")


def sweep(args: argparse.Namespace) -> None:
    fleet = ROOT / "spec" / "fleets" / "prefix_capped.yaml"
    runs = [("serial", {"jobs": 1}), (f"{args.jobs} local processes", {"jobs": args.jobs})]
    cluster = None
    if args.dask:
        from distributed import LocalCluster

        cluster = LocalCluster(n_workers=args.jobs, threads_per_worker=1, processes=True, dashboard_address=None)
        runs.append((f"Dask LocalCluster, {args.jobs} workers", {"scheduler": cluster.scheduler_address}))
    figures = None
    try:
        for label, how in runs:
            t0 = time.perf_counter()
            s = fleet_sweep(fleet, SWEEP_KNOBS, **how)
            wall = time.perf_counter() - t0
            same = [{k: v for k, v in r.items() if k != "wall_s"} for r in s.results]
            figures = figures or same
            print(f"{label}: {len(s.results)} configurations in {wall:.1f} s wall; best "
                  f"{s.results[s.best]['config'] if s.best is not None else None}; same results as serial: "
                  f"{same == figures}")
    finally:
        if cluster is not None:
            cluster.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    verbs = parser.add_subparsers(dest="what", required=True)
    a = verbs.add_parser("azure")
    a.add_argument("--replicas", type=int, default=8)
    a.add_argument("--rate-scale", type=float, default=8.0)
    a.add_argument("--window", help="START:END seconds of the trace (default: all of it)")
    a.add_argument("--repeat", type=int, default=1)
    a.add_argument("--plain", action="store_true", help="also without the fleet's quiet decode stretches")
    a.add_argument("--disaggregated", type=int, metavar="P", default=0,
                   help="P of the replicas prefill, the rest decode (disaggregated pools, 20 ms transfers)")
    w = verbs.add_parser("sweep")
    w.add_argument("--jobs", type=int, default=2)
    w.add_argument("--dask", action="store_true")
    args = parser.parse_args()
    print(f"{platform.machine()} {platform.processor() or ''} {os.cpu_count()} CPUs, Python {platform.python_version()}, "
          f"load {os.getloadavg()[0]:.2f}")
    azure(args) if args.what == "azure" else sweep(args)


if __name__ == "__main__":
    main()
