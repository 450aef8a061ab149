"""The ``sweep`` verb: a grid or random search over knobs of a fleet, the best configuration that meets the SLOs
(docs/fleet.md, Sweep). A thin shell over checker.api.fleet_sweep."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from checker.exitcodes import ExitCode


def _sweep(args: argparse.Namespace) -> int:
    from checker.api import fleet_sweep
    from checker.commands.shell import terminal_progress, trace_options_from
    from checker.errors import UsageError

    if args.scheduler and args.jobs:
        raise UsageError("--jobs runs local processes, --scheduler a Dask cluster: one of them")
    progress = terminal_progress()

    def done(i: int, result: dict) -> None:
        if progress is not None:
            progress(f"sweep: configuration {i + 1} {_config(result['config'])}: "
                     f"{'meets' if result['meets'] else 'fails'}")

    s = fleet_sweep(args.fleet, args.knob, args.workload, args.trace, args.limit, trace_options_from(args),
                    args.objective, args.random, args.seed, args.jobs or 1, args.scheduler, done)
    terminal_progress.clear()
    code = ExitCode.OK if s.best is not None else \
        ExitCode.INCONCLUSIVE if any(r["unknown"] and not r["violated"] for r in s.results) else ExitCode.VIOLATED
    doc = sweep_json(s, int(code))
    written = None
    if args.out is not None:
        from checker.fileio import safe_name, write_atomic

        written = Path(args.out) / f"{safe_name(s.fleet.name, 'fleet')}.sweep.json"
        write_atomic(written, json.dumps(doc, indent=1) + "\n", create_dirs=True)
    if args.json:
        print(json.dumps(doc, indent=1))
        return code
    print(format_sweep(s))
    if written is not None:
        print(f"written: {written}")
    return code


def _config(config: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in config.items())


def sweep_json(s, code: int) -> dict:
    """What ``sweep --json`` prints (docs/schemas/sweep.schema.json)."""
    return {"fleet": s.fleet.name, "source": s.fleet.source, "requests_source": s.requests.source,
            "requests": len(s.requests.specs), "knobs": {k.name: list(k.values) for k in s.knobs},
            "search": "random" if _sampled(s) else "grid",
            "objective": s.objective, "configurations": len(s.results), "results": s.results, "best": s.best,
            "best_config": None if s.best is None else s.results[s.best]["config"], "where": s.where,
            "seconds": round(s.seconds, 3), "exit_code": code}


def _sampled(s) -> bool:
    size = 1
    for k in s.knobs:
        size *= len(k.values)
    return s.sampled is not None and s.sampled < size


def format_sweep(s) -> str:
    from checker.fleet.sweep import OBJECTIVES

    names = [k.name for k in s.knobs if k.name != "replicas"]  # the replicas column shows it
    widths = [max(len(n), *(len(str(r["config"][n])) for r in s.results)) for n in names]
    head = "  ".join(f"{n:>{w}}" for n, w in zip(names, widths))
    lines = [f"sweep {s.fleet.name} on {s.requests.source}: {len(s.requests.specs)} requests, {len(s.results)} "
             f"configurations ({'random sample' if _sampled(s) else 'grid'}) on {s.where} in {s.seconds:.1f} s", "",
             f"  {head}  {'replicas':>8}  {'meets':>5}  {'goodput/s':>9}  {'/replica':>8}  {'TTFT p99':>9}  "
             f"{'lost':>5}  violated"]
    for i, r in enumerate(s.results):
        cells = "  ".join(f"{str(r['config'][n]):>{w}}" for n, w in zip(names, widths))
        p99 = "-" if r["ttft_p99_ms"] is None else f"{r['ttft_p99_ms']:,.0f}"
        mark = " *" if i == s.best else ""
        lines.append(f"  {cells}  {r['replicas']:>8}  {'yes' if r['meets'] else 'no':>5}  {r['goodput_per_s']:>9}  "
                     f"{r['goodput_per_replica']:>8}  {p99:>9}  {r['lost']:>5}  "
                     f"{', '.join(r['violated'] + [u + ' (unknown)' for u in r['unknown']]) or '-'}{mark}")
    lines.append("")
    if s.best is None:
        lines.append("best: none: no configuration meets every property of the fleet")
    else:
        lines.append(f"best (* above; by {OBJECTIVES[s.objective][0]}): {_config(s.results[s.best]['config'])}")
    return "\n".join(lines)


def register(verbs) -> None:
    from checker.commands.fleet import fleet_requests_flags, jobs_flags
    from checker.commands.shell import SEED, number
    from checker.fleet.sweep import MAX_CONFIGURATIONS, OBJECTIVES

    p = verbs.add_parser("sweep", help="search fleet configurations (knobs) for the best one that meets the SLOs",
                         description="Runs FLEET once per configuration of the knobs (a grid, or --random N of it) on "
                                     "the same requests and reports the best configuration that meets every property "
                                     "of the fleet (its SLOs and the rest). Exit 0: one does; 1: none does; 3: none "
                                     "does and some runs decided nothing; 2: bad input. docs/fleet.md.")
    fleet_requests_flags(p)
    p.add_argument("--knob", action="append", default=[], metavar="NAME=V1,V2,...",
                   help="a policy field set on every replica group (batch.max_num_seqs=8,16), a router field "
                        "(router.load_cap=2,4) or replicas=2,3,4 (a one-group fleet's replica count); repeatable: "
                        "the grid is every combination")
    p.add_argument("--random", type=number(int, 1, MAX_CONFIGURATIONS, unit="configurations"), metavar="N",
                   help="run N configurations drawn from the grid (seeded by --seed) instead of all of it")
    p.add_argument("--seed", type=SEED, default=0, metavar="N", help="--random: the seed (default 0)")
    p.add_argument("--objective", choices=list(OBJECTIVES), default="goodput_per_replica",
                   help="what 'best' means among the configurations that meet every property (default "
                        "goodput_per_replica)")
    jobs_flags(p, "configurations run on N local processes (default 1: in this process)")
    p.add_argument("--json", action="store_true", help="print every configuration's result as JSON")
    p.add_argument("--out", metavar="DIR", help="also write the result (NAME.sweep.json) here")
    p.set_defaults(run=_sweep)
