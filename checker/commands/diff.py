"""The ``diff`` verb: a thin shell over checker.api.run_diff."""

from __future__ import annotations

import argparse
import json
import os

from checker.commands.shell import DEPTH, EXAMPLES, JOBS, SECONDS, SEED, SLOTS, int_range, number, terminal_progress


def _diff(args: argparse.Namespace) -> int:
    from checker.api import run_diff

    out = None if args.out == "none" else args.out
    report = run_diff(args.old, args.new, args.workload, args.slo, args.invariant, args.requests, args.depth,
                      args.timeout, args.profile, args.threshold, args.min_delta, args.max_examples, args.fuzz_budget,
                      args.seed, out, args.prompt_range, args.output_range,
                      True if args.unbounded else False if args.bounded_only else None, args.property,
                      not args.no_audit, args.slo_gate == "violates", terminal_progress(),
                      args.jobs or os.cpu_count() or 1)
    terminal_progress.clear()
    print(json.dumps(report.as_dict(), indent=2) if args.json else report.text())
    return report.exit_code


def register(verbs) -> None:
    p = verbs.add_parser(
        "diff", help="what a policy change breaks: invariants and SLOs under OLD and NEW, with witnesses",
        description="Exit 0: no regression (within the stated bounds); 1: a regression (a trace on which NEW "
                    "is worse than OLD, replayed on the engine); 2: bad input; 3: no regression found but a "
                    "check was undecided.")
    p.add_argument("old", metavar="OLD", help="the policy in production")
    p.add_argument("new", metavar="NEW", help="the changed policy")
    p.add_argument("--workload", metavar="FILE",
                   help="length ranges for the solver; generated traces, SLO file (FILE's .slo.yaml) and audit")
    p.add_argument("--slo", metavar="FILE", help="SLO properties (default: the workload's .slo.yaml, if any)")
    p.add_argument("--property", action="append", metavar="NAME", help="only these SLO properties (repeatable)")
    p.add_argument("--invariant", action="append", metavar="NAME[:PARAMS]",
                   help="repeatable; default: the four safety invariants, no_deadlock and decode_progress")
    p.add_argument("--requests", type=SLOTS, default=3, metavar="N", help="request slots (default 3)")
    p.add_argument("--depth", type=DEPTH, default=5, metavar="K", help="iterations (default 5)")
    p.add_argument("--timeout", type=SECONDS, default=60.0, metavar="S", help="seconds per solver search (default 60)")
    p.add_argument("--prompt-range", type=int_range, metavar="LOW:HIGH")
    p.add_argument("--output-range", type=int_range, metavar="LOW:HIGH")
    proof = p.add_mutually_exclusive_group()
    proof.add_argument("--unbounded", action="store_true",
                       help="try to PROVE held invariants (action-wise, then whole-step induction) for every invariant")
    proof.add_argument("--bounded-only", action="store_true",
                       help="each side's verdict from the bounded search alone (default: the proof first where the "
                            "action-wise proof covers the invariant, as verify)")
    p.add_argument("--jobs", type=JOBS, metavar="N",
                   help="worker processes for the two sides' invariant verdicts (default: the CPU count; 1: in this "
                        "process, one after the other); the same rows and exit code either way")
    p.add_argument("--profile", metavar="FILE", help="service curve for the SLO runs and the audit")
    p.add_argument("--threshold", type=float, default=0.2, metavar="R",
                   help="an SLO is worse when higher by more than R relative (default 0.2 = 20 %%)")
    p.add_argument("--min-delta", type=number(float, 0, 1e12), default=1.0, metavar="X",
                   help="... and by more than X in the property's unit (default 1, e.g. 1 ms)")
    p.add_argument("--slo-gate", choices=("worse", "violates"), default="worse",
                   help="an SLO regression is a trace where NEW is worse (default), or where NEW also breaks the "
                        "SLO and OLD meets it")
    p.add_argument("--max-examples", type=EXAMPLES, default=100, metavar="N", help="generated traces per SLO direction")
    p.add_argument("--fuzz-budget", type=SECONDS, default=60.0, metavar="S", help="seconds for all SLO searches")
    p.add_argument("--seed", type=SEED, default=0)
    p.add_argument("--no-audit", action="store_true", help="skip the capacity audit of both")
    p.add_argument("--out", default="counterexamples", metavar="DIR",
                   help="where witnesses go (default counterexamples/; 'none': do not save)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=_diff)
