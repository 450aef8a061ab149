"""The batchcheck command line: a thin shell over the library API.

Exit codes (checker.exitcodes, docs/cli.md): 0 ok, 1 violated, 2 usage or input error,
3 inconclusive, 101 internal error.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable

from checker import __version__
from checker.errors import BatchcheckError
from checker.exitcodes import ExitCode

KINDS = ("policy", "workload", "trace", "profile", "audit-contract", "audit-workload")


def _schema(args: argparse.Namespace) -> int:
    from checker.api import json_schema

    print(json.dumps(json_schema(args.kind), indent=2))
    return ExitCode.OK


def _validate(args: argparse.Namespace) -> int:
    from checker.api import validate_file

    for path in args.files:
        kind = validate_file(path, args.kind)
        print(f"{path}: valid {kind}")
    return ExitCode.OK


def _bounds(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in text.split(",") if part)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} (expected token bounds like 512,4096)") from None


def _window(text: str) -> tuple[float, float]:
    start, sep, end = text.partition(":")
    try:
        return float(start), float(end)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} (expected START:END in seconds)") from None


def _trace_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--window", type=_window, metavar="START:END", help="only arrivals in this window (s from the first)")
    p.add_argument("--rate-scale", type=float, default=1.0, metavar="X", help="replay at X times the load (default 1)")
    p.add_argument("--class-by-prompt", type=_bounds, default=(), metavar="B1,B2,...",
                   help="classes by prompt-length bucket, e.g. 512,4096")
    p.add_argument("--class-column", metavar="NAME", help="class from this trace column (CSV) or field (JSONL)")


def _options_from(args: argparse.Namespace):
    from checker.traces import TraceOptions

    return TraceOptions(args.window, args.rate_scale, args.class_by_prompt, args.class_column)


def _simulate(args: argparse.Namespace) -> int:
    from checker.api import run_simulation
    from checker.report import format_summary

    result = run_simulation(args.policy, workload=args.workload, trace=args.trace, profile=args.profile,
                            limit=args.limit, options=_options_from(args))
    summary = result.summary()
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print(format_summary(summary))
    return ExitCode.OK


def _audit(args: argparse.Namespace) -> int:
    from checker.api import run_audit, run_derived_audit
    from checker.errors import UsageError

    derived = [flag for flag, value in (("--policy", args.policy), ("--profile", args.profile),
                                        ("--workload", args.derive_workload), ("--queue-slo-ms", args.queue_slo_ms),
                                        ("--ttft-slo-ms", args.ttft_slo_ms), ("--tpot-slo-ms", args.tpot_slo_ms))
               if value is not None]
    records = [path for path in (args.contract, args.workload) if path is not None]
    if records and derived:
        raise UsageError(f"give either CONTRACT WORKLOAD or --policy/--profile/--workload, not both "
                         f"(got {records[0]} and {derived[0]})")
    if derived:
        if args.policy is None or args.derive_workload is None:
            raise UsageError("the derived form needs --policy FILE and --workload FILE (--profile is optional)")
        result = run_derived_audit(args.policy, args.derive_workload, args.profile, queue_slo_ms=args.queue_slo_ms,
                                   ttft_slo_ms=args.ttft_slo_ms, tpot_slo_ms=args.tpot_slo_ms)
    elif len(records) == 2:
        result = run_audit(args.contract, args.workload)
    else:
        raise UsageError("give CONTRACT WORKLOAD (audit records) or --policy FILE --workload FILE [--profile FILE]")
    print(json.dumps(result.as_json(), indent=2) if args.json else result.text())
    return ExitCode.OK if result.failure is None else ExitCode.VIOLATED


def _range(text: str) -> tuple[int, int]:
    low, sep, high = text.partition(":")
    try:
        return int(low), int(high if sep else low)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} (expected LOW:HIGH, two integers)") from None


class _TerminalProgress:
    """A one-line progress display on stderr, only when stderr is a terminal."""

    def __init__(self):
        self.started = 0.0
        self.shown = False

    def __call__(self):
        import time

        if not sys.stderr.isatty():
            return None
        self.started = time.monotonic()

        def show(message: str) -> None:
            elapsed = time.monotonic() - self.started
            print(f"\r\033[K  ... {message} ({elapsed:.1f} s)", end="", file=sys.stderr, flush=True)
            self.shown = True
        return show

    def clear(self) -> None:
        if self.shown:
            print("\r\033[K", end="", file=sys.stderr, flush=True)
            self.shown = False


_terminal_progress = _TerminalProgress()


def _verify(args: argparse.Namespace) -> int:
    from checker.api import run_verify
    from checker.verify.run import overall_exit

    env, results = run_verify(args.policy, args.invariant, args.requests, args.depth, args.timeout, args.workload,
                              args.out, args.prompt_range, args.output_range, not args.no_cancellations, args.step_ms,
                              args.unbounded, args.proof_dir, args.invariant_module, _terminal_progress())
    _terminal_progress.clear()
    code = overall_exit(results)
    if args.json:
        print(json.dumps({"policy": args.policy, "environment": env.as_dict(), "assumptions": env.describe(),
                          "results": [r.as_dict() for r in results], "exit_code": int(code)}, indent=2))
    else:
        print(f"policy {args.policy}; assumptions:")
        for line in env.describe():
            print(f"  - {line}")
        for r in results:
            print(r.line())
    return code


def _replay(args: argparse.Namespace) -> int:
    from checker.api import run_replay
    from checker.verify.replay import replay_table

    report = run_replay(args.counterexample, args.policy)
    print(f"replaying {args.counterexample} under policy {report.policy.name}")
    print(replay_table(report))
    if report.violation is None:
        print(f"{report.invariant.name} holds on this trace: the policy no longer fails it")
        return ExitCode.OK
    print(f"{report.invariant.name} VIOLATED at iteration {report.violation} "
          f"(recorded: iteration {report.recorded_violation})")
    return ExitCode.VIOLATED


def _recheck(args: argparse.Namespace) -> int:
    from checker.api import run_recheck

    result = run_recheck(args.certificate)
    if result == "unsat":
        print(f"{args.certificate}: certificate holds (the step query is unsat with a fresh solver)")
        return ExitCode.OK
    print(f"{args.certificate}: certificate does NOT hold (the fresh solver says {result})")
    return ExitCode.VIOLATED if result == "sat" else ExitCode.INCONCLUSIVE


def _check_log(args: argparse.Namespace) -> int:
    from checker.api import run_check_log

    steps, chosen, violation, notes, conf = run_check_log(args.policy, args.log, args.arrivals, args.invariant,
                                                          args.conformance)
    names = ", ".join(inv.name for inv, _ in chosen)
    for note in notes[:5]:
        print(f"note: {note}")
    code = ExitCode.OK
    if violation is None:
        print(f"{args.log}: {steps} steps, no violation of {names}")
    else:
        print(f"{args.log}: {violation.invariant} VIOLATED at step {violation.step} (log line {violation.line})")
        for line in violation.context:
            print(f"  {line}")
        code = ExitCode.VIOLATED
    if conf is not None:
        print(f"conformance with the engine under {args.policy}: {conf.agreeing}/{conf.steps} steps agree "
              f"({100 * conf.share:.1f} %)")
        if conf.first_divergence is not None:
            print(f"  first divergence: {conf.detail}")
            code = ExitCode.VIOLATED
    return code


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="batchcheck",
        description="Prove or refute properties of LLM-serving batch schedulers before canary.",
        epilog="Exit codes: 0 ok, 1 property violated, 2 usage or input error, 3 inconclusive, "
               "101 internal error (a bug in batchcheck).")
    parser.add_argument("--version", action="version", version=f"batchcheck {__version__}")
    verbs = parser.add_subparsers(dest="verb", required=True, metavar="VERB")

    p = verbs.add_parser("schema", help="print the JSON Schema of an input file kind")
    p.add_argument("--kind", choices=KINDS, default="policy")
    p.set_defaults(run=_schema)

    p = verbs.add_parser("validate", help="validate policy / workload / trace / profile files")
    p.add_argument("files", nargs="+", metavar="FILE")
    p.add_argument("--kind", choices=KINDS, default=None, help="default: guessed from the file")
    p.set_defaults(run=_validate)

    p = verbs.add_parser("simulate", help="run the reference engine on a workload or trace")
    p.add_argument("policy", metavar="POLICY")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--workload", metavar="FILE", help="workload spec (YAML)")
    source.add_argument("--trace", metavar="FILE", help="trace: batchcheck JSON, Azure CSV or Mooncake JSONL")
    p.add_argument("--profile", metavar="FILE", help="service-curve profile (default: spec/profiles/default_linear.json)")
    p.add_argument("--limit", type=int, metavar="N", help="only the first N requests")
    _trace_options(p)
    p.add_argument("--json", action="store_true", help="print the metrics as JSON")
    p.set_defaults(run=_simulate)

    p = verbs.add_parser("verify", help="check invariants of a policy with z3 (bounded model checking)",
                         description="Exit 0: every invariant holds within the bounds; 1: one is violated "
                                     "(counterexample replayed and saved); 3: a check was inconclusive or vacuous.")
    p.add_argument("policy", metavar="POLICY")
    p.add_argument("--invariant", action="append", metavar="NAME[:PARAMS]",
                   help="e.g. kv_never_overcommitted, decode_progress:gap=2 (repeatable; default: the four safety invariants)")
    p.add_argument("--invariant-module", action="append", metavar="MODULE",
                   help="load user invariants from a module or .py file with an INVARIANTS list (repeatable)")
    p.add_argument("--requests", type=int, default=3, metavar="N", help="request slots (default 3)")
    p.add_argument("--depth", type=int, default=5, metavar="K", help="iterations (default 5)")
    p.add_argument("--timeout", type=float, default=60.0, metavar="S", help="seconds per invariant (default 60)")
    p.add_argument("--workload", metavar="FILE", help="take length ranges, priorities and tenants from a workload")
    p.add_argument("--prompt-range", type=_range, metavar="LOW:HIGH", help="prompt tokens (default 1:max_model_len)")
    p.add_argument("--output-range", type=_range, metavar="LOW:HIGH", help="output tokens (default 1:2K)")
    p.add_argument("--no-cancellations", action="store_true", help="clients never cancel")
    p.add_argument("--step-ms", type=float, default=10.0, metavar="MS", help="clock: ms per iteration (default 10)")
    p.add_argument("--unbounded", action="store_true",
                   help="after the bounded check, try to prove the invariant for any number of iterations (induction)")
    p.add_argument("--proof-dir", default="proofs", metavar="DIR", help="where proof certificates go (default proofs/)")
    p.add_argument("--out", default="counterexamples", metavar="DIR", help="where counterexamples go (default counterexamples/)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=_verify)

    p = verbs.add_parser("recheck", help="verify a PROVED verdict's certificate with a fresh solver",
                         description="Exit 0: the certificate holds; 1: it does not; 3: the solver could not decide.")
    p.add_argument("certificate", metavar="FILE.smt2")
    p.set_defaults(run=_recheck)

    p = verbs.add_parser("replay", help="re-run a counterexample on the engine, iteration by iteration",
                         description="Exit 1 while the policy still fails on the trace, 0 once it does not.")
    p.add_argument("counterexample", metavar="FILE")
    p.add_argument("--policy", metavar="POLICY", help="replay under this policy instead of the recorded one")
    p.set_defaults(run=_replay)

    p = verbs.add_parser("audit", help="integer fluid capacity audit of a batching contract and a workload",
                         description="Exit 0: within the declared bounds; 1: a bound fails (named); 2: bad input.")
    p.add_argument("contract", nargs="?", metavar="CONTRACT", help="audit contract record (YAML)")
    p.add_argument("workload", nargs="?", metavar="WORKLOAD", help="audit workload record written for CONTRACT")
    p.add_argument("--policy", metavar="FILE", help="derived form: the policy the contract is derived from")
    p.add_argument("--profile", metavar="FILE", help="derived form: service-curve profile (default: "
                   "spec/profiles/default_linear.json)")
    p.add_argument("--workload", dest="derive_workload", metavar="FILE", help="derived form: batchcheck workload")
    for slo in ("queue", "ttft", "tpot"):
        p.add_argument(f"--{slo}-slo-ms", type=int, metavar="MS", help=f"derived form: {slo.upper()} bound in ms")
    p.add_argument("--json", action="store_true", help="print every figure as JSON")
    p.set_defaults(run=_audit)
    p = verbs.add_parser("check-log", help="check the invariants on a real scheduler's per-step log",
                         description="Exit 1 at the first violating step (or, with --conformance, when the log "
                                     "diverges from the engine); 0 otherwise. Format: docs/check-log.md.")
    p.add_argument("policy", metavar="POLICY")
    p.add_argument("log", metavar="LOG.jsonl")
    p.add_argument("--arrivals", required=True, metavar="FILE", help="JSON list of {id, arrival_step, prompt_tokens, "
                   "output_tokens, priority, abort_step?}")
    p.add_argument("--invariant", action="append", metavar="NAME[:PARAMS]",
                   help="repeatable; default: the four safety invariants")
    p.add_argument("--conformance", action="store_true", help="also compare the log with the engine, step by step")
    p.set_defaults(run=_check_log)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    run: Callable[[argparse.Namespace], int] = args.run
    try:
        return int(run(args))
    except BatchcheckError as exc:
        print(f"batchcheck: error: {exc}", file=sys.stderr)
        return int(exc.exit_code)
    except KeyboardInterrupt:
        print("batchcheck: interrupted", file=sys.stderr)
        return int(ExitCode.INCONCLUSIVE)
    except BrokenPipeError:
        return int(ExitCode.OK)
    except Exception as exc:  # a bug: say so plainly, no traceback unless asked for
        if os.environ.get("BATCHCHECK_DEBUG"):
            raise
        print(f"batchcheck: internal error (a bug in batchcheck; rerun with BATCHCHECK_DEBUG=1 for "
              f"the traceback and please report it): {type(exc).__name__}: {exc}", file=sys.stderr)
        return int(ExitCode.INTERNAL_ERROR)


if __name__ == "__main__":
    sys.exit(main())

