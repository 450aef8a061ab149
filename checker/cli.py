"""The batchcheck command line: a thin shell over the library API.

Exit codes (checker.exitcodes, docs/cli.md): 0 ok, 1 violated, 2 usage or input error,
3 inconclusive, 101 internal error.
"""

from __future__ import annotations

import argparse
import functools
import gc
import importlib
import json
import os
import sys
from collections.abc import Callable

from checker import __version__
from checker.commands.fleet import jobs_flags, policy_or_fleet
from checker.commands.interrupt import Interrupts, ctrl_c_stops_solving
from checker.commands.shell import (DEPTH, EXAMPLES, MAX_COUNT, MAX_TOKENS, SECONDS, SEED, SLOTS, STEP_MS, flag_type,
                                    int_range, number, terminal_progress, trace_option_flags, trace_options_for,
                                    trace_options_from)
from checker.errors import BatchcheckError
from checker.exitcodes import ExitCode

# Modules that add their own verbs (a function register(verbs) taking the subparsers object; each
# handler returns an exit code). One line per module; keep cli.py a thin shell.
VERB_MODULES: list[str] = [
    "checker.commands.report",
    "checker.commands.liveness",
    "checker.commands.diff",
    "checker.commands.ci",
    "checker.commands.calibrate",
    "checker.commands.metrics",
    "checker.commands.fleet",
    "checker.commands.sweep",
]

KINDS = ("policy", "workload", "trace", "profile", "audit-contract", "audit-workload", "slo", "fleet")


def _schema(args: argparse.Namespace) -> int:
    from checker.api import json_schema

    print(json.dumps(json_schema(args.kind), indent=2))
    return ExitCode.OK


def _validate(args: argparse.Namespace) -> int:
    """Every file is checked (a bad one does not hide the ones after it); exit 2 if any is bad. With --json, one
    document on stdout (docs/schemas/validate.schema.json); the error lines still go to stderr."""
    from checker.api import validate_file
    from checker.errors import InputError, UsageError

    bad, files = 0, []
    for path in args.files:
        try:
            kind = validate_file(path, args.kind)
        except (InputError, UsageError) as exc:
            bad += 1
            print(f"batchcheck: error: {exc}", file=sys.stderr)
            files.append(_invalid_file_json(path, args.kind, exc))
            continue
        files.append({"path": path, "kind": kind, "valid": True, "problems": []})
        if not args.json:
            print(f"{path}: valid {kind}")
    if bad and len(args.files) > 1:
        print(f"batchcheck: {bad} of {len(args.files)} files are not valid", file=sys.stderr)
    code = ExitCode.INPUT_ERROR if bad else ExitCode.OK
    if args.json:
        print(json.dumps({"files": files, "valid": len(files) - bad, "invalid": bad, "exit_code": int(code)}, indent=1))
    return code


def _invalid_file_json(path: str, kind: str | None, exc: BatchcheckError) -> dict:
    """validate --json's entry for a bad file: the kind it was read as (null where none could be told) and each
    located problem of the error message, one object each (a UsageError has no Problem: its text is the one)."""
    import math

    from checker.api import guess_kind
    from checker.errors import _show
    from checker.loading import load_document

    if kind is None:
        try:
            kind = guess_kind(path, None if path.endswith(".csv") else load_document(path)[0])
        except BatchcheckError:
            kind = None
    problems = []
    for p in getattr(exc, "problems", None) or []:
        v = p.value
        scalar = v is None or isinstance(v, (bool, int)) or (isinstance(v, float) and math.isfinite(v)) or \
            (isinstance(v, str) and len(v) <= 200)
        problems.append({"file": exc.source or path, "line": p.line, "field": p.path,
                         "value": v if scalar else _show(v), "expected": p.expected, "message": p.render(exc.source)})
    if not problems:
        problems.append({"file": path, "line": None, "field": "", "value": None, "expected": None, "message": str(exc)})
    return {"path": path, "kind": kind, "valid": False, "problems": problems}


_LIMIT = number(int, 1, MAX_COUNT)
_MS = number(int, 0, MAX_COUNT, unit="ms")
_FUZZ_REQUESTS = number(int, 1, 100_000)
DEFAULT_DATABASE = ".batchcheck/hypothesis"  # fuzz's Hypothesis example database


def _simulate(args: argparse.Namespace) -> int:
    from checker.api import run_simulation
    from checker.errors import UsageError
    from checker.report import format_summary

    if args.fleet is not None:  # the fleet verb's run (checker/commands/fleet.py)
        from checker.commands.fleet import simulate_fleet

        return simulate_fleet(args)
    if args.policy is None:
        raise UsageError("simulate needs POLICY (or --fleet FLEET.yaml)")
    if args.workload is None and args.trace is None:
        raise UsageError("simulate POLICY needs --workload FILE or --trace FILE")

    result = run_simulation(args.policy, workload=args.workload, trace=args.trace, profile=args.profile,
                            limit=args.limit, options=trace_options_from(args), record=args.plot is not None)
    if args.plot is not None:
        from checker.api import write_run_plot

        write_run_plot(result, args.plot)
    from checker.calibrate.coverage import extrapolation_notes

    for note in extrapolation_notes(result.policy, result.profile):  # never silent (docs/calibration.md)
        print(f"batchcheck: {note}", file=sys.stderr)
    summary = result.summary()
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print(format_summary(summary))
    engine = summary["engine"]
    # requests left that nothing could finish (a deadlock) or a suspected livelock: the run failed (exit 1)
    return ExitCode.VIOLATED if engine["stuck_requests"] or engine["livelock_suspected"] else ExitCode.OK


def _audit(args: argparse.Namespace) -> int:
    from checker.api import run_audit, run_derived_audit
    from checker.errors import UsageError

    derived = [flag for flag, value in (("--policy", args.policy), ("--profile", args.profile),
                                        ("--workload", args.derive_workload), ("--trace", args.trace),
                                        ("--queue-slo-ms", args.queue_slo_ms),
                                        ("--ttft-slo-ms", args.ttft_slo_ms), ("--tpot-slo-ms", args.tpot_slo_ms))
               if value is not None]
    records = [path for path in (args.contract, args.workload) if path is not None]
    if records and derived:
        raise UsageError(f"give either CONTRACT WORKLOAD or --policy/--profile/--workload, not both "
                         f"(got {records[0]} and {derived[0]})")
    options = trace_options_for(args, args.trace, "--trace FILE")
    if derived:
        if args.derive_workload is not None and args.trace is not None:
            raise UsageError(f"give --workload or --trace, not both (got {args.derive_workload} and {args.trace})")
        if args.policy is None or (args.derive_workload is None and args.trace is None):
            raise UsageError("the derived form needs --policy FILE and --workload FILE or --trace FILE "
                             "(--profile is optional)")
        result = run_derived_audit(args.policy, args.derive_workload, args.profile, queue_slo_ms=args.queue_slo_ms,
                                   ttft_slo_ms=args.ttft_slo_ms, tpot_slo_ms=args.tpot_slo_ms, trace=args.trace,
                                   trace_options=options)
    elif len(records) == 2:
        result = run_audit(args.contract, args.workload)
    else:
        raise UsageError("give CONTRACT WORKLOAD (audit records) or --policy FILE --workload FILE [--profile FILE]")
    code = ExitCode.OK if result.failure is None else ExitCode.VIOLATED
    print(json.dumps({**result.as_json(), "exit_code": int(code)}, indent=2) if args.json else result.text())
    return code


# verify's options that the bounded check reads and verify --liveness does not
_BMC_ONLY = ("invariant", "invariant_module", "depth", "workload", "no_audit", "prompt_range", "output_range",
             "no_cancellations", "unbounded", "bounded_only", "proof_dir", "cache_method", "split_vacuous",
             "any_n", "temporal_induction")


def _verify(args: argparse.Namespace) -> int:
    from checker.api import run_verify
    from checker.commands import liveness as liveness_cli
    from checker.errors import UsageError
    from checker.verify.run import overall_exit

    parser = args.verify_parser
    if args.liveness:  # the liveness verb's check, output and exit codes (docs/liveness.md)
        given = [name for name in _BMC_ONLY if getattr(args, name) != parser.get_default(name)]
        if given:
            raise UsageError(f"--{given[0].replace('_', '-')} is not an option of verify --liveness (liveness "
                             f"options: --requests, --step-ms, --timeout, --out, --json, --property, --prompts, "
                             f"--identities, --external, --accepted, --outputs, --priorities, --tenants, --cancellations, "
                             f"--arrivals-per-step, "
                             f"--set, --max-states, --jobs)")
        args.requests = 2 if args.requests is None else args.requests
        args.out = "counterexamples" if args.out is None else args.out
        return liveness_cli.run(args)
    given = [name for name in liveness_cli.INSTANCE_OPTIONS if getattr(args, name) != parser.get_default(name)]
    if given:
        raise UsageError(f"--{given[0].replace('_', '-')} needs --liveness (it describes a liveness instance)")
    args.requests = 3 if args.requests is None else args.requests
    if args.any_n and args.unbounded:
        raise UsageError("--any-n and --unbounded are two proofs: give one (--any-n: any number of requests; "
                         "--unbounded: N slots)")
    if args.any_n and args.bounded_only:
        raise UsageError("--any-n and --bounded-only contradict each other (--any-n is a proof; --bounded-only runs "
                         "the bounded search alone)")
    if args.workload is not None and not args.no_audit:  # an impossible plan stops here, before any solver call
        from checker.api import run_derived_audit

        audit = run_derived_audit(args.policy, args.workload)
        if audit.failure is not None:
            if args.json:
                print(json.dumps({"policy": args.policy, "stopped_by_audit": audit.as_json(),
                                  "exit_code": int(ExitCode.VIOLATED)}, indent=2))
            else:
                print(f"AUDIT        {audit.decision_line()}")
                print(f"the plan is impossible under {args.workload}'s declared load (batchcheck audit --policy "
                      f"{args.policy} --workload {args.workload}); invariants not checked (--no-audit checks them "
                      "anyway: the solver uses only the workload's length ranges, priorities and tenants)")
            return ExitCode.VIOLATED

    if args.unbounded and args.bounded_only:
        raise UsageError("--unbounded and --bounded-only contradict each other (the proof is tried by default; "
                         "--bounded-only runs the bounded search alone)")
    out, proof_dir = verify_dirs(args.out, args.proof_dir)
    env, results = run_verify(args.policy, args.invariant, args.requests, args.depth, args.timeout, args.workload,
                              out, args.prompt_range, args.output_range, not args.no_cancellations, args.step_ms,
                              True if args.unbounded else False if args.bounded_only else None, proof_dir,
                              args.invariant_module, terminal_progress(), cache_method=args.cache_method,
                              any_n=args.any_n, temporal_induction=args.temporal_induction)
    terminal_progress.clear()
    code = overall_exit(results, args.split_vacuous)
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


def verify_dirs(out: str | None, proof_dir: str | None) -> tuple[str, str]:
    """verify's counterexample and certificate folders: --out DIR (default counterexamples/) and --proof-dir,
    whose default is DIR/proofs/ when --out is given (so that a run with --out writes nothing elsewhere), else
    proofs/ (as before)."""
    if proof_dir is None:
        proof_dir = os.path.join(out, "proofs") if out is not None else "proofs"
    return out if out is not None else "counterexamples", proof_dir


def _replay(args: argparse.Namespace) -> int:
    from checker.api import replay_outcome

    outcome = replay_outcome(args.counterexample, args.policy, args.invariant_module)
    code = ExitCode.VIOLATED if outcome.violated else ExitCode.OK
    print(json.dumps({**outcome.as_dict(), "exit_code": int(code)}, indent=1) if args.json else outcome.text)
    return code


def _recheck(args: argparse.Namespace) -> int:
    from checker.api import recheck_certificate

    r = recheck_certificate(args.certificate, args.policy, args.invariant, args.requests, args.invariant_module)
    result, queries = r.solver, r.queries
    code = ExitCode.OK if result == "unsat" else ExitCode.VIOLATED if result == "sat" else ExitCode.INCONCLUSIVE
    if args.json:
        print(json.dumps({"certificate": str(args.certificate), "holds": result == "unsat", "solver": result,
                          "queries": queries, "binding": {key: getattr(r.binding, key) for key in (
                              "policy", "policy_sha256", "invariant", "params", "requests", "kv_blocks", "method", "k")},
                          "checked": r.checked, "not_checked": r.not_checked, "exit_code": int(code)}, indent=1))
        return code
    if result == "unsat":
        what = "the step query is" if queries == 1 else f"each of its {queries} queries (one per scheduler action) is"
        print(f"{args.certificate}: certificate holds ({what} unsat with a fresh solver)")
    else:
        print(f"{args.certificate}: certificate does NOT hold (the fresh solver says {result})")
    b = r.binding
    print(f"  bound to: policy {b.policy} (sha256 {b.policy_sha256[:12]}), {b.invariant}"
          + "".join(f" {k}={v}" for k, v in sorted(b.params.items())) + (", any N" if b.method == "any-n" else f", N={b.requests}") + f", {b.method}"
          + (f" k={b.k}" if b.method == "induction" else ""))
    for line in r.checked:
        print(f"  checked: {line}")
    for line in r.not_checked:
        print(f"  not checked: {line}")
    return code


def _fuzz(args: argparse.Namespace) -> int:
    from checker.api import run_fuzz
    from checker.errors import UsageError

    if args.fleet is not None:  # the fleet verb's search (checker/commands/fleet.py)
        from checker.commands.fleet import fuzz_fleet

        return fuzz_fleet(args)
    if args.policy is None:
        raise UsageError("fuzz needs POLICY (or --fleet FLEET.yaml)")
    if args.jobs or args.scheduler:
        raise UsageError("--jobs and --scheduler spread fuzz --fleet's property searches: fuzz POLICY runs its "
                         "search in this process")
    if args.workload is None:
        raise UsageError("--seed-trace needs --workload FILE (the classes and length ranges the seeds map onto)"
                         if args.seed_trace is not None else "fuzz needs --workload FILE")
    database = {None: DEFAULT_DATABASE, "none": None}.get(args.database, args.database)
    results = run_fuzz(args.policy, args.workload, args.slo, args.property, args.max_examples, args.time_budget,
                       args.seed, args.profile, args.out, database, args.max_requests, args.stress,
                       terminal_progress(), args.seed_trace, trace_options_for(args, args.seed_trace, "--seed-trace TRACE"),
                       args.seed_windows)
    terminal_progress.clear()
    code = ExitCode.VIOLATED if any(r.violated for r in results) else ExitCode.OK
    if args.json:
        print(json.dumps({"policy": str(args.policy), "workload": str(args.workload),
                          "notes": results[0].seed_notes if results else [],
                          "results": [_fuzz_json(r) for r in results], "exit_code": int(code)}, indent=1))
        return code
    for note in results[0].seed_notes if results else []:
        print(f"note: {note}")
    for r in results:
        print(r.line())
    return code


def _fuzz_json(r) -> dict:
    o = r.outcome
    return {"property": r.prop.name, "kind": r.prop.kind, "verdict": "VIOLATED" if r.violated else "NO_COUNTEREXAMPLE",
            "examples": r.examples, "seconds": round(r.seconds, 3), "requests": len(r.trace) if r.violated else None,
            "observed": None if o is None else o.observed, "allowed": None if o is None else o.allowed,
            "counterexample": None if r.counterexample is None else str(r.counterexample),
            "shrink_stopped": r.shrink_stopped}


def _check_log(args: argparse.Namespace) -> int:
    from checker.api import run_check_log

    def progress(r) -> None:  # --follow: the verdict so far, about once a second
        conf = r.conformance
        agree = "" if conf is None else f"; conformance {conf.agreeing}/{conf.steps} steps agree"
        print(f"following {args.log}: {r.steps} steps, {r.done}/{r.requests} requests done, no violation{agree}"
              + ("" if conf is None or conf.first_divergence is None else f"; first divergence at step "
                 f"{conf.first_divergence}"), flush=True)

    if args.follow_idle_s is not None and not args.follow:
        from checker.errors import UsageError

        raise UsageError("--follow-idle-s goes with --follow")
    idle_s = 10.0 if args.follow_idle_s is None else args.follow_idle_s
    r = run_check_log(args.policy, args.log, args.arrivals, args.invariant, args.conformance, follow=args.follow,
                      follow_idle_s=idle_s,
                      progress=progress if args.follow else None)
    names = ", ".join(inv.name for inv, _ in r.invariants)
    violation, conf = r.violation, r.conformance
    diverged = conf is not None and conf.first_divergence is not None
    code = ExitCode.VIOLATED if violation is not None or diverged else ExitCode.OK
    if args.json:
        print(json.dumps({
            "log": str(args.log), "steps": r.steps, "requests": r.requests, "done": r.done,
            "invariants": [inv.name for inv, _ in r.invariants], "notes": r.notes[:5], "notes_total": r.notes_total,
            "violation": None if violation is None else {"invariant": violation.invariant, "step": violation.step,
                                                         "line": violation.line, "context": violation.context},
            "conformance": None if conf is None else {"steps": conf.steps, "agreeing": conf.agreeing,
                                                      "first_divergence": conf.first_divergence,
                                                      "detail": conf.detail or None},
            "stopped": r.stopped, "exit_code": int(code)}, indent=1))
        return code
    for note in r.notes[:5]:
        print(f"note: {note}")
    if violation is None:
        print(f"{args.log}: {r.steps} steps, no violation of {names}")
    else:
        print(f"{args.log}: {violation.invariant} VIOLATED at step {violation.step} (log line {violation.line})")
        for line in violation.context:
            print(f"  {line}")
    if conf is not None:
        print(f"conformance with the engine under {args.policy}: {conf.agreeing}/{conf.steps} steps agree "
              f"({100 * conf.share:.1f} %)")
        if diverged:
            print(f"  first divergence: {conf.detail}")
    if r.stopped == "idle":
        print(f"stopped following {args.log}: no new line for {idle_s:g} s "
              f"({r.done}/{r.requests} requests done)")
    elif r.stopped == "finished":
        print(f"stopped following {args.log}: all {r.requests} requests finished or aborted")
    return code


def _import(args: argparse.Namespace) -> int:
    from checker.api import run_import
    from checker.errors import UsageError
    from checker.importers import OWN_OPTIONS, split_options

    if any(a in ("-h", "--help") for a in args.args):  # after SYSTEM, argparse would pass it on
        print(args.import_help())
        print(f"\nThe options of {args.system} that batchcheck reads: docs/importers.md")
        return ExitCode.OK
    own, system_args = split_options(args.args)
    if "--json" in system_args:  # batchcheck's flag, after SYSTEM (no supported system has one of that name)
        system_args = [a for a in system_args if a != "--json"]
        args.json = True
    options = {key: getattr(args, key) for key, _ in OWN_OPTIONS.values() if getattr(args, key) is not None}
    if args.ignore_unknown:
        options["ignore_unknown"] = True
    for key in (set(options) & set(own)) - {"ignore_unknown"}:  # a switch given twice is still on
        raise UsageError(f"--{key.replace('_', '-')} given twice (before and after {args.system})")
    options.update(own)
    result = run_import(args.system, system_args, **options)
    if args.json:
        print(json.dumps({"system": result.system, "policy": result.policy.model_dump(mode="json"),
                          "assumed": result.assumed, "approximated": result.approximated, "ignored": result.ignored,
                          "out": options.get("out")}, indent=1))
        return ExitCode.OK
    for note in result.notes():
        print(f"batchcheck: {note}", file=sys.stderr)
    if options.get("out") is None:
        sys.stdout.write(result.text)
    else:
        print(f"{options['out']}: policy imported from {args.system}")
    return ExitCode.OK


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
    p.add_argument("--json", action="store_true", help="print each file's result (and its problems) as JSON")
    p.set_defaults(run=_validate)

    p = verbs.add_parser("simulate", help="run the reference engine on a workload or trace",
                         description="Runs POLICY on the requests; with --fleet FLEET.yaml (and no POLICY), runs them "
                                     "through a fleet as `batchcheck fleet FLEET` does (docs/fleet.md).")
    policy_or_fleet(p, "run a fleet file instead of one policy (the requests: --workload/--trace, default the "
                       "fleet file's)")
    source = p.add_mutually_exclusive_group()
    source.add_argument("--workload", metavar="FILE", help="workload spec (YAML)")
    source.add_argument("--trace", metavar="FILE", help="trace: batchcheck JSON, Azure CSV or Mooncake JSONL")
    p.add_argument("--profile", metavar="FILE", help="service-curve profile (default: spec/profiles/default_linear.json)")
    p.add_argument("--limit", type=_LIMIT, metavar="N", help="only the first N requests")
    trace_option_flags(p)
    p.add_argument("--json", action="store_true", help="print the metrics as JSON")
    p.add_argument("--plot", metavar="FILE.png", help="also write the run's timeline as a PNG (docs/report.md)")
    p.set_defaults(run=_simulate)

    p = verbs.add_parser("import", help="turn a real server's scheduler configuration into a policy",
                         description="Import vLLM, SGLang or TGI server arguments, a TensorRT-LLM LLM-API YAML or "
                                     "a Triton config.pbtxt as a policy (docs/importers.md). Everything after SYSTEM "
                                     "goes to SYSTEM (its arguments look like flags; a -- is optional), except "
                                     "batchcheck's own options below, which may come before or after SYSTEM. "
                                     "Defaults filled in are listed on stderr as 'assumed'. Exit 2: an option the "
                                     "policy model cannot express, or an unknown one (every one of them is listed).")
    p.add_argument("system", choices=("vllm", "sglang", "tgi", "trtllm", "triton"), metavar="SYSTEM",
                   help="vllm, sglang, tgi, trtllm or triton")
    p.add_argument("args", nargs=argparse.REMAINDER, metavar="ARGS", help="SYSTEM's own arguments")
    p.add_argument("--out", metavar="FILE", help="write the policy here (atomically) instead of to stdout")
    p.add_argument("--json", action="store_true", help="print the policy and the assumed / approximated / ignored "
                   "notes as JSON on stdout (with --out the file is written too)")
    p.add_argument("--name", metavar="NAME", help="policy name (default: the file name)")
    p.add_argument("--config", metavar="FILE", help="vLLM YAML config, TensorRT-LLM LLM-API YAML or Triton config.pbtxt")
    p.add_argument("--vllm-version", metavar="X.Y", help="vllm: the version whose semantics and defaults apply "
                   "(default 0.33; < 0.8 is the V0 scheduler)")
    p.add_argument("--usage-context", choices=("api-server", "llm-class"), help="vllm: whose defaults (default "
                   "api-server, i.e. vllm serve)")
    p.add_argument("--rules", choices=("vllm", "sglang"), help="sglang: whose rules the policy follows: vllm "
                   "(default: SGLang mapped onto the vLLM-shaped rule sections, approximating its admission estimate "
                   "and retraction) or sglang (the engine's own SGLang rules, scheduler: sglang; needs "
                   "--disable-radix-cache)")
    from checker.importers import GIB, KV_BYTES, OVERHEAD_GIB

    p.add_argument("--gpu-memory-gib", type=flag_type(GIB), metavar="GIB", help="machine: memory of one GPU")
    p.add_argument("--model-weights-gib", type=flag_type(GIB), metavar="GIB", help="machine: the model's weights (all GPUs)")
    p.add_argument("--kv-bytes-per-token", type=flag_type(KV_BYTES), metavar="BYTES", help="machine: KV bytes per token, all layers")
    p.add_argument("--overhead-gib", type=flag_type(OVERHEAD_GIB), metavar="GIB", help="machine: activations and other memory per GPU "
                   "(default 0)")
    p.add_argument("--profile", metavar="FILE", help="machine: take KV bytes per token from this profile's model shape")
    p.add_argument("--ignore-unknown", action="store_true", help="leave out the options batchcheck does not know, "
                   "each listed as 'ignored:' (a known option that can change scheduling is still refused)")
    p.set_defaults(run=_import, import_help=p.format_help)

    p = verbs.add_parser("verify", help="check invariants of a policy with z3 (bounded model checking)",
                         description="Exit 0: every invariant holds within the bounds; 1: one is violated "
                                     "(counterexample replayed and saved); 3: a check was inconclusive or vacuous.")
    p.add_argument("policy", metavar="POLICY")
    p.add_argument("--invariant", action="append", metavar="NAME[:PARAMS]",
                   help="e.g. kv_never_overcommitted, decode_progress:gap=2 (repeatable; default: the four safety invariants)")
    p.add_argument("--invariant-module", action="append", metavar="MODULE",
                   help="load user invariants from a module or .py file with an INVARIANTS list (repeatable)")
    p.add_argument("--requests", type=SLOTS, metavar="N", help="request slots (default 3; with --liveness: requests "
                   "in the system at once, default 2)")
    p.add_argument("--depth", type=DEPTH, default=5, metavar="K", help="iterations (default 5)")
    p.add_argument("--timeout", type=SECONDS, default=60.0, metavar="S", help="seconds per invariant (default 60)")
    p.add_argument("--workload", metavar="FILE", help="take length ranges, priorities and tenants from a workload "
                   "(the capacity audit runs first and stops on an impossible plan)")
    p.add_argument("--no-audit", action="store_true", help="with --workload: skip the capacity audit")
    p.add_argument("--prompt-range", type=int_range, metavar="LOW:HIGH", help="prompt tokens (default 1:max_model_len)")
    p.add_argument("--output-range", type=int_range, metavar="LOW:HIGH", help="output tokens (default 1:2K)")
    p.add_argument("--no-cancellations", action="store_true", help="clients never cancel")
    p.add_argument("--step-ms", type=STEP_MS, default=10.0, metavar="MS", help="clock: ms per iteration (default 10)")
    p.add_argument("--unbounded", action="store_true",
                   help="the proof for any number of iterations first (action-wise induction), then the bounded "
                        "search, then whole-step induction: the default where a proof method covers the policy "
                        "(given, a policy none covers is refused: prefix caching, SGLang, a KV connector)")
    p.add_argument("--bounded-only", action="store_true",
                   help="the bounded search alone (N requests, K iterations: HOLDS_UP_TO at best), no proof")
    p.add_argument("--any-n", action="store_true",
                   help="prove the state invariants for any number of requests and iterations, on the policy's own "
                        "pool (aggregate abstraction, docs/invariants.md); a policy rule it does not cover is refused")
    p.add_argument("--temporal-induction", action="store_true",
                   help="prove the windowed temporal invariants (decode_progress, cancellation_releases, "
                        "bounded_starvation; windows up to 8) for N slots by k-induction, the bounded search at least "
                        "as deep as its base case (docs/invariants.md); off by default (it costs seconds to minutes)")
    p.add_argument("--split-vacuous", action="store_true", help="exit 4 instead of 3 when the only undecided "
                   "checks are VACUOUS ones whose situation is proved never to occur at any depth (those not "
                   "reached within the bounds still exit 3)")
    p.add_argument("--proof-dir", metavar="DIR", help="where proof certificates go (default: DIR/proofs/ with --out "
                   "DIR, else proofs/)")
    p.add_argument("--cache-method", choices=("explicit", "z3"), default="explicit",
                   help="a policy with prefix caching or under scheduler sglang: explicit-state search on the engine "
                        "(default) or z3 bounded model checking (the block pool, small pools; SGLang's rules with the "
                        "radix cache off)")
    p.add_argument("--out", metavar="DIR", help="where counterexamples go (default counterexamples/), and "
                   "certificates under DIR/proofs/ unless --proof-dir")
    p.add_argument("--json", action="store_true")
    from checker.commands import liveness as liveness_cli  # the liveness verb's instance options, defined once

    live = p.add_argument_group("liveness", "--liveness runs `batchcheck liveness` instead of the bounded check: "
                                "the same state graph, output, exit codes and lasso files (docs/liveness.md)")
    live.add_argument("--liveness", action="store_true", help="check eventually_served, no_livelock and no_deadlock "
                      "on the explicit state graph of a small instance")
    liveness_cli.add_instance_arguments(live)
    p.set_defaults(run=_verify, verify_parser=p)

    p = verbs.add_parser("recheck", help="verify a PROVED verdict's certificate with a fresh solver",
                         description="Exit 0: the certificate holds; 1: it does not; 3: the solver could not decide; 2: it is "
                                     "refused (no binding, edited, made for another policy, invariant or N than the "
                                     "ones given, or unsat by itself).")
    p.add_argument("certificate", metavar="FILE.smt2")
    p.add_argument("--policy", metavar="POLICY", help="the policy it must certify: its hash is compared with the "
                   "certificate's, and a whole-step induction query is rebuilt from it and compared")
    p.add_argument("--invariant", metavar="NAME[:PARAMS]", help="the invariant it must certify")
    p.add_argument("--requests", type=SLOTS, metavar="N", help="the request slots it must certify")
    p.add_argument("--invariant-module", action="append", metavar="MODULE",
                   help="load user invariants (to rebuild a query of one)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(run=_recheck)

    p = verbs.add_parser("replay", help="re-run a counterexample on the engine, iteration by iteration",
                         description="Exit 1 while the policy still fails on the trace, 0 once it does not.")
    p.add_argument("counterexample", metavar="FILE")
    p.add_argument("--policy", metavar="POLICY", help="replay under this policy instead of the recorded one")
    p.add_argument("--invariant-module", action="append", metavar="MODULE", help="load user invariants (default: "
                   "the module the counterexample records)")
    p.add_argument("--json", action="store_true", help="print the replay (every iteration, the verdict) as JSON")
    p.set_defaults(run=_replay)

    p = verbs.add_parser("audit", help="integer fluid capacity audit of a batching contract and a workload",
                         description="Exit 0: within the declared bounds; 1: a bound fails (named); 2: bad input.")
    p.add_argument("contract", nargs="?", metavar="CONTRACT", help="audit contract record (YAML)")
    p.add_argument("workload", nargs="?", metavar="WORKLOAD", help="audit workload record written for CONTRACT")
    p.add_argument("--policy", metavar="FILE", help="derived form: the policy the contract is derived from")
    p.add_argument("--profile", metavar="FILE", help="derived form: service-curve profile (default: "
                   "spec/profiles/default_linear.json)")
    p.add_argument("--workload", dest="derive_workload", metavar="FILE", help="derived form: batchcheck workload")
    p.add_argument("--trace", metavar="FILE", help="derived form: class rates from a real trace instead (Azure CSV, "
                   "Mooncake JSONL or JSON trace; docs/audit.md)")
    trace_option_flags(p)
    for slo in ("queue", "ttft", "tpot"):
        p.add_argument(f"--{slo}-slo-ms", type=_MS, metavar="MS", help=f"derived form: {slo.upper()} bound in ms")
    p.add_argument("--json", action="store_true", help="print every figure as JSON")
    p.set_defaults(run=_audit)
    p = verbs.add_parser("fuzz", help="search adversarial traces for SLO violations (Hypothesis), shrink, replay",
                         description="Exit 1 if a property is violated (minimal trace saved), 0 if no "
                                     "counterexample was found in the examples run (a search, not a proof).")
    policy_or_fleet(p, "search a fleet file instead of one policy: arrivals and faults, as `batchcheck fleet FLEET "
                       "--search` (docs/fleet.md)")
    p.add_argument("--workload", metavar="FILE", help="workload spec (required without --fleet)")
    p.add_argument("--slo", metavar="FILE", help="SLO properties (default: NAME.slo.yaml next to the workload)")
    p.add_argument("--seed-trace", metavar="TRACE", help="seed the search with a real trace's busiest windows "
                   "(Azure CSV, Mooncake JSONL or JSON trace; docs/fuzz.md)")
    p.add_argument("--seed-windows", type=number(int, 1, 10_000), default=20, metavar="N",
                   help="with --seed-trace: how many windows run first (default 20, busiest first)")
    trace_option_flags(p)
    p.add_argument("--property", action="append", metavar="NAME", help="only these properties (repeatable)")
    p.add_argument("--max-examples", type=EXAMPLES, default=200, metavar="N", help="examples per property (default 200)")
    p.add_argument("--time-budget", type=SECONDS, default=60.0, metavar="S", help="seconds in all (default 60)")
    p.add_argument("--seed", type=SEED, default=0, metavar="N")
    p.add_argument("--profile", metavar="FILE", help="service-curve profile (default: the linear default)")
    p.add_argument("--max-requests", type=_FUZZ_REQUESTS, default=20, metavar="N", help="requests per stress segment (default 20)")
    p.add_argument("--stress", action="append", metavar="NAME", help="only these stresses (repeatable)")
    p.add_argument("--out", default="counterexamples", metavar="DIR")
    p.add_argument("--database", metavar="DIR", help="Hypothesis example database (earlier failures are tried "
                   f"first; default {DEFAULT_DATABASE}, none with --fleet); 'none' to disable")
    jobs_flags(p, "--fleet: the property searches on N local processes (default 1: one after the other here)")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.set_defaults(run=_fuzz)

    p = verbs.add_parser("check-log", help="check the invariants on a real scheduler's per-step log",
                         description="Exit 1 at the first violating step (or, with --conformance, when the log "
                                     "diverges from the engine); 0 otherwise. Format: docs/check-log.md.")
    p.add_argument("policy", metavar="POLICY")
    p.add_argument("log", metavar="LOG.jsonl")
    p.add_argument("--arrivals", required=True, metavar="FILE", help="JSON list of {id, arrival_step, prompt_tokens, "
                   "output_tokens, priority, abort_step?, prefix_group? | hash_ids?, hash_block_tokens?}")
    p.add_argument("--invariant", action="append", metavar="NAME[:PARAMS]",
                   help="repeatable; default: the four safety invariants")
    p.add_argument("--conformance", action="store_true", help="also compare the log with the engine, step by step")
    p.add_argument("--follow", action="store_true", help="follow the log as it grows (like tail -f): print the "
                   "verdict so far; stop at a violation, when every request is done, or when idle")
    p.add_argument("--follow-idle-s", type=SECONDS, metavar="S", help="with --follow: stop after S seconds without a "
                   "new line (default 10)")
    p.add_argument("--json", action="store_true", help="print the verdict as JSON (with --follow: once, at the end)")
    p.set_defaults(run=_check_log)

    for module in VERB_MODULES:  # verbs in their own module (checker/commands): each has register(verbs)
        importlib.import_module(module).register(verbs)
    return parser


# Arguments that may name a shipped example (`vllm_v1`, `chat_mixed`) where no file of that name exists: the
# attribute, its kind (checker/examples.py). audit's positional records are audit files; validate tries each kind.
EXAMPLE_ARGUMENTS = {"policy": "policy", "old": "policy", "new": "policy", "workload": "workload",
                     "derive_workload": "workload", "profile": "profile", "slo": "slo", "contract": "audit"}
EXAMPLE_ARGUMENTS["fleet"] = "fleet"  # batchcheck fleet / sweep FLEET, simulate / fuzz --fleet FLEET (spec/fleets)


def resolve_examples(args: argparse.Namespace) -> None:
    """Replace each bare example name among the arguments by the example's path (lists are files the user
    names, e.g. ci's policies, except validate's, where each file is looked up under every kind)."""
    from checker.examples import KINDS, is_bare_name, missing_example, resolve

    for attr, kind in EXAMPLE_ARGUMENTS.items():
        value = getattr(args, attr, None)
        if isinstance(value, str):
            kind = "audit" if args.verb == "audit" and attr == "workload" else kind
            path = resolve(value, kind)
            if str(path) == value and is_bare_name(value) and not path.exists():
                raise missing_example(value, kind)
            setattr(args, attr, str(path))
    if args.verb == "validate":
        args.files = [next((str(r) for r in (resolve(f, k) for k in KINDS) if str(r) != f), f) for f in args.files]


@functools.cache
def _parser() -> argparse.ArgumentParser:
    """The parser, built once per process (building it imports every verb module: about 30 ms, which
    in-process callers such as the test suite and tests/fuzz pay on every call otherwise)."""
    return build_parser()


def main(argv: list[str] | None = None) -> int:
    """Run one command line; the process is left as it was found (no thread, hook, signal wakeup, z3 parameter or
    disabled garbage collector left behind: in-process callers such as the test suite call it many times)."""
    args = _parser().parse_args(argv)
    collecting = gc.isenabled()
    try:
        with ctrl_c_stops_solving(args.verb) as interrupts:
            return _run(args, interrupts)
    finally:
        if collecting and not gc.isenabled():  # a phase that turned it off and was stopped before turning it on
            gc.enable()


def _run(args: argparse.Namespace, interrupts: Interrupts) -> int:
    run: Callable[[argparse.Namespace], int] = args.run
    try:
        resolve_examples(args)
        with terminal_progress.heartbeat(args.verb):  # progress lines in a CI log, for every verb
            return int(run(args))
    except BatchcheckError as exc:
        print(f"batchcheck: error: {exc}", file=sys.stderr)
        return int(exc.exit_code)
    except KeyboardInterrupt:  # Ctrl-C: no verdict, one line, exit 130 (never a traceback)
        interrupts.handled.set()
        terminal_progress.clear()
        print("batchcheck: interrupted", file=sys.stderr)
        return int(ExitCode.INTERRUPTED)
    except BrokenPipeError:
        return int(ExitCode.OK)
    except BaseException as exc:  # a user invariant's exception is the user's error; anything else is a bug
        from checker.ci.usercode import user_code_error

        if (user := user_code_error(exc)) is not None:
            print(f"batchcheck: error: {user}", file=sys.stderr)
            return int(user.exit_code)
        if os.environ.get("BATCHCHECK_DEBUG") or not isinstance(exc, Exception):
            raise
        print(f"batchcheck: internal error (a bug in batchcheck; rerun with BATCHCHECK_DEBUG=1 for "
              f"the traceback and please report it): {type(exc).__name__}: {exc}", file=sys.stderr)
        return int(ExitCode.INTERNAL_ERROR)


if __name__ == "__main__":
    sys.exit(main())

