"""SGLang's planted bugs and their fixes under `verify --cache-method z3` (z3 bounded model checking over the SGLang
encoding, checker/smt/sglang.py): verdict, wall and CPU seconds per case. The fast finds are pinned by
tests/quality/test_sglang_smt_finds.py; this measures the rest (figures in docs/benchmarks.md, section smt18).

    python bench/sglang_smt_finds.py [--only NAME ...] [--timeout S]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from checker.api import run_verify  # noqa: E402
from tests.helpers import POLICIES  # noqa: E402

STARVE = dict(prompt=(4, 24), output=(1, 16))
OPTIMISTIC = dict(prompt=(4, 15), output=(1, 8), cancellations=False)
HOL = dict(prompt=(4, 16))
# name: (policy, invariant, N, K, environment)
CASES = {
    "starve": ("broken/sglang_prefill_starves_decode.yaml", "decode_progress:gap=2", 2, 8, STARVE),
    "starve_fixed": ("sglang/prefill_starves_decode_fixed.yaml", "decode_progress:gap=2", 2, 4, STARVE),
    "optimistic": ("broken/sglang_optimistic_admission.yaml", "bounded_preemptions:times=0", 2, 10, OPTIMISTIC),
    "optimistic_fixed": ("sglang/optimistic_admission_fixed.yaml", "bounded_preemptions:times=0", 2, 10, OPTIMISTIC),
    "head_of_line": ("broken/sglang_head_of_line.yaml", "bounded_starvation:steps=4", 2, 8,
                     dict(HOL, cancellations=False)),
    "head_of_line_fixed": ("sglang/head_of_line_fixed.yaml", "bounded_starvation:steps=4", 2, 6, HOL),
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", nargs="*", default=None)
    ap.add_argument("--timeout", type=float, default=600.0)
    args = ap.parse_args(argv)
    print("| case | N | K | verdict | wall s | cpu s |\n|---|---|---|---|---|---|")
    for name, (policy, inv, n, k, env) in CASES.items():
        if args.only and name not in args.only:
            continue
        wall, cpu = time.monotonic(), time.process_time()
        _, (r,) = run_verify(POLICIES / policy, [inv], requests=n, depth=k, timeout_s=args.timeout, out_dir=None,
                             cache_method="z3", **env)
        verdict = r.verdict.value + (f" (iteration {r.violation_step})" if r.violation_step is not None else "")
        print(f"| {name} | {n} | {k} | {verdict} | {time.monotonic() - wall:.1f} | {time.process_time() - cpu:.1f} |",
              flush=True)
        if r.notes:
            print(f"<!-- {name}: {'; '.join(r.notes)} -->", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
