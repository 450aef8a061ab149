"""Benchmark: the default `batchcheck verify POLICY` (no flags) on every shipped policy (issue 19's target:
each of the four state invariants PROVED or VIOLATED in <= 30 s), plus the bounded-search target
(`verify vllm_v1.yaml --invariant kv_never_overcommitted --requests 4 --depth 8`: HOLDS_UP_TO or VIOLATED in
<= 10 s).

Each policy runs in its own process, as a user runs it (`python -m checker.cli verify POLICY --json`, with the
counterexamples and certificates in a temporary folder); one row per (policy, invariant): the verdict, the
seconds verify reports for it and how it was decided. Prints a markdown table and the load average.

    python bench/verify_defaults.py                       # the 13 shipped policies, then the bounded target
    python bench/verify_defaults.py --match vllm_v1       # policies whose name contains TEXT
    python bench/verify_defaults.py -- --timeout 120      # extra verify options after --
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
POLICIES = sorted((ROOT / "spec" / "policies").glob("*.yaml"))
DECIDED = ("PROVED", "VIOLATED")


def method(result: dict) -> str:
    """How a verdict was reached, in a few words."""
    if result["verdict"] == "PROVED":
        how = result.get("method") or "whole-step induction"
        return how.split(":")[0]
    if result["verdict"] == "VIOLATED":
        return "bounded search (counterexample)"
    if result["verdict"] == "VACUOUS":
        return result.get("vacuity") or "vacuous"
    return "bounded search"


def run(policy: Path, extra: list[str]) -> tuple[list[dict], int]:
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "checker.cli", "verify", str(policy.relative_to(ROOT)), "--json",
               "--out", tmp, *extra]
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True,
                              env={**os.environ, "PYTHONPATH": str(ROOT), "BATCHCHECK_PROGRESS": "off"})
    try:
        doc = json.loads(proc.stdout)
    except json.JSONDecodeError:
        sys.exit(f"{policy.name}: exit {proc.returncode}, no JSON: {proc.stderr[-2000:]}")
    return doc["results"], proc.returncode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--match", default="", help="only policies whose file name contains TEXT")
    parser.add_argument("--no-target", action="store_true", help="skip the 4 x 8 bounded-search target")
    parser.add_argument("extra", nargs="*", help="verify options (after --)")
    args = parser.parse_args()
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    print("| policy | invariant | verdict | seconds | method |")
    print("|---|---|---|---:|---|")
    worst, undecided = 0.0, 0
    for policy in POLICIES:
        if args.match not in policy.name:
            continue
        results, _ = run(policy, args.extra)
        for r in results:
            worst = max(worst, r["seconds"])
            undecided += r["verdict"] not in DECIDED
            print(f"| {policy.stem} | {r['invariant']} | {r['verdict']} | {r['seconds']:.1f} | {method(r)} |",
                  flush=True)
    print(f"\nslowest invariant: {worst:.1f} s; undecided (not PROVED/VIOLATED): {undecided}")
    if not args.no_target:
        results, _ = run(ROOT / "spec" / "policies" / "vllm_v1.yaml",
                         ["--invariant", "kv_never_overcommitted", "--requests", "4", "--depth", "8", *args.extra])
        r = results[0]
        print(f"bounded target vllm_v1 kv_never_overcommitted 4 x 8: {r['verdict']} (depth {r['depth']}) "
              f"in {r['seconds']:.1f} s")
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
