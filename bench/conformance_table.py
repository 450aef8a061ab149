"""The agreement table the conformance matrices print (bench/vllm_matrix.py, bench/vllm_connector_matrix.py,
bench/sglang_matrix.py): markdown rows, the first divergence of a log as an HTML comment under its row (so the
table pastes into docs/check-log.md as it is), and the worst agreement at the end."""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path


class AgreementTable:
    """``columns``: the header cells. Each ``row`` takes the cells and the log's Conformance (steps, agreeing,
    share, first_divergence, detail) for the worst share and the divergence comment."""

    def __init__(self, columns: list[str]):
        self.columns = columns
        self.worst = 1.0
        self.rows = 0
        self.started = time.perf_counter()

    def header(self) -> None:
        print("| " + " | ".join(self.columns) + " |")
        print("|" + "---|" * len(self.columns))

    def row(self, name: str, cells: list[object], conf) -> None:
        self.worst = min(self.worst, conf.share)
        self.rows += 1
        print("| " + " | ".join(str(c) for c in cells) + " |", flush=True)
        if conf.first_divergence is not None:
            print(f"<!-- {name}: {conf.detail} -->", flush=True)

    def footer(self) -> None:
        print(f"\nworst agreement: {100 * self.worst:.1f} % ({self.rows} logs, "
              f"{time.perf_counter() - self.started:.0f} s)")


def matrix_logs(doc: str, argv: list[str] | None, jobs: dict, kept: Path, read_log, run_jobs,
                venv_python) -> tuple[Path, dict[str, list[dict]]] | None:
    """The logs a driver-based matrix compares (bench/vllm_spec_matrix.py, bench/vllm_async_matrix.py): with --kept
    the kept ones, else fresh ones from the venv (kept in --keep DIR); None (after a message) when the venv is
    absent. Returns the folder of the logs and traces, and each case's log lines."""
    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument("--keep", default=None, help="directory to keep traces and logs in")
    ap.add_argument("--kept", action="store_true", help=f"compare the kept logs ({kept.name}/)")
    args = ap.parse_args(argv)
    if args.kept:
        return kept, {name: read_log(kept / f"{name}.log.jsonl") for name in jobs}
    if venv_python() is None:
        print("the vLLM venv is absent (see shared/tools/vllm-scheduler/README.md): nothing to compare")
        return None
    folder = Path(args.keep) if args.keep else Path(tempfile.mkdtemp())
    return folder, run_jobs(jobs, keep=folder)


def share(conf) -> str:
    return f"{100 * conf.share:.1f} %"


def first(conf) -> str:
    return "-" if conf.first_divergence is None else f"step {conf.first_divergence}"
