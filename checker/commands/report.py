"""The ``report`` verb: a counterexample as a markdown bug report and a PNG timeline."""

from __future__ import annotations

import argparse
import json

from checker.exitcodes import ExitCode


def _report(args: argparse.Namespace) -> int:
    from checker.api import run_report

    files = run_report(args.counterexample, args.out, args.html, args.invariant_module)
    if args.json:
        print(json.dumps({"counterexample": str(args.counterexample), "markdown": str(files.markdown),
                          "png": str(files.png), "html": None if files.html is None else str(files.html),
                          "still_violated": files.still_violated, "verdict_line": files.verdict_line,
                          "exit_code": int(ExitCode.OK)}, indent=1))
        return ExitCode.OK
    print(f"{files.markdown}: bug report ({files.verdict_line})")
    print(f"{files.png}: timeline")
    if files.html is not None:
        print(f"{files.html}: the report as one HTML page with an interactive timeline")
    return ExitCode.OK


def register(verbs) -> None:
    p = verbs.add_parser("report", help="render a counterexample as a markdown bug report and a PNG timeline",
                         description="Replays the counterexample on the engine and writes NAME.md (policy excerpt, "
                                     "property, assumptions, per-iteration table, replay command) and NAME.png "
                                     "(timeline) into --out. Exit 0 once written; 2 for a bad file or an "
                                     "unwritable --out (nothing is written then). docs/report.md.")
    p.add_argument("counterexample", metavar="COUNTEREXAMPLE.json")
    p.add_argument("--out", default="reports", metavar="DIR", help="where the report goes (default reports/)")
    p.add_argument("--html", action="store_true", help="also NAME.html: the report and an interactive timeline "
                   "(hover an iteration, click a request), one static file")
    p.add_argument("--invariant-module", action="append", metavar="MODULE", help="load user invariants (default: "
                   "the module the counterexample records)")
    p.add_argument("--json", action="store_true", help="print the files written and the replay's verdict as JSON")
    p.set_defaults(run=_report)
