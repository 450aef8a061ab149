"""Service curve: how long one iteration takes, as a function of the batch it runs.

A profile is a JSON file in spec/profiles/. The default one is linear and illustrative; calibrated
profiles (fitted on real GPU measurements) use the same format, with one piece per range of batch
size where the measured curve bends.
"""

from __future__ import annotations

from bisect import bisect_left
from itertools import accumulate
from pathlib import Path
from typing import Annotated, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, model_validator

from checker.examples import examples_root
from checker.loading import load_model

SPEC_DIR = examples_root() or Path(__file__).resolve().parent.parent / "spec"  # the shipped examples (checker.examples)
DEFAULT_PROFILE = SPEC_DIR / "profiles" / "default_linear.json"

NonNeg = Annotated[float, Field(ge=0.0, le=1e9)]


class BatchShape(Protocol):
    """What an iteration's time depends on: a step's decision (checker.semantics.decision.StepDecision)
    has these fields; the profile, an input, knows nothing else of the semantics."""

    @property
    def num_prefill_tokens(self) -> int: ...
    @property
    def prefill_attention(self) -> int: ...
    @property
    def num_decode_seqs(self) -> int: ...
    @property
    def decode_kv_tokens(self) -> int: ...


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


class Piece(_Strict):
    """Iteration time in microseconds = overhead + sum of coefficient * feature, for batches with
    at most ``max_batched_tokens`` scheduled tokens (None: no upper end)."""

    max_batched_tokens: Annotated[int | None, Field(ge=1)] = None
    overhead_us: NonNeg
    per_prefill_token_us: NonNeg = 0.0
    per_prefill_attention_us: NonNeg = 0.0  # per (chunk token x context token) of prefill attention
    per_decode_seq_us: NonNeg = 0.0
    per_decode_kv_token_us: NonNeg = 0.0  # per context token read by a decode


class ModelShape(_Strict):
    name: str
    layers: Annotated[int, Field(ge=1)]
    hidden: Annotated[int, Field(ge=1)]
    heads: Annotated[int, Field(ge=1)]
    kv_heads: Annotated[int, Field(ge=1)]
    dtype_bytes: Annotated[int, Field(ge=1, le=8)] = 2
    tensor_parallel: Annotated[int, Field(ge=1)] = 1

    @property
    def kv_bytes_per_token(self) -> int:
        head_dim = self.hidden // self.heads
        return 2 * self.layers * self.kv_heads * head_dim * self.dtype_bytes // self.tensor_parallel


class MeasuredRange(_Strict):
    """The largest batch shapes a calibrated profile was fitted on; beyond them its times are
    extrapolated (checker/calibrate/coverage.py says so)."""

    max_batched_tokens: Annotated[int, Field(ge=1)]
    """Most scheduled tokens (prefill tokens + decode sequences) in a measured batch."""
    max_prefill_tokens: Annotated[int, Field(ge=0)]
    max_decode_seqs: Annotated[int, Field(ge=0)]
    max_context: Annotated[int, Field(ge=1)]
    """Longest context (tokens) of any sequence in a measured batch."""


class Calibration(_Strict):
    """How a measured profile was fitted: on which table, with which terms, over which range."""

    measurements: str
    """The measurement CSV, relative to the profile's directory."""
    train_rows: Annotated[int, Field(ge=1)]
    """Measured shapes the coefficients were fitted on."""
    held_out_rows: Annotated[int, Field(ge=0)]
    """Measured shapes kept out of the fit; ``fit_error`` ``held_out_*`` is measured on them."""
    terms: list[str]
    """The terms the fit could use (overhead, prefill_token, prefill_attention, decode_seq,
    decode_kv_token); the coefficients of the others are 0."""
    measured_range: MeasuredRange


class Profile(_Strict):
    format: Literal["batchcheck-profile"] = "batchcheck-profile"
    version: Literal[1] = 1
    name: str
    device: str
    measured: bool = False  # True only for profiles fitted on real measurements
    model: ModelShape | None = None
    pieces: Annotated[list[Piece], Field(min_length=1)]
    fit_error: dict[str, float] | None = None
    source: str | None = None
    calibration: Calibration | None = None
    # step_us's copy of the pieces as plain tuples (max_batched_tokens, overhead, per prefill token, per prefill
    # attention, per decode sequence, per decode KV token), with the list it was made from (model_copy with
    # new pieces makes it again): the engine calls step_us once per step.
    _table: tuple[object, list[tuple[int | None, float, float, float, float, float]]] = PrivateAttr(
        default=(None, []))

    def _pieces_table(self) -> list[tuple[int | None, float, float, float, float, float]]:
        made_from, table = self._table
        if made_from is not self.pieces:
            table = [(p.max_batched_tokens, p.overhead_us, p.per_prefill_token_us, p.per_prefill_attention_us,
                      p.per_decode_seq_us, p.per_decode_kv_token_us) for p in self.pieces]
            self._table = (self.pieces, table)
        return table

    @model_validator(mode="after")
    def _pieces_ordered(self) -> Profile:
        ends = [p.max_batched_tokens for p in self.pieces]
        if ends[-1] is not None or any(e is None for e in ends[:-1]) or ends[:-1] != sorted(ends[:-1]):
            from pydantic_core import PydanticCustomError
            raise PydanticCustomError("consistency", "", {
                "field": "pieces", "value": ends,
                "expected": "increasing max_batched_tokens, the last piece open-ended (null)"})
        return self

    def piece_for(self, tokens: int) -> Piece:
        for piece in self.pieces:
            if piece.max_batched_tokens is None or tokens <= piece.max_batched_tokens:
                return piece
        return self.pieces[-1]

    def iteration_us(self, prefill_tokens: int, prefill_attention: int, decode_seqs: int,
                     decode_kv_tokens: int) -> int:
        p = self.piece_for(prefill_tokens + decode_seqs)
        t = (p.overhead_us + p.per_prefill_token_us * prefill_tokens
             + p.per_prefill_attention_us * prefill_attention + p.per_decode_seq_us * decode_seqs
             + p.per_decode_kv_token_us * decode_kv_tokens)
        return max(1, round(t))

    def decode_steps_us(self, seqs: int, context: int, max_steps: int, start_us: int,
                        horizon_us: int | None) -> list[int]:
        """Durations of up to max_steps consecutive pure-decode steps of ``seqs`` requests whose
        contexts sum to ``context`` before the first one, each starting before horizon_us. Equal, term
        for term, to iteration_us(0, 0, seqs, context + seqs * j) for j = 1, 2, ..."""
        p = self.piece_for(seqs)
        base = p.overhead_us + p.per_decode_seq_us * seqs  # the prefill terms are 0 (x + 0.0 == x)
        per_kv = p.per_decode_kv_token_us
        if per_kv >= 0 and seqs > 0:  # durations never fall, so the first is the shortest
            first = round(base + per_kv * (context + seqs))
            if first >= 1:  # none needs max(1, .): the loop's values, ~2.5x faster (~15% of the engine)
                if horizon_us is not None:  # at most ceil((horizon - start) / first) steps start before it
                    max_steps = min(max_steps, max(0, -(-(horizon_us - start_us) // first)))
                tokens = range(context + seqs, context + seqs * max_steps + 1, seqs)  # context + seqs * j
                durations = [round(base + per_kv * t) for t in tokens]
                if horizon_us is not None:
                    starts = list(accumulate(durations, initial=start_us))
                    del durations[bisect_left(starts, horizon_us, 0, len(durations)):]
                return durations
        durations: list[int] = []
        t = start_us
        for j in range(1, max_steps + 1):
            if horizon_us is not None and t >= horizon_us:
                break
            dt = max(1, round(base + per_kv * (context + seqs * j)))
            durations.append(dt)
            t += dt
        return durations

    def step_us(self, d: BatchShape) -> int:
        """iteration_us(d.num_prefill_tokens, d.prefill_attention, d.num_decode_seqs, d.decode_kv_tokens), the
        same float operations in the same order (so the same integer), without the pydantic attribute reads."""
        prefill, attention, seqs, kv = d.num_prefill_tokens, d.prefill_attention, d.num_decode_seqs, d.decode_kv_tokens
        tokens = prefill + seqs
        made_from, table = self._table
        if made_from is not self.pieces:
            table = self._pieces_table()
        for end, overhead, per_prefill, per_attention, per_seq, per_kv in table:
            if end is None or tokens <= end:
                break
        t = overhead + per_prefill * prefill + per_attention * attention + per_seq * seqs + per_kv * kv
        return max(1, round(t))


def load_profile(path: str | Path | None) -> Profile:
    return load_model(Profile, path or DEFAULT_PROFILE)
