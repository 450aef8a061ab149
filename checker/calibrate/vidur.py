"""Iteration times built from Vidur's measured GPU operator profiles (MIT, the Vidur project).

A Vidur profile directory holds ``mlp.csv`` (the non-attention operators of one layer, by number of
tokens and tensor-parallel degree), ``attention.csv`` (prefill attention by chunk size and KV length,
decode attention by batch size and KV length) and ``cpu_overheads.csv`` (engine CPU time per step, by
model and batch size). Times are milliseconds; this module reads the medians.

One iteration of a batch = the embedding once, plus for every layer the operators the batch runs
(Vidur's accounting: input and post-attention norms, QKV projection, rotary embedding, attention,
attention output reshape, output projection, MLP up, activation and down projections, the residual
add), plus the CPU overhead of a step (schedule, prepare inputs, sampler, process outputs). The
operator tables have no all-reduce times, so tensor-parallel communication is not included.
Non-attention operators are interpolated linearly in the number of tokens between profiled counts
(exact at them); attention rows and CPU overheads are used at their profiled shapes.

Any model: the profile files do not say how many layers the model has, so that comes from the model's
Hugging Face ``config.json`` (``num_hidden_layers``) or a flag (``--layers``), or a preset. Real profiles of
other models differ from llama-2-70b's in documented ways, handled so (``VidurImport.notes`` lists each):

- an operator of LAYER_OPERATORS whose columns the file lacks is not in that model (phi-2 has no
  post-attention norm: attention and MLP read the same normed input) and counts 0; the projections and the
  MLP (REQUIRED_OPERATORS) must be there;
- a row with an empty cell where a time or shape is needed was not profiled for that operator: it is left
  out (counted); a file with no usable row is an error;
- without ``cpu_overheads.csv`` (Vidur's compute profiles of other models ship none; Vidur itself does not
  model CPU overhead by default) the CPU time per step is 0;
- without ``attention.csv`` there is nothing to build iterations from: an error that says how to get one.
"""

from __future__ import annotations

import csv
import io
import math
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from checker.calibrate.measurements import Measurement, MeasurementTable
from checker.errors import InputError, Problem
from checker.loading import read_text
from checker.profile import ModelShape

MS = 1000.0  # microseconds per millisecond
LAYER_OPERATORS = ("input_layernorm", "attn_pre_proj", "attn_rope", "attn_post_proj", "post_attention_layernorm",
                   "mlp_up_proj", "mlp_act", "mlp_down_proj", "add")
MODEL_OPERATORS = ("emb",)  # once per iteration, not per layer
REQUIRED_OPERATORS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")  # present in every model
CPU_PARTS = ("schedule_median", "sampler_e2e_median", "prepare_inputs_e2e_median", "process_model_outputs_median")
ATTENTION_SHAPE = ("n_embd", "n_q_head", "n_kv_head", "num_tensor_parallel_workers", "batch_size",
                   "prefill_chunk_size", "kv_cache_size", "is_prefill")


@dataclass(frozen=True)
class VidurModel:
    """What the profile files do not say: the model's layer count and the name cpu_overheads.csv uses."""

    name: str
    layers: int
    cpu_model_name: str


LLAMA_2_70B = VidurModel("llama-2-70b", 80, "meta-llama/Llama-2-70b-hf")
KNOWN_MODELS = {m.name: m for m in (LLAMA_2_70B,)}
MAX_LAYERS = 1024


def model_from_hf_config(path: str | Path, name: str | None = None) -> VidurModel:
    """The layer count (and the name the CPU-overhead rows use) from a Hugging Face config.json."""
    import json

    from checker.loading import parse_json

    source = str(path)
    try:
        data = parse_json(read_text(path), source)
    except json.JSONDecodeError as exc:
        raise InputError(Problem("", "<unparsable>", f"JSON: {exc.msg}", exc.lineno), source) from None
    layers = data.get("num_hidden_layers", data.get("n_layer")) if isinstance(data, dict) else None
    if not isinstance(layers, int) or isinstance(layers, bool) or not 1 <= layers <= MAX_LAYERS:
        raise InputError(Problem("num_hidden_layers", layers, f"the model's layer count, 1..{MAX_LAYERS} (a Hugging "
                                 "Face config.json)"), source)
    model = name or data.get("_name_or_path") or Path(path).resolve().parent.name
    return VidurModel(str(model).rsplit("/", 1)[-1].lower(), layers, str(model))


@dataclass(frozen=True)
class Grid:
    """Which shapes to build: every profiled attention shape, thinned by a stride, plus mixed batches."""

    prefill_stride: int = 4  # every n-th profiled (chunk, KV length) pair
    decode_stride: int = 8  # every n-th profiled (batch size, KV length) pair
    mixed_chunks: tuple[int, ...] = (64, 256, 512, 1024, 2048)
    mixed_prefill_kv: tuple[int, ...] = (0, 512, 1536)
    mixed_decode_batches: tuple[int, ...] = (1, 8, 32, 64, 128)
    mixed_decode_kv: tuple[int, ...] = (128, 1024, 2048, 4032)


def _table(path: Path) -> tuple[list[str], list[list[str]]]:
    if not path.is_file():
        if path.name == "attention.csv":
            raise InputError(Problem("attention.csv", "<missing>", "Vidur's attention profile: no attention profile "
                                     f"in {path.parent} (Vidur profiles attention apart from the MLP operators: run "
                                     "`python -m vidur.profiling.attention.main` for this model and GPU, or add "
                                     "the attention.csv of the same model, GPU and tensor-parallel degree)"), str(path))
        raise InputError(Problem("", str(path), "an existing Vidur profile file"), str(path))
    reader = csv.reader(io.StringIO(read_text(path)))
    header = next(reader, [])
    return header, [row for row in reader if row]


def _require(header: list[str], needed: list[str], path: Path) -> None:
    missing = [c for c in needed if c not in header]
    if missing:
        raise InputError(Problem("columns", "<missing " + ", ".join(missing) + ">",
                                 "Vidur's profile columns (docs/calibration.md)", 1), str(path))


def _number(text: str, column: str, line: int, path: Path) -> float:
    try:
        value = float(text)
    except ValueError:
        raise InputError(Problem(column, text, "a number", line), str(path)) from None
    if not math.isfinite(value) or value < 0:
        raise InputError(Problem(column, value, "a finite time or count >= 0", line), str(path))
    return value


def _median(op: str) -> str:
    return f"time_stats.{op}.median"


class _LayerOps:
    """Non-attention operator times (us) by token count, for one tensor-parallel degree."""

    def __init__(self, path: Path, tensor_parallel: int, notes: list[str] | None = None):
        header, rows = _table(path)
        present = [op for op in LAYER_OPERATORS if _median(op) in header]
        absent = [op for op in LAYER_OPERATORS if op not in present]
        _require(header, [_median(op) for op in REQUIRED_OPERATORS + MODEL_OPERATORS]
                 + ["num_tokens", "num_tensor_parallel_workers", "n_embd", "n_head", "n_kv_head"], path)
        if absent and notes is not None:
            notes.append(f"{path.name}: no {', '.join(absent)} columns: not in this model, counted 0")
        at = {c: header.index(c) for c in header}
        by_tokens: dict[float, list[tuple[float, float]]] = defaultdict(list)
        self.shape: tuple[int, int, int] | None = None
        needed = ["num_tensor_parallel_workers", "num_tokens", "n_embd", "n_head", "n_kv_head"] + \
            [_median(op) for op in present + list(MODEL_OPERATORS)]
        skipped = 0
        for line, row in enumerate(rows, start=2):
            if any(row[at[c]].strip() == "" for c in needed):
                skipped += 1  # not profiled for every operator this model has: left out
                continue
            if int(_number(row[at["num_tensor_parallel_workers"]], "num_tensor_parallel_workers", line, path)) \
                    != tensor_parallel:
                continue
            self.shape = tuple(int(_number(row[at[c]], c, line, path)) for c in ("n_embd", "n_head", "n_kv_head"))
            layer = sum(_number(row[at[_median(op)]], _median(op), line, path) for op in present)
            model = sum(_number(row[at[_median(op)]], _median(op), line, path) for op in MODEL_OPERATORS)
            by_tokens[_number(row[at["num_tokens"]], "num_tokens", line, path)].append((layer * MS, model * MS))
        if skipped and notes is not None:
            notes.append(f"{path.name}: {skipped} row(s) with empty cells left out")
        if not by_tokens:
            raise InputError(Problem("num_tensor_parallel_workers", tensor_parallel,
                                     "a tensor-parallel degree with rows in mlp.csv"), str(path))
        self.tokens = np.array(sorted(by_tokens))
        self.layer_us = np.array([np.mean([t[0] for t in by_tokens[n]]) for n in self.tokens])
        self.model_us = np.array([np.mean([t[1] for t in by_tokens[n]]) for n in self.tokens])

    def covers(self, tokens: int) -> bool:
        return self.tokens[0] <= tokens <= self.tokens[-1]

    def __call__(self, tokens: int, layers: int) -> float:
        return layers * float(np.interp(tokens, self.tokens, self.layer_us)) + float(
            np.interp(tokens, self.tokens, self.model_us))


class _CpuOverhead:
    """Engine CPU time per step (us) by batch size, for one model; clamped outside the profiled sizes. Without
    the file: 0 (``missing``)."""

    def __init__(self, path: Path, model_name: str):
        self.missing = not path.is_file()
        if self.missing:
            self.batch, self.us = np.array([1.0]), np.array([0.0])
            return
        header, rows = _table(path)
        _require(header, list(CPU_PARTS) + ["model_name", "batch_size"], path)
        at = {c: header.index(c) for c in header}
        by_batch: dict[float, list[float]] = defaultdict(list)
        for line, row in enumerate(rows, start=2):
            if row[at["model_name"]] != model_name:
                continue
            total = sum(_number(row[at[c]], c, line, path) for c in CPU_PARTS)
            by_batch[_number(row[at["batch_size"]], "batch_size", line, path)].append(total * MS)
        if not by_batch:
            raise InputError(Problem("model_name", model_name, "a model with rows in cpu_overheads.csv"), str(path))
        self.batch = np.array(sorted(by_batch))
        self.us = np.array([np.mean(by_batch[b]) for b in self.batch])

    def __call__(self, batch_size: int) -> float:
        return float(np.interp(batch_size, self.batch, self.us))


@dataclass(frozen=True)
class _Attention:
    prefill: dict[tuple[int, int], float]  # (chunk, kv before it) -> us per layer
    decode: dict[tuple[int, int], float]  # (batch size, kv per sequence) -> us per layer
    shape: tuple[int, int, int, int]  # hidden, heads, kv heads, tensor parallel
    skipped: int = 0  # rows with an empty cell where this phase needs one


def _attention(path: Path) -> _Attention:
    header, rows = _table(path)
    times = ["time_stats.attn_prefill.median", "time_stats.attn_decode.median",
             "time_stats.attn_input_reshape.median", "time_stats.attn_output_reshape.median"]
    _require(header, times + list(ATTENTION_SHAPE), path)
    at = {c: header.index(c) for c in header}
    prefill: dict[tuple[int, int], list[float]] = defaultdict(list)
    decode: dict[tuple[int, int], list[float]] = defaultdict(list)
    shapes = set()
    skipped = 0
    for line, row in enumerate(rows, start=2):
        is_prefill = row[at["is_prefill"]] == "True"
        core = "time_stats.attn_prefill.median" if is_prefill else "time_stats.attn_decode.median"
        key_columns = ("prefill_chunk_size", "kv_cache_size") if is_prefill else ("batch_size", "kv_cache_size")
        if any(row[at[c]].strip() == "" for c in (core, times[2], times[3], *ATTENTION_SHAPE[:4], *key_columns)):
            skipped += 1  # this phase was not profiled for this shape: left out
            continue
        shapes.add(tuple(int(_number(row[at[c]], c, line, path)) for c in ATTENTION_SHAPE[:4]))
        us = MS * sum(_number(row[at[c]], c, line, path) for c in (core, times[2], times[3]))
        if is_prefill:
            key = (int(row[at["prefill_chunk_size"]]), int(row[at["kv_cache_size"]]))
            prefill[key].append(us)
        else:
            key = (int(row[at["batch_size"]]), int(row[at["kv_cache_size"]]))
            decode[key].append(us)
    if len(shapes) != 1:
        raise InputError(Problem("n_embd,n_q_head,n_kv_head,num_tensor_parallel_workers", sorted(shapes),
                                 "one model shape per attention.csv (and at least one row without empty cells)"),
                         str(path))
    return _Attention({k: float(np.median(v)) for k, v in prefill.items()},
                      {k: float(np.median(v)) for k, v in decode.items()}, shapes.pop(), skipped)


def import_vidur(directory: str | Path, model: VidurModel = LLAMA_2_70B, grid: Grid = Grid(),
                 device: str | None = None) -> MeasurementTable:
    """Per-iteration times for prefill, decode and mixed batches, summed from the operator profiles."""
    root = Path(directory)
    if not root.is_dir():
        raise InputError(Problem("", str(root), "a directory with Vidur's mlp.csv, attention.csv and "
                                 "cpu_overheads.csv"), str(root))
    notes: list[str] = []
    attention = _attention(root / "attention.csv")
    if attention.skipped:
        notes.append(f"attention.csv: {attention.skipped} row(s) with empty cells left out")
    hidden, heads, kv_heads, tensor_parallel = attention.shape
    ops = _LayerOps(root / "mlp.csv", tensor_parallel, notes)
    if ops.shape != (hidden, heads, kv_heads):
        raise InputError(Problem("n_embd,n_head,n_kv_head", list(ops.shape or ()),
                                 f"{[hidden, heads, kv_heads]}, the shape in attention.csv"), str(root / "mlp.csv"))
    cpu = _CpuOverhead(root / "cpu_overheads.csv", model.cpu_model_name)
    if cpu.missing:
        notes.append("no cpu_overheads.csv: the engine's CPU time per step is not included (0)")
    layers = model.layers

    def iteration(tokens: int, seqs: int, attention_us: float) -> float:
        return ops(tokens, layers) + layers * attention_us + cpu(seqs)

    rows: list[Measurement] = []
    for chunk, kv in sorted(attention.prefill)[::grid.prefill_stride]:
        if ops.covers(chunk):
            rows.append(Measurement("prefill", chunk, chunk * (kv + chunk), 0, 0, kv + chunk,
                                    iteration(chunk, 1, attention.prefill[chunk, kv])))
    for batch, kv in sorted(attention.decode)[::grid.decode_stride]:
        if ops.covers(batch):
            rows.append(Measurement("decode", 0, 0, batch, batch * (kv + 1), kv + 1,
                                    iteration(batch, batch, attention.decode[batch, kv])))
    for chunk in grid.mixed_chunks:
        for pkv in grid.mixed_prefill_kv:
            for batch in grid.mixed_decode_batches:
                for dkv in grid.mixed_decode_kv:
                    if (chunk, pkv) not in attention.prefill or (batch, dkv) not in attention.decode \
                            or not ops.covers(chunk + batch):
                        continue
                    us = attention.prefill[chunk, pkv] + attention.decode[batch, dkv]
                    rows.append(Measurement("mixed", chunk, chunk * (pkv + chunk), batch, batch * (dkv + 1),
                                            max(pkv + chunk, dkv + 1), iteration(chunk + batch, batch + 1, us)))
    if not rows:
        raise InputError(Problem("", str(root), "profiles with at least one prefill or decode shape"), str(root))
    shape = ModelShape(name=model.name, layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads,
                       dtype_bytes=2, tensor_parallel=tensor_parallel)
    name = device or f"vidur-{root.name}"
    return MeasurementTable(name, shape, tuple(rows), str(root), tuple(notes))
