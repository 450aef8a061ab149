"""Conformance of the engine with the real vLLM 0.33 AsyncScheduler (async scheduling), on generated traces.

Each case of tests/vllm_async_logs.py (a seeded trace; roomy pools, KV pressure with preemptions, prefix caching,
priority with aborts, small budgets with the long-prefill threshold, speculative decoding): stepped through the real scheduler as the engine
core's batch queue steps it (tests/vllm_async_driver.py: one batch in flight), the policy imported with the same flags
and --async-scheduling (`pipeline.in_flight: 1`), and the engine compared with the log step by step (check-log
--conformance). The last column is the synchronous model (the import without --async-scheduling) on the same log.
Prints the agreement table in markdown (docs/check-log.md carries it).

    python bench/vllm_async_matrix.py [--keep DIR] [--kept]

--kept compares the kept logs of tests/data/vllm_async/ (no venv needed). Without it the venv is needed
(BATCHCHECK_VLLM_VENV, default ~/.cache/vllm-scheduler/venv); it exits 0 with a message when it is absent.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.conformance_table import AgreementTable, first, matrix_logs, share  # noqa: E402
from tests.vllm_async_logs import KEPT, cases, compare, read_log, run_jobs, venv_python  # noqa: E402
from tests.vllm_spec_logs import compare as compare_with, import_args as sync_import_args  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    jobs = cases()
    found = matrix_logs(__doc__, argv, jobs, KEPT, read_log, run_jobs, venv_python)
    if found is None:
        return 0
    folder, logs = found
    table = AgreementTable(["case", "caching", "drafts (method k)", "steps", "preemptions", "aborts", "steps agree",
                            "share", "free blocks agree", "first divergence", "synchronous model agrees"])
    table.header()
    for name, (rows, fl) in jobs.items():
        log_path = folder / f"{name}.log.jsonl"
        conf = compare(rows, fl, log_path, name, folder)
        sync = compare_with(rows, fl, log_path, name, folder, importer=sync_import_args)
        log = logs[name]
        preemptions = sum(len(line["preempted"]) for line in log)
        aborts = sum(len(line["aborted"]) for line in log)
        caching = "on" if "--enable-prefix-caching" in fl else "off"
        method = (f"{sum(sum(line['drafts'].values()) for line in log)} ({fl[fl.index('--spec-method') + 1]} "
                  f"{fl[fl.index('--num-speculative-tokens') + 1]})" if "--spec-method" in fl else "-")
        table.row(name, [name, caching, method, conf.steps, preemptions, aborts, conf.agreeing, share(conf),
                         conf.free_blocks_agreeing, first(conf), share(sync)], conf)
    table.footer()
    return 0


if __name__ == "__main__":
    sys.exit(main())
