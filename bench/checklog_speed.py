"""Benchmark: `batchcheck check-log --conformance` on a real vLLM log at canary scale (docs/benchmarks.md,
"check-log on a canary-scale log").

    python bench/checklog_speed.py [--repeat N] [--old-repeat N] [--workdir DIR] [--vs DIR [--vs-mode new]]
                                   [--requests N]

It makes its own inputs (in a temporary folder, or --workdir to keep them):

- a trace of the first N (1,000) requests of ../shared/data/traces/azure_conv_2023.csv: arrival_step =
  arrival second x 60, prompts clipped to 2,048 tokens, outputs to 256;
- the real vLLM 0.33 scheduler's step log for it (../shared/tools/vllm-scheduler, its venv in
  ~/.cache/vllm-scheduler/venv or $BATCHCHECK_VLLM_VENV; about 16,000 steps and 140 preemptions with a pool
  of 800 blocks of 16, 32 sequences, 2,048 tokens a step, prefix caching off);
- the policy, from `batchcheck import vllm` with the same flags.

Then each run is a fresh process: ``new`` runs ``checker.checklog.run_check_log`` (what the CLI runs: the
log streamed, invariants on what changed, the engine in lockstep); ``old`` runs the whole-frame reference
path of the same module (load_log, check_log, conformance: what the CLI ran before, every frame and engine
decision kept); with ``--vs DIR``, ``old`` is the CLI of another tree instead (a ``git worktree`` of the
commit before), or with ``--vs-mode new`` that tree's ``run_check_log``, timed exactly as ``new`` is. Runs alternate old/new so a drift in the machine's speed hits both. Reported: steps/s
(steps / seconds of the check itself, not the interpreter start), CPU seconds, peak RSS, min and median,
with the load average before and after. Skips with a message when the harness venv or the trace is absent.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared"
AZURE = SHARED / "data" / "traces" / "azure_conv_2023.csv"
HARNESS = SHARED / "tools" / "vllm-scheduler" / "drive_vllm_scheduler.py"
VENV = Path(os.environ.get("BATCHCHECK_VLLM_VENV", Path.home() / ".cache" / "vllm-scheduler" / "venv"))
KNOBS = {"num_blocks": 800, "block_size": 16, "max_num_seqs": 32, "max_num_batched_tokens": 2048}

# One measured run, in a fresh process: argv = mode, root, policy, log, arrivals. Prints one JSON line.
RUN = r"""
import json, resource, sys, time
mode, root, policy, log, arrivals = sys.argv[1:6]
sys.path.insert(0, root)
started, cpu = time.perf_counter(), time.process_time()
if mode == "new":
    from checker.checklog import run_check_log
    from checker.inputfiles import load_policy
    from checker.verify.run import parse_invariant
    t0, c0 = time.perf_counter(), time.process_time()  # the imports are not the check
    r = run_check_log(policy, log, arrivals, None, True)
    steps, violation, conf = r.steps, r.violation, r.conformance
elif mode == "old":
    from checker.checklog import CHECK_LOG_INVARIANTS, check_log, conformance, load_arrivals, load_log
    from checker.inputfiles import load_policy
    from checker.verify.run import parse_invariant
    t0, c0 = time.perf_counter(), time.process_time()
    pol, arr = load_policy(policy), load_arrivals(arrivals)
    log_steps = load_log(log, arr)
    chosen = [parse_invariant(t) for t in CHECK_LOG_INVARIANTS]
    violation, _ = check_log(pol, arr, log_steps, chosen)
    conf = conformance(pol, arr, log_steps)
    steps = len(log_steps)
else:  # "cli": the CLI of another tree, end to end (only its total time is known)
    import io, contextlib
    from checker.cli import main
    t0, c0 = time.perf_counter(), time.process_time()
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["check-log", policy, log, "--arrivals", arrivals, "--conformance"])
    steps = int(out.getvalue().split(": ", 1)[1].split(" steps", 1)[0])
    violation, conf = (None if code == 0 else "exit %d" % code), None
wall, cpu_s = time.perf_counter() - t0, time.process_time() - c0
print(json.dumps({"steps": steps, "wall": wall, "cpu": cpu_s, "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "violation": None if violation is None else str(violation),
                  "agree": None if conf is None else [conf.agreeing, conf.steps]}))
"""


def make_trace(path: Path, requests: int) -> None:
    with AZURE.open() as f:
        rows = [row for _, row in zip(range(requests), csv.DictReader(f))]
    trace = [{"id": f"r{i}", "arrival_step": int(float(row["arrived_at"]) * 60),
              "prompt_tokens": max(1, min(int(row["num_prefill_tokens"]), 2048)),
              "output_tokens": max(1, min(int(row["num_decode_tokens"]), 256)), "priority": 0}
             for i, row in enumerate(rows)]
    path.write_text(json.dumps(trace))


def make_inputs(workdir: Path, requests: int) -> tuple[Path, Path, Path]:
    trace, log, policy = workdir / "trace.json", workdir / "log.jsonl", workdir / "policy.yaml"
    if not trace.exists():
        make_trace(trace, requests)
    if not log.exists():
        print(f"generating the vLLM log (the harness takes ~30 s to start) into {log}", flush=True)
        env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu"}
        subprocess.run([str(VENV / "bin" / "python"), str(HARNESS), str(trace), "--num-blocks", str(KNOBS["num_blocks"]),
                        "--block-size", str(KNOBS["block_size"]), "--max-num-seqs", str(KNOBS["max_num_seqs"]),
                        "--max-num-batched-tokens", str(KNOBS["max_num_batched_tokens"]), "--out", str(log)],
                       check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    if not policy.exists():
        sys.path.insert(0, str(ROOT))
        from checker.api import run_import

        run_import("vllm", ["--num-gpu-blocks-override", str(KNOBS["num_blocks"]), "--block-size",
                            str(KNOBS["block_size"]), "--max-num-seqs", str(KNOBS["max_num_seqs"]),
                            "--max-num-batched-tokens", str(KNOBS["max_num_batched_tokens"]),
                            "--no-enable-prefix-caching", "--max-model-len", "8192"], out=policy)
    return trace, log, policy


def measure(mode: str, root: Path, policy: Path, log: Path, trace: Path) -> dict:
    out = subprocess.run([sys.executable, "-c", RUN, mode, str(root), str(policy), str(log), str(trace)],
                         check=True, capture_output=True, text=True, cwd=str(root))
    return json.loads(out.stdout.strip().splitlines()[-1])


def summary(label: str, runs: list[dict]) -> str:
    rates = [r["steps"] / r["wall"] for r in runs]
    cpu_rates = [r["steps"] / r["cpu"] for r in runs]
    return (f"{label:4s} runs={len(runs)}  steps/s wall: min {min(rates):,.0f}  median {statistics.median(rates):,.0f}  "
            f"max {max(rates):,.0f}   steps/s of CPU: min {min(cpu_rates):,.0f}  median "
            f"{statistics.median(cpu_rates):,.0f}   seconds: median {statistics.median(r['wall'] for r in runs):.2f}   "
            f"peak RSS: {max(r['rss_mb'] for r in runs):,.0f} MB   verdict: "
            f"{runs[0]['violation'] or 'no violation'}, conformance {runs[0]['agree']}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=5, help="runs of the new path (default 5)")
    ap.add_argument("--old-repeat", type=int, default=2, help="runs of the old path (default 2; ~1-2 min each)")
    ap.add_argument("--workdir", type=Path, help="keep the generated inputs here (reused when present)")
    ap.add_argument("--vs", type=Path, metavar="DIR", help="time the CLI of the tree in DIR as the old path")
    ap.add_argument("--vs-mode", choices=("cli", "new"), default="cli",
                    help="with --vs: time the other tree's CLI end to end (cli) or its run_check_log as new is timed")
    ap.add_argument("--requests", type=int, default=1000)
    args = ap.parse_args(argv)
    if not (VENV / "bin" / "python").exists() or not HARNESS.exists():
        print(f"skipped: the vLLM harness venv ({VENV}) or the harness ({HARNESS}) is absent; set it up with "
              "../shared/tools/vllm-scheduler/setup.sh")
        return 0
    if not AZURE.exists():
        print(f"skipped: {AZURE} is absent")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        workdir = args.workdir or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        trace, log, policy = make_inputs(workdir, args.requests)
        lines = sum(1 for _ in log.open())
        print(f"machine: {platform.machine()} {platform.processor() or ''} {os.cpu_count()} CPUs, Python "
              f"{platform.python_version()}; {time.strftime('%Y-%m-%d %H:%M')}")
        print(f"log: {lines} steps, {args.requests} requests ({log})")
        print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
        old_mode, old_root = (args.vs_mode, args.vs.resolve()) if args.vs else ("old", ROOT)
        new_runs, old_runs = [], []
        for i in range(max(args.repeat, args.old_repeat)):
            if i < args.old_repeat:
                old_runs.append(measure(old_mode, old_root, policy, log, trace))
                print(f"  old run {i + 1}: {old_runs[-1]['wall']:.1f} s", flush=True)
            if i < args.repeat:
                new_runs.append(measure("new", ROOT, policy, log, trace))
                print(f"  new run {i + 1}: {new_runs[-1]['wall']:.2f} s", flush=True)
        print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        if old_runs:
            print(summary("old", old_runs))
        if new_runs:  # --repeat 0: only the inputs made (and the old path, if asked)
            print(summary("new", new_runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
