"""Soundness sweep of `verify --any-n` over every shipped policy (issue 20): the any-N verdict of each state
invariant beside bounded model checking at a small N and the engine on generated traces with many requests on
the policy's own pool. A PROVED beside a violation is a soundness bug: the script then exits 1.

    python bench/anyn_sweep.py                      # every shipped policy, N=3 x 4 BMC, 4 traces of 200 requests
    python bench/anyn_sweep.py --bmc 2x3 --traces 2 --requests 60
    python bench/anyn_sweep.py --match vllm

Also runs planted over-commits that need many requests (vllm_v1 with kv.check_allocation: false on its real pool):
they must not be PROVED, and the engine with enough requests must find them.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from checker.api import load_policy  # noqa: E402
from checker.verify.anyn_sweep import engine_check, sweep_policy  # noqa: E402

POLICIES = ROOT / "spec" / "policies"


def planted(folder: Path) -> list[tuple[str, Path]]:
    v1 = (POLICIES / "vllm_v1.yaml").read_text()
    unchecked = v1.replace("  allocation: on_demand", "  allocation: on_demand\n  check_allocation: false")
    out = []
    for name, text in (("planted: vllm_v1, decode growth unchecked", unchecked),
                       ("planted: vllm_v1, decode growth unchecked, 10,000 blocks",
                        unchecked.replace("num_blocks: 2500", "num_blocks: 10000"))):
        path = folder / f"planted_{len(out)}.yaml"
        path.write_text(text)
        out.append((name, path))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bmc", default="3x4", help="N x K of the bounded check (default 3x4)")
    ap.add_argument("--traces", type=int, default=4)
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--timeout", type=float, default=60.0)
    ap.add_argument("--match", default="")
    args = ap.parse_args(argv)
    n, k = (int(x) for x in args.bmc.split("x"))
    print(f"date {time.strftime('%Y-%m-%d %H:%M')}; load average {os.getloadavg()[0]:.2f}; {os.cpu_count()} CPUs; "
          f"BMC {n}x{k}; engine {args.traces} traces x {args.requests} requests x {args.steps} iterations")
    print("| policy | invariant | any N | BMC | engine | sound |\n|---|---|---|---|---|---|", flush=True)
    unsound = 0
    started = time.perf_counter()
    files = sorted(p for p in POLICIES.rglob("*.yaml") if args.match in str(p))
    with tempfile.TemporaryDirectory() as tmp:
        cases = [(str(p.relative_to(POLICIES)), p) for p in files] + \
            ([] if args.match and "planted" not in args.match else planted(Path(tmp)))
        for name, path in cases:
            policy = load_policy(path)
            for row in sweep_policy(name, policy, (n, k), (args.traces, args.requests, args.steps), args.timeout):
                unsound += row.unsound
                print(f"| `{name}` | {row.invariant} | {row.any_n} | {row.bmc} | {row.engine} | "
                      f"{'**UNSOUND**' if row.unsound else 'ok'} |", flush=True)
            if name.startswith("planted"):
                heavy = engine_check(policy, "kv_never_overcommitted", args.traces, args.requests, args.steps,
                                     prompt_cap=1024)
                print(f"| `{name}` | kv_never_overcommitted, prompts <= 1,024 | | | {heavy} | |", flush=True)
    print(f"\n{unsound} unsound row(s); {time.perf_counter() - started:.1f} s")
    return 1 if unsound else 0


if __name__ == "__main__":
    sys.exit(main())
