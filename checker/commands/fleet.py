"""The ``fleet`` verb, and ``simulate --fleet`` / ``fuzz --fleet`` (docs/fleet.md): replicas behind a router,
clients that retry, faults and recovery.

One implementation: ``show_run`` runs a fleet file (or replays a counterexample on it) and prints it, ``show_search``
searches it; ``fleet`` calls both, ``simulate --fleet`` is ``fleet`` without --search/--replay and ``fuzz --fleet``
is ``fleet --search`` with fuzz's flags (its --time-budget is for all properties, as fuzz's is)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from checker.exitcodes import ExitCode


def show_run(fleet: str, workload: str | None, trace: str | None, limit: int | None, options, replay: str | None,
             as_json: bool, out: str | None) -> int:
    """Run (or replay on) the fleet, print the summary and verdicts (or the JSON document); the exit code."""
    from checker.api import fleet as run_fleet

    run = run_fleet(fleet, workload, trace, limit, replay, options)
    code = ExitCode.VIOLATED if run.violated else ExitCode.OK if run.decided else ExitCode.INCONCLUSIVE
    doc = {**run.summary, "mode": "replay" if replay else "run",
           "properties": [f.as_json() for f in run.findings], "exit_code": int(code)}
    written = None
    if out is not None:
        from checker.fileio import safe_name, write_atomic

        written = Path(out) / f"{safe_name(run.fleet.name, 'fleet')}.fleet.json"
        write_atomic(written, json.dumps(doc, indent=1) + "\n", create_dirs=True)
    if as_json:
        print(json.dumps(doc, indent=1))
        return code
    from checker.fleet.report import format_fleet

    print(format_fleet(run.summary, run.findings))
    if written is not None:
        print(f"written: {written}")
    return code


def show_search(fleet: str, workload: str | None, properties: list[str] | None, max_examples: int,
                time_budget: float, seed: int, max_requests: int, out: str | None, as_json: bool,
                stresses: list[str] | None = None, database: str | None = None, budget_in_all: bool = False,
                jobs: int = 1, scheduler: str | None = None) -> int:
    """Search the fleet (one Hypothesis search per property), print each verdict (or the JSON document)."""
    from checker.api import fleet_search

    results = fleet_search(fleet, workload, max_examples, time_budget, seed, max_requests,
                           Path(out) if out else None, properties, stresses,
                           Path(database) if database else None, budget_in_all, jobs, scheduler)
    code = ExitCode.VIOLATED if any(r.violated for r in results) else ExitCode.OK
    if as_json:
        print(json.dumps({"fleet": fleet, "mode": "search", "results": [r.as_json() for r in results],
                          "exit_code": int(code)}, indent=1))
    else:
        for r in results:
            print(r.line())
    return code


def _fleet(args: argparse.Namespace) -> int:
    from checker.commands.shell import trace_options_from
    from checker.errors import UsageError

    if args.search and args.replay:
        raise UsageError("--search and --replay exclude each other (a search saves what --replay runs)")
    options = trace_options_from(args)
    trace_flags = options != type(options)()
    if args.replay and (args.workload or args.trace or args.limit or trace_flags):
        raise UsageError("--replay runs the counterexample's own requests: no --workload, --trace, --limit or trace "
                         "options")
    if args.property and not args.search:
        raise UsageError("--property chooses what --search looks for: add --search")
    if (args.jobs or args.scheduler) and not args.search:
        raise UsageError("--jobs and --scheduler run --search's property searches in parallel: add --search")
    if args.jobs and args.scheduler:
        raise UsageError("--jobs runs local processes, --scheduler a Dask cluster: one of them")
    if args.search and (args.trace or trace_flags):
        raise UsageError("--search draws requests from a workload's classes: --workload FILE, not --trace or trace "
                         "options")
    if args.search:
        return show_search(args.fleet, args.workload, args.property, args.max_examples, args.time_budget, args.seed,
                           args.max_requests, args.out, args.json, jobs=args.jobs or 1, scheduler=args.scheduler)
    return show_run(args.fleet, args.workload, args.trace, args.limit, options, args.replay, args.json, args.out)


# What simulate --fleet and fuzz --fleet refuse: the flag, its value when not given, and why (a fleet file says it).
_NOT_WITH_FLEET = {
    "simulate": (("policy", None, "POLICY: each replica group names its policy in the fleet file"),
                 ("profile", None, "--profile: each replica group names its profile in the fleet file"),
                 ("plot", None, "--plot: a fleet run has no single-replica timeline")),
    "fuzz": (("policy", None, "POLICY: each replica group names its policy in the fleet file"),
             ("profile", None, "--profile: each replica group names its profile in the fleet file"),
             ("slo", None, "--slo: the fleet file names its SLO file (slo:)"),
             ("seed_trace", None, "--seed-trace: the fleet search draws from the workload's classes only"),
             ("seed_windows", 20, "--seed-windows: the fleet search has no seed trace")),
}


def _refuse_single_replica_flags(args: argparse.Namespace) -> None:
    from checker.errors import UsageError

    for attr, unset, why in _NOT_WITH_FLEET[args.verb]:
        if getattr(args, attr, unset) != unset:
            raise UsageError(f"{args.verb} --fleet takes no {why}")


def simulate_fleet(args: argparse.Namespace) -> int:
    """``simulate --fleet FLEET``: the fleet verb's run (--workload/--trace optional: the fleet file names its
    requests), with simulate's --limit, trace options and --json."""
    from checker.commands.shell import trace_options_from

    _refuse_single_replica_flags(args)
    return show_run(args.fleet, args.workload, args.trace, args.limit, trace_options_from(args), None, args.json,
                    None)


def fuzz_fleet(args: argparse.Namespace) -> int:
    """``fuzz --fleet FLEET``: the fleet verb's search, with fuzz's flags (--time-budget for all properties) and its
    --jobs / --scheduler (the property searches on local processes or a Dask cluster)."""
    from checker.commands.shell import trace_options_from
    from checker.errors import UsageError

    _refuse_single_replica_flags(args)
    options = trace_options_from(args)
    if options != type(options)():
        raise UsageError("fuzz --fleet takes no trace options (--window, --rate-scale, --class-by-prompt, "
                         "--class-column): the fleet search draws from the workload's classes")
    if args.jobs and args.scheduler:
        raise UsageError("--jobs runs local processes, --scheduler a Dask cluster: one of them")
    database = None if args.database in (None, "none") else args.database
    return show_search(args.fleet, args.workload, args.property, args.max_examples, args.time_budget, args.seed,
                       args.max_requests, args.out, args.json, args.stress, database, budget_in_all=True,
                       jobs=args.jobs or 1, scheduler=args.scheduler)


def policy_or_fleet(p: argparse.ArgumentParser, fleet_help: str) -> None:
    """simulate's and fuzz's POLICY (optional: absent with --fleet) and --fleet FLEET.yaml."""
    p.add_argument("policy", metavar="POLICY", nargs="?")
    p.add_argument("--fleet", metavar="FLEET.yaml", help=fleet_help)


def fleet_requests_flags(p: argparse.ArgumentParser) -> None:
    """FLEET and its requests, as fleet and sweep take them: --workload or --trace (default: the fleet file's),
    --limit and the trace options."""
    from checker.commands.shell import MAX_COUNT, number, trace_option_flags

    p.add_argument("fleet", metavar="FLEET")
    source = p.add_mutually_exclusive_group()
    source.add_argument("--workload", metavar="FILE", help="workload spec (YAML; default: the fleet file's)")
    source.add_argument("--trace", metavar="FILE", help="trace: batchcheck JSON, Azure CSV or Mooncake JSONL")
    p.add_argument("--limit", type=number(int, 1, MAX_COUNT, unit="requests"), metavar="N",
                   help="only the first N requests")
    trace_option_flags(p)


def jobs_flags(p: argparse.ArgumentParser, jobs_help: str) -> None:
    """--jobs N (local processes) and --scheduler ADDRESS (a Dask cluster), as ci takes them (checker.parallel)."""
    from checker.commands.shell import JOBS

    p.add_argument("--jobs", type=JOBS, metavar="N", help=jobs_help)
    p.add_argument("--scheduler", metavar="ADDRESS", help="run on a Dask cluster instead (tcp://HOST:PORT); needs "
                   "batchcheck[scale]")


def register(verbs) -> None:
    from checker.commands.shell import EXAMPLES, SECONDS, SEED, number

    p = verbs.add_parser("fleet", help="simulate replicas behind a router, with client retries and faults",
                         description="Runs the requests (--workload or --trace; default: the fleet file's workload) "
                                     "through FLEET: its replicas (each a policy and a profile, stepping the one "
                                     "semantics), its router, clients and faults; prints TTFT per class, requests "
                                     "lost, retries, retry amplification, goodput and recovery times, and the verdict "
                                     "of each property. --search: a Hypothesis search over arrivals and faults, "
                                     "shrunk and replayed; --replay FILE: a saved fleet counterexample run again. "
                                     "Exit 1: a property is violated; 0: none is; 3: the run stopped at its step limit "
                                     "(every verdict UNKNOWN); 2: bad input. simulate --fleet and fuzz --fleet are the "
                                     "same runs. docs/fleet.md.")
    fleet_requests_flags(p)
    p.add_argument("--search", action="store_true", help="search arrivals and faults for a violation (Hypothesis)")
    p.add_argument("--replay", metavar="FILE", help="run a saved fleet counterexample again")
    p.add_argument("--property", action="append", metavar="NAME",
                   help="--search: only this property (repeatable; default all of the fleet's)")
    p.add_argument("--max-examples", type=EXAMPLES, default=100, metavar="N",
                   help="--search: examples per property (default 100)")
    p.add_argument("--time-budget", type=SECONDS, default=60.0, metavar="S",
                   help="--search: seconds per property before shrinking (default 60)")
    p.add_argument("--seed", type=SEED, default=0, metavar="N", help="--search: Hypothesis seed (default 0)")
    p.add_argument("--max-requests", type=number(int, 1, 100_000), default=20, metavar="N",
                   help="--search: requests per stress segment (default 20)")
    jobs_flags(p, "--search: the property searches on N local processes (default 1: one after the other here)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--out", metavar="DIR", help="write the result (NAME.fleet.json) and counterexamples here")
    p.set_defaults(run=_fleet)
