"""The ``fleet`` verb: replicas behind a router, clients that retry, faults and recovery (docs/fleet.md)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from checker.exitcodes import ExitCode


def _fleet(args: argparse.Namespace) -> int:
    from checker.api import fleet
    from checker.errors import UsageError

    if args.search and args.replay:
        raise UsageError("--search and --replay exclude each other (a search saves what --replay runs)")
    if args.replay and (args.workload or args.trace or args.limit):
        raise UsageError("--replay runs the counterexample's own requests: no --workload, --trace or --limit")
    if args.property and not args.search:
        raise UsageError("--property chooses what --search looks for: add --search")
    if args.search and args.trace:
        raise UsageError("--search draws requests from a workload's classes: --workload FILE, not --trace")
    out = Path(args.out) if args.out else None
    if args.search:
        from checker.api import fleet_search

        results = fleet_search(args.fleet, args.workload, args.max_examples, args.time_budget, args.seed,
                               args.max_requests, out, args.property)
        code = ExitCode.VIOLATED if any(r.violated for r in results) else ExitCode.OK
        if args.json:
            print(json.dumps({"fleet": args.fleet, "mode": "search", "results": [r.as_json() for r in results],
                              "exit_code": int(code)}, indent=1))
        else:
            for r in results:
                print(r.line())
        return code
    run = fleet(args.fleet, args.workload, args.trace, args.limit, args.replay)
    code = ExitCode.VIOLATED if run.violated else ExitCode.OK if run.decided else ExitCode.INCONCLUSIVE
    doc = {**run.summary, "mode": "replay" if args.replay else "run",
           "properties": [f.as_json() for f in run.findings], "exit_code": int(code)}
    written = None
    if out is not None:
        from checker.fileio import safe_name, write_atomic

        written = out / f"{safe_name(run.fleet.name, 'fleet')}.fleet.json"
        write_atomic(written, json.dumps(doc, indent=1) + "\n", create_dirs=True)
    if args.json:
        print(json.dumps(doc, indent=1))
        return code
    from checker.fleet.report import format_fleet

    print(format_fleet(run.summary, run.findings))
    if written is not None:
        print(f"written: {written}")
    return code


def register(verbs) -> None:
    from checker.commands.shell import EXAMPLES, MAX_COUNT, SECONDS, SEED, number

    p = verbs.add_parser("fleet", help="simulate replicas behind a router, with client retries and faults",
                         description="Runs the requests (--workload or --trace; default: the fleet file's workload) "
                                     "through FLEET: its replicas (each a policy and a profile, stepping the one "
                                     "semantics), its router, clients and faults; prints TTFT per class, requests "
                                     "lost, retries, retry amplification, goodput and recovery times, and the verdict "
                                     "of each property. --search: a Hypothesis search over arrivals and faults, "
                                     "shrunk and replayed; --replay FILE: a saved fleet counterexample run again. "
                                     "Exit 1: a property is violated; 0: none is; 3: the run stopped at its step limit "
                                     "(every verdict UNKNOWN); 2: bad input. docs/fleet.md.")
    p.add_argument("fleet", metavar="FLEET")
    source = p.add_mutually_exclusive_group()
    source.add_argument("--workload", metavar="FILE", help="workload spec (YAML)")
    source.add_argument("--trace", metavar="FILE", help="trace: batchcheck JSON, Azure CSV or Mooncake JSONL")
    p.add_argument("--limit", type=number(int, 1, MAX_COUNT, unit="requests"), metavar="N",
                   help="only the first N requests")
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
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--out", metavar="DIR", help="write the result (NAME.fleet.json) and counterexamples here")
    p.set_defaults(run=_fleet)
