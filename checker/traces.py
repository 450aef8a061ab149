"""Explicit request traces: batchcheck's JSON trace format and the Azure LLM inference CSV.

Everything that feeds the engine becomes a RequestSet: the requests plus the names of their classes
and tenants (requests refer to them by index).
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

from checker.errors import InputError, Problem
from checker.loading import json_lines, load_model, read_text
from checker.policy import MAX_TOKENS
from checker.requests import DEFAULT_HASH_BLOCK_TOKENS, PromptContent, RequestSpec, prefix_problem, prompt_content
from checker.workload import Workload, generate


@dataclass(frozen=True)
class RequestSet:
    specs: list[RequestSpec]
    class_names: list[str]
    tenant_names: list[str]
    source: str


def from_workload(w: Workload, source: str, limit: int | None = None) -> RequestSet:
    return RequestSet(generate(w, limit), [c.name for c in w.classes], w.tenants, source)


# ----------------------------------------------------------------------------------------- JSON trace
class TraceRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, use_attribute_docstrings=True)

    id: str | int | None = None
    arrival_ms: Annotated[float, Field(ge=0, le=1e12)]
    prompt_tokens: Annotated[int, Field(ge=1, le=MAX_TOKENS)]
    output_tokens: Annotated[int, Field(ge=1, le=MAX_TOKENS)]
    max_output_tokens: Annotated[int | None, Field(ge=1, le=MAX_TOKENS)] = None
    priority: Annotated[int, Field(ge=-1_000_000, le=1_000_000)] = 0
    tenant: str = "default"
    class_: Annotated[str, Field(alias="class")] = "default"
    cancel_after_ms: Annotated[float | None, Field(ge=0, le=1e12)] = None
    hash_ids: list[Annotated[int, Field(ge=0, le=2**53)]] | None = None
    """Mooncake-style prompt identity: each id names one block of ``hash_block_tokens`` tokens (equal ids,
    equal tokens); they must cover the prompt."""
    hash_block_tokens: Annotated[int, Field(ge=1, le=MAX_TOKENS)] = DEFAULT_HASH_BLOCK_TOKENS
    """Tokens per hash id (Mooncake traces: 512)."""
    prefix_group: Annotated[int | None, Field(ge=0, le=2**40)] = None
    """Requests of one group share their token prefix (the shorter prompt is a prefix of the longer)."""
    prompt_runs: list[tuple[int, Annotated[int, Field(ge=1, le=MAX_TOKENS)]]] | None = None
    """The prompt's token ids as runs [first id, count] of consecutive ids (what batchcheck writes for a
    request with a prompt identity, e.g. in a counterexample); they must add up to prompt_tokens."""
    external_tokens: Annotated[int, Field(ge=0, le=MAX_TOKENS)] = 0
    """With a KV connector (policy.connector: offload, decode_node): leading prompt tokens the external tier
    holds; the first admission loads those beyond the local prefix hit asynchronously."""
    load_steps: Annotated[int | None, Field(ge=1, le=MAX_TOKENS)] = 1
    """Steps the request's load takes: a load started in step t is reported done in the output of step
    t + load_steps - 1; null: never (a lost load)."""
    send_steps: Annotated[int | None, Field(ge=0, le=MAX_TOKENS)] = 0
    """On a prefill node: a request finishing in step t has its transfer confirmed in the output of step
    t + 1 + send_steps (the decode side learns of the finish a step later); null: never (its blocks stay
    pinned unless the release rule frees them)."""
    load_fails: bool = False
    """With a KV connector that loads: the request's load is reported done and failed
    (policy.connector.load_failure)."""
    grammar_steps: Annotated[int, Field(ge=0, le=MAX_TOKENS)] = 0
    """With queue.blocked_waiting skip or stop: a structured-output request whose grammar compiles for this many
    steps after its arrival step (it waits blocked meanwhile)."""
    accepted: list[Annotated[int, Field(ge=0, le=64)]] | None = None
    """With speculative decoding (policy.speculative): drafts the verifier accepts in the request's successive
    steps that verify drafts (each clamped to the drafts scheduled; past the end, or absent: none)."""

    @model_validator(mode="after")
    def _max_output(self) -> TraceRequest:
        if self.max_output_tokens is not None and self.max_output_tokens < self.output_tokens:
            raise PydanticCustomError("consistency", "", {
                "field": "max_output_tokens", "value": self.max_output_tokens,
                "expected": f">= output_tokens={self.output_tokens}"})
        problem = prefix_problem(self.hash_ids, self.hash_block_tokens, self.prompt_tokens, self.prefix_group)
        if problem is None and self.prompt_runs is not None:
            if self.hash_ids is not None or self.prefix_group is not None:
                problem = ("prompt_runs", "[...]", "no hash_ids or prefix_group with prompt_runs (one prompt identity)")
            elif sum(n for _, n in self.prompt_runs) != self.prompt_tokens:
                problem = ("prompt_runs", f"{sum(n for _, n in self.prompt_runs)} tokens",
                           f"runs adding up to prompt_tokens={self.prompt_tokens}")
        if problem is None and self.external_tokens > self.prompt_tokens:
            problem = ("external_tokens", self.external_tokens, f"<= prompt_tokens={self.prompt_tokens} (the external "
                       "tier holds a prefix of the prompt)")
        if problem is not None:
            raise PydanticCustomError("consistency", "", {"field": problem[0], "value": problem[1],
                                                          "expected": problem[2]})
        return self

    @property
    def transfer(self) -> tuple:
        return (self.external_tokens, self.load_steps, self.send_steps, self.load_fails, self.grammar_steps)

    def content(self, index: int) -> PromptContent | None:
        if self.prompt_runs is not None:
            return tuple((first, n) for first, n in self.prompt_runs)
        return prompt_content(self.hash_ids, self.hash_block_tokens, self.prompt_tokens, self.prefix_group, index)


class Trace(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    format: Literal["batchcheck-trace"]
    version: Literal[1] = 1
    description: str | None = None
    requests: list[TraceRequest]


def _build(rows: list[tuple], source: str) -> RequestSet:
    """rows: (arrival_ms, prompt, output, max_output, priority, tenant, class, cancel_after_ms[, content[,
    (external_tokens, load_steps, send_steps, load_fails, grammar_steps)[, accepted]]])."""
    order = sorted(range(len(rows)), key=lambda i: (rows[i][0], i))
    tenants = sorted({r[5] for r in rows}) or ["default"]
    classes = sorted({r[6] for r in rows}) or ["default"]
    t_index = {t: i for i, t in enumerate(tenants)}
    c_index = {c: i for i, c in enumerate(classes)}
    specs = []
    for rid, i in enumerate(order):
        arrival, prompt, output, max_out, prio, tenant, cls, cancel = rows[i][:8]
        arrival_us = round(arrival * 1000)
        specs.append(RequestSpec(
            rid=rid, arrival_us=arrival_us, prompt_len=prompt, output_len=output,
            max_output=max_out or output, priority=prio, tenant=t_index[tenant], cls=c_index[cls],
            cancel_us=None if cancel is None else arrival_us + round(cancel * 1000),
            content=rows[i][8] if len(rows[i]) > 8 else None,
            **(dict(zip(TRANSFER_FIELDS, rows[i][9])) if len(rows[i]) > 9 else {}),
            **({"accepted": rows[i][10]} if len(rows[i]) > 10 else {})))
    return RequestSet(specs, classes, tenants, source)


def load_json_trace(path: str | Path) -> RequestSet:
    trace = load_model(Trace, path)
    rows = [(r.arrival_ms, r.prompt_tokens, r.output_tokens, r.max_output_tokens, r.priority, r.tenant,
             r.class_, r.cancel_after_ms, r.content(i), r.transfer, tuple(r.accepted or ()))
            for i, r in enumerate(trace.requests)]
    return _build(rows, str(path))


def dump_json_trace(rs: RequestSet) -> dict:
    """The JSON trace of a RequestSet (round-trips through load_json_trace)."""
    return {
        "format": "batchcheck-trace", "version": 1,
        "requests": [
            {"id": s.rid, "arrival_ms": s.arrival_us / 1000, "prompt_tokens": s.prompt_len,
             "output_tokens": s.output_len, "max_output_tokens": s.max_output, "priority": s.priority,
             "tenant": rs.tenant_names[s.tenant], "class": rs.class_names[s.cls],
             "cancel_after_ms": None if s.cancel_us is None else (s.cancel_us - s.arrival_us) / 1000,
             **({} if s.content is None else {"prompt_runs": [list(run) for run in s.content]}),
             **transfer_fields(s), **({"accepted": list(s.accepted)} if s.accepted else {})}
            for s in rs.specs
        ],
    }


# RequestSpec fields of a KV connector, and of blocked waiting states (the environment's per-request choices)
TRANSFER_FIELDS = ("external_tokens", "load_steps", "send_steps", "load_fails", "grammar_steps")
_TRANSFER_DEFAULTS = (0, 1, 0, False, 0)


def transfer_fields(spec: RequestSpec) -> dict:
    """A request's KV connector fields that differ from their defaults (trace files and counterexamples carry
    only those, so that files without a connector stay as they were)."""
    values = (spec.external_tokens, spec.load_steps, spec.send_steps, spec.load_fails, spec.grammar_steps)
    return {k: v for k, v, d in zip(TRANSFER_FIELDS, values, _TRANSFER_DEFAULTS) if v != d}


# ----------------------------------------------------------------------------------------- Azure CSV
AZURE_REBASED = ("arrived_at", "num_prefill_tokens", "num_decode_tokens")  # seconds from the first request
AZURE_ORIGINAL = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")  # datetime stamps


def load_azure_csv(path: str | Path, limit: int | None = None, class_column: str | None = None) -> RequestSet:
    """The Azure LLM inference trace, in its original (TIMESTAMP, ContextTokens, GeneratedTokens) or
    Vidur-rebased (arrived_at, num_prefill_tokens, num_decode_tokens) form. One tenant; one class, or
    the value of ``class_column`` as the class."""
    source = str(path)
    reader = csv.reader(io.StringIO(read_text(path)))
    header = tuple(h.strip() for h in next(reader, ()))
    column = None
    if class_column is not None:
        if class_column not in header:
            raise InputError(Problem("--class-column", class_column, "a column of the trace: " + ", ".join(header)), source)
        column = header.index(class_column)
    if header[:3] == AZURE_REBASED:
        parse_time, origin = _seconds, None
    elif header[:3] == AZURE_ORIGINAL:
        parse_time, origin = _timestamp_s, None
    else:
        raise InputError(Problem("header", ",".join(header) or "<empty>",
                                 f"{','.join(AZURE_REBASED)} or {','.join(AZURE_ORIGINAL)}", 1), source)
    rows: list = []
    for line_no, row in enumerate(reader, start=2):
        if not row or all(not cell.strip() for cell in row):
            continue
        if len(row) < 3:
            raise InputError(Problem(f"row {line_no}", ",".join(row), "3 columns", line_no), source)
        t = parse_time(row[0], header[0], line_no, source)
        if origin is None:
            origin = t
        prompt = _positive_int(row[1], header[1], line_no, source)
        output = _positive_int(row[2], header[2], line_no, source)
        cls = "default" if column is None else (row[column].strip() if column < len(row) else "")
        rows.append(((t - origin) * 1000.0, prompt, output, None, 0, "default", cls or "default", None))
        if limit is not None and len(rows) >= limit:
            break
    if not rows:
        raise InputError(Problem("rows", 0, "at least one request row"), source)
    if any(b[0] < a[0] for a, b in zip(rows, rows[1:])):
        first = next(i for i, (a, b) in enumerate(zip(rows, rows[1:])) if b[0] < a[0])
        raise InputError(Problem(header[0], f"row {first + 3}",
                                 "rows sorted by arrival time", first + 3), source)
    return _build(rows, source)


MAX_TIME = 1e12  # an arrival time in a trace, in its unit (seconds or ms): the JSON trace's arrival_ms bound


def _seconds(cell: str, column: str, line: int, source: str) -> float:
    try:
        value = float(cell)
    except ValueError:
        raise InputError(Problem(column, cell, "seconds as a number", line), source) from None
    if not 0 <= value <= MAX_TIME:
        raise InputError(Problem(column, cell, f"a finite number >= 0 and <= {MAX_TIME:g}", line), source)
    return value


def _timestamp_s(cell: str, column: str, line: int, source: str) -> float:
    text = cell.strip()
    try:
        if "." in text:  # Azure writes 7 fractional digits; Python parses at most 6
            head, frac = text.split(".", 1)
            digits = "".join(ch for ch in frac if ch.isdigit())
            text = f"{head}.{digits[:6]}{frac[len(digits):]}"
        return datetime.fromisoformat(text).timestamp()
    except (ValueError, OverflowError, OSError):  # not a date, or one outside what the platform's clock holds
        raise InputError(Problem(column, cell, "an ISO date-time such as 2023-11-16 18:15:46.6805900", line),
                         source) from None


def _positive_int(cell: str, column: str, line: int, source: str) -> int:
    try:
        value = int(cell)
    except ValueError:
        raise InputError(Problem(column, cell, "a whole number of tokens", line), source) from None
    if not 1 <= value <= MAX_TOKENS:
        raise InputError(Problem(column, value, f"a token count in 1..{MAX_TOKENS}", line), source)
    return value


# ----------------------------------------------------------------------------------------- Mooncake JSONL
MOONCAKE_FIELDS = ("timestamp", "input_length", "output_length")


def load_mooncake_jsonl(path: str | Path, limit: int | None = None, class_column: str | None = None) -> RequestSet:
    """Mooncake-style JSON lines: ``timestamp`` (ms), ``input_length``, ``output_length`` and, optionally,
    ``hash_ids`` (each id one block of 512 tokens: the prompt's identity, which prefix caching reads)."""
    source = str(path)
    rows: list = []
    for line_no, line, record in json_lines(path):
        if not isinstance(record, dict):
            raise InputError(Problem(f"line {line_no}", line[:40], "a JSON object", line_no), source)
        for key in MOONCAKE_FIELDS:
            if key not in record:
                raise InputError(Problem(key, "<missing>", "timestamp (ms), input_length and output_length", line_no), source)
        t = _seconds(str(record["timestamp"]), "timestamp", line_no, source)
        prompt = _positive_int(str(record["input_length"]), "input_length", line_no, source)
        output = _positive_int(str(record["output_length"]), "output_length", line_no, source)
        cls = "default"
        if class_column is not None:
            if class_column not in record:
                raise InputError(Problem("--class-column", class_column, "a field of every record", line_no), source)
            cls = str(record[class_column])
        content = None
        if "hash_ids" in record:
            ids = record["hash_ids"]
            if not isinstance(ids, list) or not all(isinstance(h, int) and not isinstance(h, bool) for h in ids):
                raise InputError(Problem("hash_ids", str(ids)[:40], "a list of whole numbers", line_no), source)
            problem = prefix_problem(ids, DEFAULT_HASH_BLOCK_TOKENS, prompt, None)
            if problem is not None:
                raise InputError(Problem(*problem, line_no), source)
            content = prompt_content(ids, DEFAULT_HASH_BLOCK_TOKENS, prompt, None, len(rows))
        rows.append((t, prompt, output, None, 0, "default", cls, None, content))
        if limit is not None and len(rows) >= limit:
            break
    if not rows:
        raise InputError(Problem("rows", 0, "at least one request line"), source)
    origin = min(r[0] for r in rows)
    return _build([(r[0] - origin, *r[1:]) for r in rows], source)


# ----------------------------------------------------------------------------------------- options
@dataclass(frozen=True)
class TraceOptions:
    """How to replay a trace: a time window, a load scale, and class assignment rules."""

    window_s: tuple[float, float] | None = None  # keep arrivals in [start, end) seconds from the first
    rate_scale: float = 1.0  # replay at this multiple of the load: inter-arrival gaps are divided by it
    class_by_prompt: tuple[int, ...] = ()  # prompt-length bucket bounds: a class per bucket
    class_column: str | None = None  # a trace column (CSV) or field (JSONL) holding the class

    def check(self) -> None:
        if self.window_s is not None and not 0 <= self.window_s[0] < self.window_s[1] <= 1e9:
            raise InputError(Problem("--window", f"{self.window_s[0]}:{self.window_s[1]}", "START:END seconds with 0 <= START < END <= 1e9"))
        if not 0 < self.rate_scale <= 1e6:
            raise InputError(Problem("--rate-scale", self.rate_scale, "a factor > 0 (2 replays at twice the load)"))
        if list(self.class_by_prompt) != sorted(set(self.class_by_prompt)) or any(b < 1 for b in self.class_by_prompt):
            raise InputError(Problem("--class-by-prompt", ",".join(map(str, self.class_by_prompt)),
                                     "increasing token bounds >= 1, e.g. 512,4096"))
        if self.class_by_prompt and self.class_column:
            raise InputError(Problem("--class-by-prompt/--class-column", "both", "one class rule"))


def prompt_bucket_names(bounds: tuple[int, ...]) -> list[str]:
    edges = [None, *bounds, None]
    names = []
    for low, high in zip(edges, edges[1:]):
        if low is None:
            names.append(f"prompt<{high}")
        elif high is None:
            names.append(f"prompt>={low}")
        else:
            names.append(f"{low}<=prompt<{high}")
    return names


def apply_options(rs: RequestSet, opt: TraceOptions) -> RequestSet:
    """Window, then rate scaling (relative to the window's start), then prompt buckets."""
    opt.check()
    specs = rs.specs
    start_us = 0
    if opt.window_s is not None:
        start_us, end_us = round(opt.window_s[0] * 1e6), round(opt.window_s[1] * 1e6)
        specs = [s for s in specs if start_us <= s.arrival_us < end_us]
    classes = rs.class_names
    out = []
    for rid, s in enumerate(specs):
        arrival = start_us + round((s.arrival_us - start_us) / opt.rate_scale)
        cancel = None if s.cancel_us is None else arrival + round((s.cancel_us - s.arrival_us) / opt.rate_scale)
        cls = s.cls
        if opt.class_by_prompt:
            cls = sum(1 for bound in opt.class_by_prompt if s.prompt_len >= bound)
        out.append(replace(s, rid=rid, arrival_us=arrival, cancel_us=cancel, cls=cls))
    if opt.class_by_prompt:
        classes = prompt_bucket_names(opt.class_by_prompt)
    source = rs.source + "".join([f" window={opt.window_s[0]:g}:{opt.window_s[1]:g}s" if opt.window_s else "",
                                  f" x{opt.rate_scale:g} load" if opt.rate_scale != 1 else ""])
    return RequestSet(out, classes, rs.tenant_names, source)


def load_trace(trace: str | Path, limit: int | None = None, class_column: str | None = None) -> RequestSet:
    name = str(trace)
    if name.endswith(".csv"):
        return load_azure_csv(trace, None, class_column)
    if name.endswith(".jsonl"):
        return load_mooncake_jsonl(trace, None, class_column)
    rs = load_json_trace(trace)
    if class_column is not None:
        raise InputError(Problem("--class-column", class_column, "a CSV or JSONL trace (JSON traces carry a class)"))
    return rs


def load_requests(workload: str | Path | None = None, trace: str | Path | None = None,
                  limit: int | None = None, options: TraceOptions | None = None) -> RequestSet:
    """Requests from a workload spec (YAML) or a trace (batchcheck JSON, Azure CSV, Mooncake JSONL),
    with the trace options applied (window, load scale, class rules), then the first ``limit``."""
    opt = options or TraceOptions()
    if workload is not None:
        w = load_model(Workload, workload)  # the first `limit` built, no more (unless options reshape the set)
        rs = from_workload(w, str(workload), limit if opt == TraceOptions(class_column=opt.class_column) else None)
    elif trace is not None:
        rs = load_trace(trace, None, opt.class_column)
    else:
        raise InputError(Problem("--workload/--trace", "<none>", "one of them"))
    if opt != TraceOptions(class_column=opt.class_column):
        rs = apply_options(rs, opt)
    if limit is not None and len(rs.specs) > limit:
        rs = RequestSet(rs.specs[:limit], rs.class_names, rs.tenant_names, rs.source)
    return rs
