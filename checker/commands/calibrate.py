"""`batchcheck calibrate {measure,import-vidur,fit}`: the command-line shell over checker.calibrate."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from checker.commands.shell import MAX_TOKENS, SEED, arg_type, number
from checker.exitcodes import ExitCode

TARGETS = "median <= 5 %, p95 <= 10 %"


_ints = arg_type(lambda text: tuple(int(part) for part in text.split(",") if part),
                 lambda values: bool(values) and 0 <= min(values) and max(values) <= MAX_TOKENS,
                 f"integers from 0 to {MAX_TOKENS:,}, comma-separated, like 16,64,256")
_share = arg_type(float, lambda value: 0.0 <= value < 1.0, "a share >= 0 and < 1, like 0.25")
_positive = number(int, 1, 1_000_000)


def _table_json(table, out: str) -> dict:
    """What measure and import-vidur --json say of the table they wrote (docs/schemas/calibrate-*.schema.json)."""
    return {"out": out, "rows": len(table.rows),
            "kinds": {k: sum(1 for m in table.rows if m.kind == k) for k in ("prefill", "decode", "mixed")},
            "device": table.device, "model": table.model.model_dump(), "notes": list(table.notes)}


def _measure(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from checker.calibrate.measure import MODELS, MeasureGrid, _torch, measure

    _torch()  # exit 2 with how to install it, before anything else
    cfg = MODELS[args.model]
    overrides = {k: getattr(args, k) for k in ("layers", "hidden", "heads", "kv_heads", "intermediate", "vocab")
                 if getattr(args, k) is not None}
    if overrides:
        cfg = replace(cfg, name=args.name or f"{cfg.name}-custom", **overrides)
    elif args.name:
        cfg = replace(cfg, name=args.name)
    grid = MeasureGrid(**{k: getattr(args, k) for k in MeasureGrid.__dataclass_fields__ if getattr(args, k) is not None})
    show = (lambda msg: print(f"\r\033[K  ... {msg}", end="", file=sys.stderr, flush=True)) if sys.stderr.isatty() else None
    table, wall_s = measure(cfg, grid, args.device, args.warmup, args.repeats, args.passes, args.seed, args.threads,
                            args.clock, show)
    if show is not None:
        print("\r\033[K", end="", file=sys.stderr, flush=True)
    table.write(args.out)
    if args.json:
        print(json.dumps({**_table_json(table, args.out), "wall_s": round(wall_s, 3), "exit_code": int(ExitCode.OK)},
                         indent=1))
        return ExitCode.OK
    print(f"{args.out}: {len(table.rows)} batch shapes of {table.model.name} measured on {table.device} "
          f"in {wall_s:.1f} s")
    return ExitCode.OK


def _import_vidur(args: argparse.Namespace) -> int:
    from checker.calibrate.vidur import KNOWN_MODELS, Grid, VidurModel, import_vidur, model_from_hf_config

    if args.model_config is not None:
        model = model_from_hf_config(args.model_config, args.model_name)
    elif args.layers is not None:
        name = args.model_name or Path(args.directory).name
        model = VidurModel(name.rsplit("/", 1)[-1].lower(), args.layers, name)
    else:
        model = KNOWN_MODELS[args.model]
    table = import_vidur(args.directory, model,
                         Grid(prefill_stride=args.prefill_stride, decode_stride=args.decode_stride), args.device)
    table.write(args.out)
    if args.json:
        print(json.dumps({**_table_json(table, args.out), "directory": args.directory, "exit_code": int(ExitCode.OK)},
                         indent=1))
        return ExitCode.OK
    for note in table.notes:
        print(f"note: {note}")
    kinds = {k: sum(1 for m in table.rows if m.kind == k) for k in ("prefill", "decode", "mixed")}
    print(f"{args.out}: {len(table.rows)} batch shapes of {table.model.name} from {args.directory} "
          f"({kinds['prefill']} prefill, {kinds['decode']} decode, {kinds['mixed']} mixed)")
    return ExitCode.OK


def _fit(args: argparse.Namespace) -> int:
    from checker.api import load_policy
    from checker.calibrate.coverage import extrapolation_notes
    from checker.calibrate.fit import FitOptions, fit, write_fit
    from checker.calibrate.measurements import read_measurements

    table = read_measurements(args.measurements)
    policies = [load_policy(p) for p in args.policy or ()]  # bad policies fail before anything is written
    options = FitOptions(held_out=args.held_out, seed=args.seed, max_pieces=args.max_pieces,
                         **({"terms": tuple(t for t in args.terms.split(",") if t)} if args.terms else {}))
    result = fit(table, args.measurements, args.out, args.name, options)
    written = write_fit(result, args.out, plot=not args.no_plot)
    profile = result.profile
    if args.json:
        return _fit_json(args, result, written, policies, options)
    ends = [p.max_batched_tokens for p in profile.pieces[:-1]]
    print(f"{args.out}: {len(profile.pieces)} piece{'s' if len(ends) else ''}"
          + (f" (ending at {', '.join(map(str, ends))} scheduled tokens)" if ends else "")
          + f"; terms {', '.join(options.terms)}")
    for label, held in (("training", False), ("held out", True)):
        e = result.errors(held)
        count = int(result.held_out.sum() if held else (~result.held_out).sum())
        if e:
            print(f"  {label}: {count} shapes, relative error median {100 * e['median']:.1f} %, "
                  f"p95 {100 * e['p95']:.1f} %, max {100 * e['max']:.1f} %")
    met = result.meets_targets()
    print(f"  targets on held-out shapes ({TARGETS}): {'met' if met else 'MISSED'}")
    r = profile.calibration.measured_range
    print(f"  measured range: scheduled tokens up to {r.max_batched_tokens}, decode sequences up to "
          f"{r.max_decode_seqs}, context up to {r.max_context}; beyond it times are extrapolated")
    for path in written[1:]:
        print(f"  residual plot: {path}")
    for policy in policies:
        for note in extrapolation_notes(policy, profile):
            print(note)
    return ExitCode.OK if met else ExitCode.VIOLATED


def _fit_json(args: argparse.Namespace, result, written: list[Path], policies: list, options) -> int:
    """calibrate fit --json: the profile written and the fit's error (docs/schemas/calibrate-fit.schema.json)."""
    from checker.calibrate.coverage import extrapolation_notes
    from checker.calibrate.fit import TARGET_MEDIAN, TARGET_P95

    profile = result.profile
    code = ExitCode.OK if result.meets_targets() else ExitCode.VIOLATED
    errors = {}
    for key, held in (("training", False), ("held_out", True)):
        count = int(result.held_out.sum() if held else (~result.held_out).sum())
        errors[key] = {"shapes": count, **result.errors(held)} if count else None
    print(json.dumps({
        "measurements": args.measurements, "profile": args.out, "name": profile.name, "device": profile.device,
        "model": profile.model.model_dump() if profile.model is not None else None,
        "terms": list(options.terms), "pieces": [p.model_dump() for p in profile.pieces], **errors,
        "targets": {"median": TARGET_MEDIAN, "p95": TARGET_P95}, "meets_targets": result.meets_targets(),
        "fit_error": profile.fit_error, "measured_range": profile.calibration.measured_range.model_dump(),
        "residual_plot": str(written[1]) if len(written) > 1 else None, "written": [str(p) for p in written],
        "extrapolation": [{"policy": path, "notes": extrapolation_notes(policy, profile)}
                          for path, policy in zip(args.policy or (), policies)],
        "exit_code": int(code)}, indent=1))
    return code


def register(verbs) -> None:
    from checker.calibrate.measure import MODELS
    from checker.calibrate.vidur import KNOWN_MODELS, Grid

    p = verbs.add_parser("calibrate", help="measure or import iteration times and fit a service-curve profile",
                         description="Service-curve calibration (docs/calibration.md): measure a transformer with "
                                     "PyTorch or import Vidur's GPU profiles into a measurement CSV, then fit a "
                                     "profile on it with the error on held-out shapes.")
    steps = p.add_subparsers(dest="calibrate_step", required=True, metavar="STEP")

    m = steps.add_parser("measure", help="time forward passes of a decoder-only transformer (needs torch)",
                         description="Random weights, no downloads. CUDA events on a GPU, time.perf_counter on the "
                                     "CPU (--clock thread: the thread's CPU time, for a shared machine). Needs the "
                                     "optional torch extra: pip install -e '.[calibrate]'.")
    m.add_argument("--out", required=True, metavar="FILE.csv", help="the measurement table to write")
    m.add_argument("--model", choices=sorted(MODELS), default="tiny-llama", help="model shape preset (default tiny-llama)")
    m.add_argument("--name", metavar="NAME", help="model name in the table (default: the preset's)")
    for key in ("layers", "hidden", "heads", "kv_heads", "intermediate", "vocab"):
        m.add_argument(f"--{key.replace('_', '-')}", dest=key, type=_positive, metavar="N", help=f"override the preset's {key}")
    m.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto", help="default: cuda when visible")
    m.add_argument("--warmup", type=number(int, 0, 1_000_000), default=1, metavar="N", help="untimed passes per shape and sweep (default 1)")
    m.add_argument("--repeats", type=_positive, default=3, metavar="N", help="timed passes per shape and sweep (default 3)")
    m.add_argument("--passes", type=_positive, default=3, metavar="N", help="sweeps over the whole grid (default 3)")
    m.add_argument("--threads", type=_positive, default=1, metavar="N", help="torch CPU threads (default 1)")
    m.add_argument("--clock", choices=("wall", "thread"), default="wall",
                   help="CPU timing: wall (perf_counter, default) or the thread's CPU time")
    m.add_argument("--seed", type=SEED, default=0, metavar="N")
    for key, what in (("prefill_chunks", "prefill chunk sizes"), ("prefill_contexts", "context before each chunk"),
                      ("decode_batches", "decode batch sizes"), ("decode_contexts", "context of each decode"),
                      ("mixed_chunks", "mixed batches: chunk sizes"), ("mixed_decode_batches", "mixed batches: decodes"),
                      ("mixed_contexts", "mixed batches: contexts")):
        m.add_argument(f"--{key.replace('_', '-')}", dest=key, type=_ints, metavar="N,N,...", help=what)
    m.add_argument("--json", action="store_true", help="print the table written as JSON")
    m.set_defaults(run=_measure)

    v = steps.add_parser("import-vidur", help="iteration times from Vidur's GPU operator profiles",
                         description="Sum Vidur's per-layer operator times (mlp.csv, attention.csv) and CPU overheads "
                                     "(cpu_overheads.csv) into iteration times of prefill, decode and mixed batches.")
    v.add_argument("directory", metavar="DIR", help="e.g. ../shared/data/gpu_profiles/a100_llama-2-70b_tp2")
    v.add_argument("--out", required=True, metavar="FILE.csv")
    v.add_argument("--model", choices=sorted(KNOWN_MODELS), default="llama-2-70b",
                   help="layer count and CPU-overhead rows of this model (default llama-2-70b)")
    v.add_argument("--model-config", metavar="config.json", help="any model: its Hugging Face config.json gives the "
                   "layer count (num_hidden_layers); overrides --model")
    v.add_argument("--layers", type=_positive, metavar="N", help="any model: its layer count (overrides --model)")
    v.add_argument("--model-name", metavar="NAME", help="with --model-config or --layers: the model's name as "
                   "cpu_overheads.csv writes it (e.g. meta-llama/Llama-2-7b-hf)")
    v.add_argument("--device", metavar="NAME", help="device name in the table (default: vidur-DIRNAME)")
    v.add_argument("--prefill-stride", type=_positive, default=Grid.prefill_stride, metavar="N",
                   help=f"keep every N-th profiled prefill shape (default {Grid.prefill_stride})")
    v.add_argument("--decode-stride", type=_positive, default=Grid.decode_stride, metavar="N",
                   help=f"keep every N-th profiled decode shape (default {Grid.decode_stride})")
    v.add_argument("--json", action="store_true", help="print the table written as JSON")
    v.set_defaults(run=_import_vidur)

    f = steps.add_parser("fit", help="fit a profile on a measurement table; error on held-out shapes",
                         description=f"Exit 0 when the held-out error meets the targets ({TARGETS}), 1 when it "
                                     "misses them (the profile is written either way), 2 on bad input.")
    f.add_argument("measurements", metavar="MEASUREMENTS.csv")
    f.add_argument("--out", required=True, metavar="PROFILE.json", help="the profile (the plot goes beside it)")
    f.add_argument("--name", metavar="NAME", help="profile name (default: the file name)")
    f.add_argument("--held-out", type=_share, default=0.25, metavar="SHARE",
                   help="share of each kind's shapes kept out of the fit (default 0.25)")
    f.add_argument("--seed", type=SEED, default=0, metavar="N", help="seed of the held-out split (default 0)")
    f.add_argument("--max-pieces", type=_positive, default=4, metavar="N", help="pieces at most (default 4)")
    f.add_argument("--terms", metavar="T,T,...", help="only these terms (default all: overhead, prefill_token, "
                   "prefill_attention, decode_seq, decode_kv_token)")
    f.add_argument("--no-plot", action="store_true", help="do not write the residual plot")
    f.add_argument("--policy", action="append", metavar="POLICY",
                   help="flag the policy's limits beyond the measured range (repeatable)")
    f.add_argument("--json", action="store_true", help="print the profile written and its error as JSON")
    f.set_defaults(run=_fit)
