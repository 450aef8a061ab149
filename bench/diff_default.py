"""Benchmark: the default `batchcheck diff OLD NEW` on a one-knob change (issue 19's target: decided in <= 2 min,
with progress lines off a terminal; undecided rows say "undecided", never "ok"; the summary names the changed knob
and gives one line of why per regression).

OLD is a shipped policy, NEW a temporary copy with one knob changed (default: vllm_v1 with batch.max_num_seqs
halved). Runs `python -m checker.cli diff OLD NEW [options]` as a user would, stdout and stderr to pipes (not a
terminal), and prints the wall time, the rows, the progress lines seen and the load average before and after.

    python bench/diff_default.py                                   # vllm_v1, batch.max_num_seqs halved
    python bench/diff_default.py --policy sarathi_serve --knob batch.max_num_batched_tokens
    python bench/diff_default.py -- --bounded-only                 # extra diff options after --
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent


def halved(policy: Path, knob: str, folder: Path) -> Path:
    doc = yaml.safe_load(policy.read_text())
    *path, last = knob.split(".")
    node = doc
    for key in path:
        node = node[key]
    node[last] = node[last] // 2
    out = folder / f"{policy.stem}_new.yaml"
    out.write_text(yaml.safe_dump(doc, sort_keys=False))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--policy", default="vllm_v1", help="a shipped policy's name (spec/policies/NAME.yaml)")
    parser.add_argument("--knob", default="batch.max_num_seqs", help="the integer field to halve in NEW")
    parser.add_argument("extra", nargs="*", help="diff options (after --)")
    args = parser.parse_args()
    old = ROOT / "spec" / "policies" / f"{args.policy}.yaml"
    with tempfile.TemporaryDirectory() as tmp:
        new = halved(old, args.knob, Path(tmp))
        cmd = [sys.executable, "-m", "checker.cli", "diff", str(old.relative_to(ROOT)), str(new), "--out",
               str(Path(tmp) / "out"), *args.extra]
        load = os.getloadavg()[0]
        started = time.monotonic()
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
        wall = time.monotonic() - started
    progress = [line for line in proc.stderr.splitlines() if "running (" in line]
    print(f"load average before/after: {load:.2f} / {os.getloadavg()[0]:.2f}")
    print(f"diff {args.policy} vs {args.knob} halved {' '.join(args.extra)}: exit {proc.returncode}, "
          f"{wall:.1f} s wall; {len(progress)} progress line(s) on stderr")
    print(proc.stdout)


if __name__ == "__main__":
    main()
