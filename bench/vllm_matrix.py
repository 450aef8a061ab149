"""Conformance of the engine with the real vLLM 0.33 scheduler over a matrix of generated traces.

For each case: generate a trace (seeded), drive the real scheduler with the harness
(shared/tools/vllm-scheduler), import the policy with the same flags (`batchcheck import vllm`), and compare
the engine with the log step by step (what `batchcheck check-log POLICY LOG --arrivals TRACE --conformance`
does). Prints the agreement table in markdown (docs/check-log.md carries it).

    python bench/vllm_matrix.py [--only NAME ...] [--keep DIR] [--venv DIR]

Needs the harness venv (BATCHCHECK_VLLM_VENV, default ~/.cache/vllm-scheduler/venv); exits 0 with a
message when it is absent. The case definitions are shared with tests/conformance/test_real_vllm.py.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.conformance_table import AgreementTable, first, share  # noqa: E402
from tests.vllm_harness import CASES, harness_python, run_cases  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", nargs="*", default=None, help="case names (default: all)")
    ap.add_argument("--keep", default=None, help="directory to keep traces, logs and policies in")
    args = ap.parse_args(argv)
    if harness_python() is None:
        print("the vLLM harness venv is absent (see shared/tools/vllm-scheduler/README.md): nothing to compare")
        return 0
    table = AgreementTable(["case", "caching", "policy", "steps", "preemptions", "steps agree", "share",
                            "free blocks agree", "first divergence"])
    table.header()
    cases = [c for c in CASES if not args.only or c.name in args.only]
    for result in run_cases(cases, Path(args.keep) if args.keep else None):
        case, conf = result.case, result.conformance
        table.row(case.name, [case.name, "on" if case.caching else "off", case.policy, conf.steps, result.preemptions,
                              conf.agreeing, share(conf), result.free_blocks_agree, first(conf)], conf)
    table.footer()
    return 0


if __name__ == "__main__":
    sys.exit(main())
