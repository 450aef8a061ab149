"""Mutations of batchcheck's shipped input files, and the verbs that read them, for the in-suite fuzz
(tests/fuzz/test_input_fuzz.py) and the longer campaign (bench/input_fuzz.py).

A case is one input kind, one seed file of that kind, and a mutation drawn from a ``random.Random``: a
structural one (a field replaced by a hostile value, deleted, duplicated, nested deeply; an unknown key; a
list grown) on the parsed document, written back in the file's own format, or a textual one (truncated, a
span deleted, stray characters, a line repeated). ``run_case`` feeds the file to a verb through the command
line's entry point, in process, and returns the exit code and stderr. The contract (docs/cli.md): exit 0, 1
or 3 (an accepted run), or exit 2 with ``batchcheck: error: FILE...`` naming the file; never 101, never a
traceback.
"""

from __future__ import annotations

import contextlib
import copy
import csv
import gzip
import io
import json
import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
SPEC = ROOT / "spec"
POLICY = SPEC / "policies" / "vllm_v1.yaml"

HOSTILE: list[Any] = [None, 0, -1, 1, 2**63, -(2**63), 1e308, -1e308, 1.5, 0.0001, float("nan"), float("inf"),
                      True, False, "", "x", "nan", "inf", "-1", "1e400", "../../ESCAPED", "\x00", "é" * 3, [], {},
                      [1, 2], {"a": 1}]
HOSTILE.append(json.loads("[" * 70 + "]" * 70))  # past the nesting limit
STRAY = list("{}[]:,-&*!|>'\"#\n\t \x00%@`=<") + ["NaN", "1e999", "- ", ": :", "&a", "*a", "<<: *a"]


# ----------------------------------------------------------------------------------------- structure
def _paths(data: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix]
    if isinstance(data, dict):
        for key, value in data.items():
            out += _paths(value, prefix + (key,))
    elif isinstance(data, list):
        for i, value in enumerate(data[:20]):
            out += _paths(value, prefix + (i,))
    return out


def _get(data: Any, path: tuple) -> Any:
    for part in path:
        data = data[part]
    return data


def mutate_data(data: Any, rnd: random.Random) -> Any:
    """One to three structural mutations of a copy of ``data``."""
    data = json.loads(json.dumps(data, allow_nan=True))
    for _ in range(rnd.choice((1, 1, 1, 2, 3))):
        paths = _paths(data)
        path = rnd.choice(paths)
        op = rnd.choice(("replace", "replace", "replace", "delete", "unknown", "grow", "nest", "numeric"))
        if not path:
            if op == "replace":
                data = copy.deepcopy(rnd.choice(HOSTILE))
            continue
        parent, last = _get(data, path[:-1]), path[-1]
        here = parent[last]
        if op == "replace":
            parent[last] = copy.deepcopy(rnd.choice(HOSTILE))  # a copy: later mutations must not change HOSTILE
        elif op == "delete":
            del parent[last]
        elif op == "unknown" and isinstance(here, dict):
            here[rnd.choice(("extra", "kv", "name", "0", ""))] = copy.deepcopy(rnd.choice(HOSTILE))
        elif op == "grow" and isinstance(here, list) and here:
            parent[last] = here * rnd.choice((2, 3, 50))
        elif op == "nest":
            value: Any = here
            for _ in range(rnd.choice((2, 70, 150))):
                value = [value]
            parent[last] = value
        elif op == "numeric" and isinstance(here, (int, float)) and not isinstance(here, bool):
            parent[last] = rnd.choice((here * 10**9, -here, here + 0.5, 0, here * 1e300))
    return data


def mutate_text(text: str, rnd: random.Random) -> str:
    """One to three textual mutations."""
    for _ in range(rnd.choice((1, 1, 2, 3))):
        op = rnd.choice(("truncate", "delete", "insert", "insert", "repeat", "swap"))
        n = len(text)
        i = rnd.randrange(n + 1) if n else 0
        if op == "truncate":
            text = text[:i]
        elif op == "delete":
            text = text[:i] + text[i + rnd.randint(1, 40):]
        elif op == "insert":
            text = text[:i] + rnd.choice(STRAY) + text[i:]
        else:
            lines = text.splitlines(keepends=True)
            if not lines:
                continue
            j = rnd.randrange(len(lines))
            if op == "repeat":
                lines[j:j] = [lines[j]] * rnd.choice((1, 2, 100))
            else:
                k = rnd.randrange(len(lines))
                lines[j], lines[k] = lines[k], lines[j]
            text = "".join(lines)
    return text


# ----------------------------------------------------------------------------------------- file formats
def dump(data: Any, fmt: str) -> str:
    if fmt == "json":
        return json.dumps(data, allow_nan=True)
    if fmt == "jsonl":
        rows = data if isinstance(data, list) else [data]
        return "".join(json.dumps(row, allow_nan=True) + "\n" for row in rows)
    if fmt == "csv":
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        for row in data if isinstance(data, list) else [[data]]:
            writer.writerow(row if isinstance(row, list) else [row])
        return out.getvalue()
    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True)


def load(text: str, fmt: str) -> Any:
    if fmt == "json":
        return json.loads(text)
    if fmt == "jsonl":
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    if fmt == "csv":
        return [row for row in csv.reader(io.StringIO(text))]
    return yaml.safe_load(text)


# ----------------------------------------------------------------------------------------- kinds
@dataclass(frozen=True)
class Kind:
    """An input kind: its seed files (name, text), the format mutations write it in, and the verb's argv for
    a file of it (``{file}`` and ``{dir}`` filled in; ``extra`` names companion files written beside it)."""

    name: str
    fmt: str  # yaml, json, jsonl, csv, toml, pbtxt (the last two: textual mutations only)
    seeds: Callable[[], list[tuple[str, str]]]
    argv: tuple[str, ...]
    extra: Callable[[], dict[str, str]] = dict


def _files(*patterns: str) -> Callable[[], list[tuple[str, str]]]:
    def seeds() -> list[tuple[str, str]]:
        found = sorted({p for pattern in patterns for p in ROOT.glob(pattern)})
        return [(p.name, p.read_text()) for p in found]
    return seeds


def _inline(*named: tuple[str, str]) -> Callable[[], list[tuple[str, str]]]:
    return lambda: list(named)


JSON_TRACE = json.dumps({"format": "batchcheck-trace", "version": 1, "requests": [
    {"arrival_ms": 0, "prompt_tokens": 40, "output_tokens": 3, "tenant": "a", "class": "chat"},
    {"arrival_ms": 5.5, "prompt_tokens": 700, "output_tokens": 2, "priority": 1, "cancel_after_ms": 30},
    {"arrival_ms": 9, "prompt_tokens": 64, "output_tokens": 4, "hash_ids": [1, 2], "hash_block_tokens": 32}]})
AZURE = "arrived_at,num_prefill_tokens,num_decode_tokens\n0,40,3\n0.25,700,2\n1.5,64,4\n"
AZURE_ORIGINAL = ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,40,3\n"
                  "2023-11-16 18:15:47.1000000,700,2\n")
MOONCAKE = ('{"timestamp": 0, "input_length": 40, "output_length": 3, "hash_ids": [1]}\n'
            '{"timestamp": 12, "input_length": 700, "output_length": 2}\n')
VLLM_CONFIG = "max_model_len: 4096\nnum-gpu-blocks-override: 500\nmax_num_seqs: 4\nenable_chunked_prefill: true\n"
TRTLLM_CONFIG = ("max_batch_size: 2048\nmax_num_tokens: 8192\nmax_seq_len: 8192\nenable_chunked_prefill: false\n"
                 "kv_cache_config:\n  tokens_per_block: 32\n  max_tokens: 40000\n  enable_block_reuse: true\n"
                 "scheduler_config:\n  capacity_scheduler_policy: GUARANTEED_NO_EVICT\nprint_iter_log: true\n")
TRITON_CONFIG = ('name: "llama_hf"\nbackend: "python"\nmax_batch_size: 8\ninput [ { name: "text_input" data_type: '
                 'TYPE_STRING dims: [ 1 ] } ]\ndynamic_batching {\n  max_queue_delay_microseconds: 0\n}\n'
                 'instance_group [ { count: 1, kind: KIND_GPU, gpus: [ 0 ] } ]\n')


def _checklog_log() -> list[tuple[str, str]]:
    with gzip.open(ROOT / "tests" / "data" / "checklog" / "vllm_fcfs.log.jsonl.gz", "rt") as f:
        lines = [next(f) for _ in range(12)]
    return [("vllm_fcfs.log.jsonl", "".join(lines))]


def _checklog_arrivals() -> dict[str, str]:
    return {"arrivals.json": (ROOT / "tests" / "data" / "checklog" / "arrivals.json").read_text()}


KINDS: dict[str, Kind] = {k.name: k for k in [
    Kind("policy", "yaml", _files("spec/policies/*.yaml", "spec/policies/*/*.yaml"), ("validate", "{file}")),
    Kind("workload", "yaml", _files("spec/workloads/*.yaml", "spec/slo/*.yaml", "spec/audit/*.yaml"),
         ("validate", "{file}")),
    Kind("profile", "json", _files("spec/profiles/*.json"), ("validate", "{file}")),
    Kind("trace", "json", _inline(("t.json", JSON_TRACE)), ("validate", "{file}")),
    Kind("trace-sim", "json", _inline(("t.json", JSON_TRACE)),
         ("simulate", str(POLICY), "--trace", "{file}", "--limit", "5")),
    Kind("azure", "csv", _inline(("a.csv", AZURE), ("o.csv", AZURE_ORIGINAL)),
         ("simulate", str(POLICY), "--trace", "{file}", "--limit", "5")),
    Kind("mooncake", "jsonl", _inline(("m.jsonl", MOONCAKE)),
         ("simulate", str(POLICY), "--trace", "{file}", "--limit", "5")),
    Kind("counterexample", "json", _files("counterexamples/*.json"), ("replay", "{file}")),
    Kind("vllm-config", "yaml", _inline(("vllm.yaml", VLLM_CONFIG)), ("import", "vllm", "--config", "{file}")),
    Kind("trtllm-config", "yaml", _inline(("llm_api.yaml", TRTLLM_CONFIG)), ("import", "trtllm", "{file}")),
    Kind("triton-config", "pbtxt", _inline(("config.pbtxt", TRITON_CONFIG)),
         ("import", "triton", "{file}", "--max-model-len", "8192")),
    Kind("ci-config", "toml", _files("batchcheck.toml"), ("ci-config", "{file}")),
    Kind("checklog-log", "jsonl", _checklog_log,
         ("check-log", str(ROOT / "tests/data/checklog/vllm_fcfs.yaml"), "{file}", "--arrivals", "{dir}/arrivals.json"),
         _checklog_arrivals),
    Kind("checklog-conformance", "jsonl", _checklog_log,
         ("check-log", str(ROOT / "tests/data/checklog/vllm_fcfs.yaml"), "{file}", "--arrivals", "{dir}/arrivals.json",
          "--conformance"), _checklog_arrivals),
    Kind("checklog-arrivals", "json", lambda: list(_checklog_arrivals().items()),
         ("check-log", str(ROOT / "tests/data/checklog/vllm_fcfs.yaml"), "{dir}/log.jsonl", "--arrivals", "{file}"),
         lambda: {"log.jsonl": _checklog_log()[0][1]}),
]}


def mutant(kind: Kind, seed: tuple[str, str], rnd: random.Random) -> str:
    """A mutated text of ``seed`` (structural where the format allows it, else textual)."""
    name, text = seed
    if kind.fmt in ("toml", "pbtxt") or rnd.random() < 0.3:
        return mutate_text(text, rnd)
    try:
        data = load(text, kind.fmt)
    except Exception:  # noqa: BLE001 -- a seed the mutator cannot parse: mutate its text
        return mutate_text(text, rnd)
    mutated = mutate_data(data, rnd)
    try:
        return dump(mutated, kind.fmt)
    except RecursionError:  # PyYAML's representer recurses per level: write it as JSON, which is YAML too
        return json.dumps(mutated, allow_nan=True)


def run_case(kind: Kind, seed: tuple[str, str], text: str, folder: Path) -> tuple[int, str, Path]:
    """Write the mutant into ``folder`` and run the kind's verb on it in process: (exit code, stderr, file)."""
    from checker.cli import main

    folder.mkdir(parents=True, exist_ok=True)
    for name, companion in kind.extra().items():
        (folder / name).write_text(companion)
    path = folder / seed[0]
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    argv = [a.replace("{file}", str(path)).replace("{dir}", str(folder)) for a in kind.argv]
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        if argv[0] == "ci-config":  # ci itself would run every check: its config reader, as ci calls it first
            code = _ci_config(argv[1])
        else:
            code = main(argv)
    return code, err.getvalue(), path


def _ci_config(path: str) -> int:
    import sys

    from checker.ci.config import load_config
    from checker.errors import BatchcheckError

    try:
        load_config(path)
    except BatchcheckError as exc:
        print(f"batchcheck: error: {exc}", file=sys.stderr)
        return int(exc.exit_code)
    return 0


HEARTBEAT = re.compile(r"^batchcheck: [a-z-]+ running \(\d+ s\)[^\n]*\n", re.MULTILINE)


def _without_heartbeats(err: str) -> str:
    """stderr less the progress lines a long run prints every few seconds (commands/shell.py: not an error)."""
    return HEARTBEAT.sub("", err)


def problem(code: int, err: str, path: Path, folder: Path) -> str | None:
    """What breaks the contract in a case's outcome, or None."""
    if code == 101 or "internal error" in err or "Traceback" in err:
        return f"internal error (exit {code}): {err.strip()[-300:]}"
    if code not in (0, 1, 2, 3):
        return f"exit {code}"
    err = _without_heartbeats(err)
    if code == 2:
        if not err.startswith("batchcheck: error: "):
            return f"exit 2 without the error line: {err[:200]!r}"
        first = err.splitlines()[0]
        # a problem (path=value (expected ...)) names the file, or the flag that stands for a value it lacks;
        # a usage message (free text: e.g. an option that neither the file nor the command line gave) need not
        flag = first.removeprefix("batchcheck: error: ").startswith("--")
        if " (expected " in first and str(path) not in first and str(folder) not in first and not flag:
            return f"exit 2 without the file: {first[:200]!r}"
    return None
