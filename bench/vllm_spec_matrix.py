"""Conformance of the engine with the real vLLM 0.33 scheduler under speculative decoding, on generated traces.

Each case of tests/vllm_spec_logs.py (a seeded trace, a method ngram / eagle / draft_model, k from 1 to 5, roomy
pools and KV pressure): driven through the real scheduler with the fake drafter and verifier
(tests/vllm_spec_driver.py), the policy imported with the same flags (`batchcheck import vllm ...
--speculative-config ...`), and the engine compared with the log step by step (check-log --conformance, the
log's accepted counts fed to the engine). Prints the agreement table in markdown (docs/check-log.md carries it).

    python bench/vllm_spec_matrix.py [--keep DIR] [--kept]

--kept compares the kept logs of tests/data/vllm_spec/ (no venv needed). Without it the venv is needed
(BATCHCHECK_VLLM_VENV, default ~/.cache/vllm-scheduler/venv); it exits 0 with a message when it is absent.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.conformance_table import AgreementTable, first, matrix_logs, share  # noqa: E402
from tests.vllm_spec_logs import KEPT, cases, compare, read_log, run_jobs, venv_python  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    jobs = cases()
    found = matrix_logs(__doc__, argv, jobs, KEPT, read_log, run_jobs, venv_python)
    if found is None:
        return 0
    folder, logs = found
    table = AgreementTable(["case", "method", "k", "steps", "preemptions", "drafts", "accepted", "steps agree",
                            "share", "free blocks agree", "first divergence"])
    table.header()
    for name, (rows, fl) in jobs.items():
        conf = compare(rows, fl, folder / f"{name}.log.jsonl", name, folder)
        log = logs[name]
        drafts = sum(sum(line["drafts"].values()) for line in log)
        accepted = sum(sum(line["accepted"].values()) for line in log)
        preemptions = sum(len(line["preempted"]) for line in log)
        method, k = fl[fl.index("--spec-method") + 1], fl[fl.index("--num-speculative-tokens") + 1]
        table.row(name, [name, method, k, conf.steps, preemptions, drafts, accepted, conf.agreeing, share(conf),
                         conf.free_blocks_agreeing, first(conf)], conf)
    table.footer()
    return 0


if __name__ == "__main__":
    sys.exit(main())
