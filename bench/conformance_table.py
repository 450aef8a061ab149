"""The agreement table the conformance matrices print (bench/vllm_matrix.py, bench/vllm_connector_matrix.py,
bench/sglang_matrix.py): markdown rows, the first divergence of a log as an HTML comment under its row (so the
table pastes into docs/check-log.md as it is), and the worst agreement at the end."""

from __future__ import annotations

import time


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


def share(conf) -> str:
    return f"{100 * conf.share:.1f} %"


def first(conf) -> str:
    return "-" if conf.first_divergence is None else f"step {conf.first_divergence}"
