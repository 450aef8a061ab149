"""The measurement table: one CSV row per measured batch composition.

Columns (all required; one device and one model shape per file):

- ``kind``: prefill, decode or mixed
- ``prefill_tokens``, ``prefill_attention``, ``decode_seqs``, ``decode_kv_tokens``: the batch's features,
  defined as the engine defines them (checker/semantics/decision.py): prefill chunk tokens; sum over
  chunks of chunk x (context after the chunk); decode sequences; sum over decodes of the context read
- ``max_context``: the longest context of any sequence in the batch (tokens)
- ``time_us``: the iteration time, microseconds (a median over repeats)
- ``spread_us``: the spread of the repeats (interquartile range; 0 when not known)
- ``device``, ``model``, ``layers``, ``hidden``, ``heads``, ``kv_heads``, ``dtype_bytes``,
  ``tensor_parallel``: what was measured
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import astuple, dataclass, fields
from pathlib import Path

import numpy as np

from checker.errors import InputError, Problem
from checker.fileio import write_atomic
from checker.loading import read_text
from checker.profile import ModelShape

KINDS = ("prefill", "decode", "mixed")
MAX_PROBLEMS = 10  # located problems reported at once


@dataclass(frozen=True)
class Measurement:
    kind: str
    prefill_tokens: int
    prefill_attention: int
    decode_seqs: int
    decode_kv_tokens: int
    max_context: int
    time_us: float
    spread_us: float = 0.0

    @property
    def batched_tokens(self) -> int:
        """Scheduled tokens: what the engine picks a profile piece by."""
        return self.prefill_tokens + self.decode_seqs


ROW_COLUMNS = tuple(f.name for f in fields(Measurement))
SHAPE_COLUMNS = ("device", "model", "layers", "hidden", "heads", "kv_heads", "dtype_bytes", "tensor_parallel")
COLUMNS = ROW_COLUMNS + SHAPE_COLUMNS
_COUNTS = ("prefill_tokens", "prefill_attention", "decode_seqs", "decode_kv_tokens", "max_context")
_SHAPE_INTS = SHAPE_COLUMNS[2:]


@dataclass(frozen=True)
class MeasurementTable:
    device: str
    model: ModelShape
    rows: tuple[Measurement, ...]
    source: str = "<measurements>"
    notes: tuple[str, ...] = ()  # how the source was read where it differs from the documented columns

    def features(self) -> np.ndarray:
        """rows x (prefill_tokens, prefill_attention, decode_seqs, decode_kv_tokens), as floats."""
        return np.array([(m.prefill_tokens, m.prefill_attention, m.decode_seqs, m.decode_kv_tokens)
                         for m in self.rows], dtype=float).reshape(len(self.rows), 4)

    def times_us(self) -> np.ndarray:
        return np.array([m.time_us for m in self.rows], dtype=float)

    def batched_tokens(self) -> np.ndarray:
        return np.array([m.batched_tokens for m in self.rows], dtype=float)

    def kinds(self) -> np.ndarray:
        return np.array([m.kind for m in self.rows])

    def to_csv(self) -> str:
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(COLUMNS)
        shape = (self.device, self.model.name, self.model.layers, self.model.hidden, self.model.heads,
                 self.model.kv_heads, self.model.dtype_bytes, self.model.tensor_parallel)
        for m in self.rows:
            values = [f"{v:.3f}" if isinstance(v, float) else v for v in astuple(m)]
            writer.writerow(values + list(shape))
        return out.getvalue()

    def write(self, path: str | Path, flag: str = "--out") -> None:
        write_atomic(path, self.to_csv(), create_dirs=True, flag=flag)


def read_measurements(path: str | Path) -> MeasurementTable:
    """Read and check a measurement CSV; every problem is located by line and column."""
    source = str(path)
    reader = csv.reader(io.StringIO(read_text(path)))
    header = [h.strip() for h in next(reader, [])]
    missing = [c for c in COLUMNS if c not in header]
    if missing:
        raise InputError(Problem("columns", "<missing " + ", ".join(missing) + ">",
                                 "the measurement columns " + ",".join(COLUMNS), 1), source)
    at = {name: header.index(name) for name in COLUMNS}
    problems: list[Problem] = []
    rows: list[Measurement] = []
    shape: tuple | None = None
    shape_line = 0
    for row in reader:
        line = reader.line_num
        if not row or all(not cell.strip() for cell in row):
            continue
        if len(row) < len(header):
            problems.append(Problem("row", ",".join(row), f"{len(header)} columns", line))
        else:
            cells = {name: row[i].strip() for name, i in at.items()}
            measurement = _row(cells, line, problems)
            row_shape = _shape(cells, line, problems)
            if row_shape is not None and shape is None:
                shape, shape_line = row_shape, line
            elif row_shape is not None and row_shape != shape:
                name, value, first = next((n, v, f) for n, v, f in zip(SHAPE_COLUMNS, row_shape, shape) if v != f)
                problems.append(Problem(name, value, f"{first!r}, as on line {shape_line}: one device and one model "
                                                     "shape per measurement file", line))
            if measurement is not None:
                rows.append(measurement)
        if len(problems) >= MAX_PROBLEMS:
            break
    if problems:
        raise InputError(problems, source)
    if shape is None:
        raise InputError(Problem("rows", 0, "at least one measurement row"), source)
    device, name, *ints = shape
    model = ModelShape(name=name, **dict(zip(_SHAPE_INTS, ints)))
    return MeasurementTable(device, model, tuple(rows), source)


def _row(cells: dict[str, str], line: int, problems: list[Problem]) -> Measurement | None:
    before = len(problems)
    kind = cells["kind"]
    if kind not in KINDS:
        problems.append(Problem("kind", kind, " or ".join(KINDS), line))
    counts = {name: _count(cells[name], name, line, problems) for name in _COUNTS}
    time_us = _time(cells["time_us"], "time_us", line, problems, positive=True)
    spread_us = _time(cells["spread_us"], "spread_us", line, problems, positive=False)
    if len(problems) > before:
        return None
    if counts["prefill_tokens"] + counts["decode_seqs"] == 0:
        problems.append(Problem("prefill_tokens", 0, "a batch with at least one prefill token or decode sequence "
                                                     "(decode_seqs is 0 too)", line))
        return None
    return Measurement(kind, *counts.values(), time_us, spread_us)


def _shape(cells: dict[str, str], line: int, problems: list[Problem]) -> tuple | None:
    before = len(problems)
    ints = [_count(cells[name], name, line, problems, minimum=1) for name in _SHAPE_INTS]
    for name in ("device", "model"):
        if not cells[name]:
            problems.append(Problem(name, "", "a non-empty name", line))
    return None if len(problems) > before else (cells["device"], cells["model"], *ints)


def _count(text: str, name: str, line: int, problems: list[Problem], minimum: int = 0) -> int:
    try:
        value = int(text)
    except ValueError:
        problems.append(Problem(name, text, f"an integer >= {minimum}", line))
        return minimum
    if value < minimum:
        problems.append(Problem(name, value, f"an integer >= {minimum}", line))
    return value


def _time(text: str, name: str, line: int, problems: list[Problem], positive: bool) -> float:
    expected = "a finite number of microseconds " + ("> 0" if positive else ">= 0")
    try:
        value = float(text)
    except ValueError:
        problems.append(Problem(name, text, expected, line))
        return 0.0
    if not math.isfinite(value) or value < 0 or (positive and value == 0):
        problems.append(Problem(name, value, expected, line))
    return value
