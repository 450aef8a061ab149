"""The ``report`` verb: a counterexample as a markdown bug report and a PNG timeline."""

from __future__ import annotations

import argparse

from checker.exitcodes import ExitCode


def _report(args: argparse.Namespace) -> int:
    from checker.api import run_report

    files = run_report(args.counterexample, args.out, args.html)
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
    p.set_defaults(run=_report)
