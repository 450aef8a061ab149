"""Conformance of the engine's SGLang rules with SGLang 0.5.23's real scheduler, log by log.

For each case of tests/sglang_logs.py: the policy `batchcheck import sglang --rules sglang` makes from the driver's
flags, compared with the step log step by step (check-log's reference comparison: scheduled tokens, preemptions
and finishes of every step; the free blocks counted too, and with the radix cache the tree's evictable and protected
tokens). By default on the kept logs of tests/data/sglang/ (no
venv needed); with --fresh the traces are generated again (--seed K shifts every case's seed, for new traces) and
driven through the real scheduler in the SGLang venv (tools/sglang_setup.sh; BATCHCHECK_SGLANG_VENV). Prints the
table in markdown, the first divergence of a log as a comment under its row.

    python bench/sglang_matrix.py [--only NAME ...] [--fresh [--seed K] [--keep DIR]]
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.conformance_table import AgreementTable, first, share  # noqa: E402
from tests import sglang_logs as L  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", nargs="*", default=None, help="case names (default: all)")
    ap.add_argument("--fresh", action="store_true", help="drive new logs through the SGLang venv instead of reading "
                    "the kept ones")
    ap.add_argument("--seed", type=int, default=0, help="with --fresh: add K to every case's seed (0: the kept "
                    "traces)")
    ap.add_argument("--keep", default=None, help="with --fresh: the directory to keep traces and logs in")
    args = ap.parse_args(argv)
    cases = [c for c in L.CASES if not args.only or c.name in args.only]
    unknown = set(args.only or ()) - {c.name for c in L.CASES}
    if unknown:
        ap.error(f"unknown case(s): {', '.join(sorted(unknown))} (known: {', '.join(c.name for c in L.CASES)})")
    folder = Path(args.keep) if args.keep else Path(tempfile.mkdtemp())
    folder.mkdir(parents=True, exist_ok=True)
    if args.fresh:
        from tests.sglang_harness import absent_reason, venv_python

        if venv_python() is None:
            print(f"{absent_reason()}: nothing to drive (the kept logs run without --fresh)")
            return 0
        cases = [dataclasses.replace(c, seed=c.seed + args.seed) for c in cases]
        paths = L.drive_cases(cases, folder)
    else:
        paths = {c.name: L.kept(c.name, folder) for c in cases}
    table = AgreementTable(["log", "steps", "retractions", "priority preemptions", "aborts", "steps agree",
                            "share", "free blocks agree", "radix tree agrees", "first divergence"])
    table.header()
    for case in cases:
        trace, log = paths[case.name]
        stats = L.log_stats(log)
        conf = L.compare(trace, log, case.driver_flags(), case.name)
        table.row(case.name, [case.name, conf.steps, stats["retractions"], stats["preemptions"], stats["aborts"],
                              conf.agreeing, share(conf), conf.free_blocks_agreeing,
                              "-" if conf.tree_agreeing is None else conf.tree_agreeing, first(conf)], conf)
    table.footer()
    return 0


if __name__ == "__main__":
    sys.exit(main())
