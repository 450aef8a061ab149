"""The ``ci`` verb: a thin shell over checker.api.run_ci (docs/ci.md)."""

from __future__ import annotations

import argparse
import json
import sys

from checker.commands.shell import JOBS
from checker.exitcodes import ExitCode



def _ci(args: argparse.Namespace) -> int:
    from checker.api import run_ci

    progress = sys.stderr.isatty()

    def done(i, total, check, result) -> None:
        if progress:
            print(f"\r\033[K  ... [{i + 1}/{total}] {check.policy.shown} {check.label}: {result.verdict}", end="",
                  file=sys.stderr, flush=True)

    only = (args.policy or []) + args.policies
    outcome = run_ci(args.config, jobs=args.jobs, scheduler=args.scheduler, junit=args.junit, sarif=args.sarif,
                     summary=args.summary, policies=only or None, done=done, base=args.base,
                     allow_outside_modules=args.allow_outside_modules)
    if progress:
        print("\r\033[K", end="", file=sys.stderr, flush=True)
    if args.json:
        print(json.dumps(outcome_json(outcome), indent=1))
        return ExitCode(outcome.exit_code)
    for f in outcome.findings:
        gate = "" if f.gating or f.level is None else "  (warning only)"
        print(f"{f.check.policy.shown}: {f.result.line}{gate}")
    for note in outcome.notes:
        print(f"note: {note}")
    for path in outcome.written:
        print(f"wrote {path}")
    violated = sum(1 for f in outcome.findings if f.gating and f.outcome == "failed")
    print(f"{len(outcome.findings)} checks, {violated} gating violation(s); {outcome.where}, "
          f"{outcome.seconds:.1f} s; exit {int(outcome.exit_code)}")
    return ExitCode(outcome.exit_code)


def outcome_json(outcome) -> dict:
    """What ``ci --json`` prints (docs/schemas/ci.schema.json): one entry per finding, in the report's order."""
    return {"findings": [{"policy": f.check.policy.shown, "policy_name": f.check.policy_name, "kind": f.check.kind,
                          "check": f.check.label, "rule_id": f.rule_id, "verdict": f.result.verdict,
                          "outcome": f.outcome, "gating": f.gating, "level": f.level, "field": f.field or None,
                          "line": f.line, "fingerprint": f.fingerprint, "message": f.result.line,
                          "seconds": round(f.result.seconds, 3), "counterexample": f.counterexample,
                          "certificate": f.certificate} for f in outcome.findings],
            "checks": len(outcome.findings),
            "gating_violations": sum(1 for f in outcome.findings if f.gating and f.outcome == "failed"),
            "notes": list(outcome.notes), "written": [str(p) for p in outcome.written], "where": outcome.where,
            "seconds": round(outcome.seconds, 3), "exit_code": int(outcome.exit_code)}


def register(verbs) -> None:
    p = verbs.add_parser("ci", help="run the checks batchcheck.toml names; write JUnit XML, SARIF and a summary",
                         description="Exit 0: no gating finding; 1: a gating check is violated; 3: a gating check "
                                     "was inconclusive (and none violated); 2: bad config or input. docs/ci.md.")
    p.add_argument("--config", default=None, metavar="FILE",
                   help="project config (default: batchcheck.toml here or in the nearest folder above)")
    p.add_argument("--jobs", type=JOBS, metavar="N", help="parallel checks on this machine (default: config's jobs, "
                   "else the CPU count)")
    p.add_argument("--scheduler", metavar="ADDRESS", help="run on a Dask cluster instead (tcp://HOST:PORT); "
                   "needs batchcheck[scale]")
    p.add_argument("--policy", action="append", metavar="FILE", help="only the checks of this policy file "
                   "(repeatable; e.g. the files a pull request changed)")
    p.add_argument("--base", metavar="REF", help="a git ref (e.g. origin/main): only the checks of the policy files "
                   "changed since it (all when batchcheck.toml changed), and [[diff]] entries without old/new "
                   "compare each changed policy with its version at REF")
    p.add_argument("--allow-outside-modules", action="store_true", help="let the config's invariant_modules name "
                   "code outside its folder (it is imported and run: docs/ci.md, \"Invariant modules run code\")")
    p.add_argument("--junit", metavar="FILE", help="write JUnit XML here")
    p.add_argument("--sarif", metavar="FILE", help="write SARIF 2.1.0 here (for code scanning)")
    p.add_argument("--summary", metavar="FILE", help="write a markdown summary here (for a PR comment)")
    p.add_argument("--json", action="store_true", help="print the findings, notes and files written as JSON on "
                   "stdout (instead of the text lines; JUnit, SARIF and the summary are written as usual)")
    p.add_argument("policies", nargs="*", metavar="POLICY", help="same as --policy (pre-commit passes changed files)")
    p.set_defaults(run=_ci)
