"""The ``check-metrics`` verb: what a serving engine's Prometheus metrics show, checked against a policy."""

from __future__ import annotations

import argparse
import json

from checker.exitcodes import ExitCode


def _check_metrics(args: argparse.Namespace) -> int:
    from checker.api import run_check_metrics
    from checker.checkmetrics import as_json, render

    policy, result = run_check_metrics(args.policy, args.scrapes, args.check, args.stall_scrapes)
    if args.json:
        print(json.dumps(as_json(result, policy.name), indent=1))
    else:
        print("\n".join(render(result, policy.name)))
    if result.violated:
        return ExitCode.VIOLATED
    decided = any(f.verdict == "HOLDS" for f in result.findings)
    return ExitCode.OK if decided else ExitCode.INCONCLUSIVE


def register(verbs) -> None:
    from checker.checkmetrics import CHECKS, DEFAULT_STALL_SCRAPES
    from checker.commands.shell import number

    p = verbs.add_parser("check-metrics", help="check what a server's Prometheus metrics show against a policy",
                         description="Reads scrapes of vLLM's or SGLang's /metrics recorded over time (concatenated "
                                     "text scrapes, or a Prometheus /api/v1/query_range JSON answer) and checks "
                                     f"against POLICY: {', '.join(CHECKS)}. Exit 1: a check is violated; 0: none is "
                                     "and one holds; 3: nothing could be decided (series missing, situations never "
                                     "seen); 2: bad input. docs/check-metrics.md.")
    p.add_argument("policy", metavar="POLICY")
    p.add_argument("scrapes", metavar="SCRAPES")
    p.add_argument("--check", action="append", choices=CHECKS, metavar="NAME",
                   help=f"only these checks (repeatable; default all: {', '.join(CHECKS)})")
    p.add_argument("--stall-scrapes", type=number(int, 1, 100_000, unit="scrapes"), default=DEFAULT_STALL_SCRAPES,
                   metavar="K",
                   help="no_deadlock: scrapes in a row with requests waiting, none running and no token produced "
                        f"(default {DEFAULT_STALL_SCRAPES})")
    p.add_argument("--json", action="store_true", help="print the findings as JSON")
    p.set_defaults(run=_check_metrics)
