"""Runtime verification of a canary: check the invariant catalogue on a real scheduler's per-step log.

Log format (JSON lines, one per step; docs/check-log.md): ``step`` (int), ``scheduled`` (object: request
id -> tokens scheduled in the step), ``preempted``, ``finished``, ``aborted`` (lists of request ids),
``running``, ``waiting`` (counts after the step), ``free_blocks`` (int). Arrivals: a JSON list of
``{id, arrival_step, prompt_tokens, output_tokens, priority, abort_step?, prefix_group?, hash_ids?,
hash_block_tokens?}``. This is what one gets by driving vLLM's v1 ``Scheduler`` with ``schedule()`` /
``update_from_output()`` and a fake runner (shared/tools/vllm-scheduler).

The log is turned into the same frames the engine produces (per request: status, computed and generated
tokens, blocks of its computed tokens, preemptions), with the observed KV in use (pool - free_blocks),
so the very same invariant predicates run on it. ``--conformance`` also runs the engine on the arrivals
under the policy and compares the two step by step.

Two paths compute the same verdicts:

- the streaming checker (``run_check_log``, what the CLI runs): the log is read one line at a time (or
  followed while it grows), each step touches only the requests the line names, the invariants are
  evaluated on what changed (``Incremental``; restricted frames, docs/check-log.md "How it scales"), and
  the engine runs in lockstep with the log (``Lockstep``). Memory does not grow with the log.
- the reference path (``load_log``, ``observed_frames``, ``check_log``, ``conformance``): whole frames of
  every request at every step, kept in memory. Tests pin the streaming checker to it.
"""

from __future__ import annotations

import json
import os
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import MISSING, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, NamedTuple

from checker.engine import _Clock, quiet_stretch
from checker.errors import InputError, InternalError, Problem
from checker.fastforward import apply_stretch, finish_stretch, next_steps_are_quiet_decodes
from checker.frames import Frame, TraceContext
from checker.loading import json_lines, load_document
from checker.inputfiles import PolicyInput
from checker.policy import MAX_TOKENS, Policy, ReleaseRule, Scheduler
from checker.requests import DEFAULT_HASH_BLOCK_TOKENS, RequestSpec, prefix_problem, prompt_content
from checker.semantics import speculative
from checker.semantics.kv import blocks_for
from checker.semantics.state import FIELDS, Reason, SchedulerState, Status
from checker.semantics.step import step
from checker.smt.encode import SlotParams
from checker.smt.ops import IntOps
from checker.verify.replay import replay_fixed_clock
from invariants import catalogue
from invariants.catalogue import Invariant

try:  # a faster parser of the log's lines when installed; json (same values, same errors) otherwise
    import orjson
except ImportError:  # pragma: no cover - depends on the environment
    orjson = None

STEP_US = 1000  # log steps are placed 1 ms apart on the engine's clock
LOG_KEYS = ("step", "scheduled", "preempted", "finished", "aborted", "running", "waiting", "free_blocks")
MAX_STEP = 10_000_000  # a log's step numbers, and arrivals' arrival_step / abort_step (docs/cli.md, Input limits)
CHECK_LOG_INVARIANTS = ("kv_never_overcommitted", "token_budget", "seq_cap", "request_conservation",
                        "scheduled_requests_run", "cancellation_releases")  # the last with the policy's release lag
# Invariants that read the blocks each request holds, which a log cannot show once cache hits and shared blocks
# exist (under kv.prefix_caching.enabled they would fail on a correct server, and an aborted request's blocks
# are taken as freed at once): not checked there.
CACHE_BLIND = ("request_conservation", "cancellation_releases")
# (policy -> the rule applies, the invariants it blinds, what the policy has, why a log cannot show per-request
# blocks then). A KV connector too: requests hold blocks while loading and after finishing, and a log line does not
# say how many. SGLang's radix cache: a request's first chunk starts after its cached prefix, which the record does
# not give, so neither its blocks nor whether its prompt was computed (prompt_fully_computed) can be read.
_BLIND_RULES = (
    (lambda p, held: p.kv.prefix_caching.enabled, CACHE_BLIND, "kv.prefix_caching.enabled",
     "a log does not say how many tokens each cache hit gave a request or which blocks requests share",
     "prefix caching", "a log shows no cache hits or shared blocks; --conformance compares the engine, which models "
     "the cache"),
    (lambda p, held: p.connector.enabled and not held, CACHE_BLIND, "connector.kind other than none",
     "a log does not say how many blocks a loading, loaded or pinned request holds",
     "a KV connector", "a log does not say how many blocks a loading, loaded or pinned request holds; --conformance "
     "compares the engine, which models them"),
    (lambda p, held: p.scheduler is Scheduler.SGLANG and p.sglang.radix_cache,
     (*CACHE_BLIND, "prompt_fully_computed"), "sglang.radix_cache true",
     "an SGLang step record does not say how many tokens each radix-cache hit gave a request or which pages the "
     "tree shares", "SGLang's radix cache", "a record shows no cache hits; --conformance compares the engine, which "
     "models the tree, its evictable and protected tokens included"),
)
MAX_NOTES = 5  # notes kept (the CLI prints them); the count of all is kept too

PENDING, WAITING, RUNNING = int(Status.PENDING), int(Status.WAITING), int(Status.RUNNING)
FINISHED, CANCELLED = int(Status.FINISHED), int(Status.CANCELLED)
ABORTED, STOPPED = int(Reason.ABORTED), int(Reason.STOPPED)
DONE = (FINISHED, CANCELLED)
LOADING = int(Status.LOADING)


def loaded_tokens(spec: RequestSpec) -> int:
    """What a load computed for the request when it is promoted: its external tokens, one fewer when they cover
    the whole prompt (the last token is computed again; checker.semantics.transfer.promote); nothing for a load
    that failed (load_failure recompute: promoted with its blocks freed)."""
    return 0 if spec.load_fails else min(spec.external_tokens, spec.prompt_len - 1)


def held_update(slot: dict[str, int], spec: RequestSpec, blocks: int, loading: bool, step: int) -> dict[str, int]:
    """What a connector log line says of a request that is not running: the fields of its slot that change (blocks
    held, LOADING while its load is in flight, the loaded tokens once promoted, a held terminal request's release
    pending)."""
    status = slot["status"]
    change: dict[str, int] = {}
    if status in DONE:
        if blocks != slot["blocks"]:
            change.update(blocks=blocks, release_step=step if blocks else -1)
        return change
    if status == PENDING:
        return change
    if loading and status != LOADING:
        change.update(status=LOADING, num_computed=spec.external_tokens)
    elif not loading and status == LOADING:
        change.update(status=WAITING, num_computed=loaded_tokens(spec) if blocks else 0)
    if blocks != slot["blocks"]:
        change["blocks"] = blocks
    return change


class LogStep(NamedTuple):  # a tuple: one is built per log line
    step: int
    scheduled: dict[int, int]
    preempted: list[int]
    finished: list[int]
    aborted: list[int]
    running: int
    waiting: int
    free_blocks: int
    line: int
    # A KV connector's log (tests/vllm_connector_driver.py): blocks held by each request that is not running, and
    # the requests loading; None when the line has no "held" key.
    held: dict[int, int] | None = None
    loading: list[int] | None = None
    # An SGLang record with all four pool counts (IDENTITY_KEYS), for its memory identity; None otherwise.
    pool_counts: tuple[int, int, int, int] | None = None
    # An SGLang record's chunked request (the one request left mid-prefill: () if none); None: the line does not
    # say (not an SGLang record). See taken_as_prefilled.
    chunked: tuple[int, ...] | None = None
    # A speculative-decoding log (tests/vllm_spec_driver.py): how many of each request's scheduled drafts the
    # verifier accepted (the environment's choice the engine is fed under --conformance); None: the line does not say.
    accepted: dict[int, int] | None = None


@dataclass
class Arrivals:
    specs: list[RequestSpec]
    ids: list[Any]  # the log's id of each request, by request number
    index: dict[Any, int]
    by_name: dict[str, int] = field(default_factory=dict)  # str(id) -> request number (the harness's names)

    def rid(self, key: Any) -> int | None:
        """The request number of a log's id: the id itself, or its name as the harness writes it (str(id))."""
        try:
            r = self.index.get(key)
        except TypeError:  # not an id at all (a list, an object)
            return None
        if r is None:
            r = self.index.get(str(key))
            if r is None:
                r = self.by_name.get(str(key))
        return r


# ----------------------------------------------------------------------------------------- arrivals
def _whole(value: Any, low: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


def _content(row: dict, i: int, source: str):
    """The token identity of row i's prompt, read as the vLLM harness reads it (drive_vllm_scheduler.py,
    make_requests): hash_ids (each id one block of hash_block_tokens tokens), or prefix_group, or neither.
    The checks after the types are those of JSON traces (checker.requests.prefix_problem)."""
    block = row.get("hash_block_tokens", DEFAULT_HASH_BLOCK_TOKENS)
    if not _whole(block, 1):
        raise InputError(Problem(f"[{i}].hash_block_tokens", block, "a whole number >= 1 (prompt tokens per hash id, "
                                 f"default {DEFAULT_HASH_BLOCK_TOKENS})"), source)
    group = row.get("prefix_group")
    if "prefix_group" in row and not _whole(group, 0):
        raise InputError(Problem(f"[{i}].prefix_group", group, "a whole number >= 0 (requests of one group share "
                                 "their prompt's first tokens)"), source)
    ids = row.get("hash_ids")
    if "hash_ids" in row:
        if not isinstance(ids, list):
            raise InputError(Problem(f"[{i}].hash_ids", ids, "a list of whole numbers >= 0, one per hash block of "
                                     "the prompt"), source)
        for j, h in enumerate(ids):
            if not isinstance(h, int) or isinstance(h, bool):
                raise InputError(Problem(f"[{i}].hash_ids[{j}]", h, "a whole number >= 0"), source)
    problem = prefix_problem(ids, block, row["prompt_tokens"], group)
    if problem is not None:
        name, value, expected = problem
        raise InputError(Problem(f"[{i}].{name}", value, expected), source)
    return prompt_content(ids, block, row["prompt_tokens"], group, i)


def _transfer(row: dict, i: int, source: str) -> dict:
    """The row's KV connector fields (tests/vllm_connector_driver.py reads the same): external_tokens (whole,
    at most the prompt), load_steps (whole >= 1, or null: never reported), send_steps (whole >= 0, or null),
    load_fails (true or false) and grammar_steps (whole >= 0: blocked waiting states)."""
    out = {}
    for key, low, nullable in (("external_tokens", 0, False), ("load_steps", 1, True), ("send_steps", 0, True)):
        if key not in row:
            continue
        value = row[key]
        if value is None and nullable:
            out[key] = None
            continue
        if not _whole(value, low) or value > MAX_TOKENS:
            never = " or null (never reported)" if nullable else ""
            raise InputError(Problem(f"[{i}].{key}", value, f"a whole number from {low} to {MAX_TOKENS:,}{never}"), source)
        out[key] = value
    if "grammar_steps" in row:
        if not _whole(row["grammar_steps"], 0) or row["grammar_steps"] > MAX_TOKENS:
            raise InputError(Problem(f"[{i}].grammar_steps", row["grammar_steps"],
                                     f"a whole number from 0 to {MAX_TOKENS:,}"), source)
        out["grammar_steps"] = row["grammar_steps"]
    if "load_fails" in row:
        if row["load_fails"].__class__ is not bool:
            raise InputError(Problem(f"[{i}].load_fails", row["load_fails"], "true or false"), source)
        out["load_fails"] = row["load_fails"]
    if out.get("external_tokens", 0) > row["prompt_tokens"]:
        raise InputError(Problem(f"[{i}].external_tokens", out["external_tokens"],
                                 f"<= prompt_tokens={row['prompt_tokens']} (the external tier holds a prefix of the "
                                 "prompt)"), source)
    return out


def load_arrivals(path: str | Path) -> Arrivals:
    data, _ = load_document(path)
    source = str(path)
    if not isinstance(data, list):
        raise InputError(Problem("", type(data).__name__, "a JSON list of {id, arrival_step, prompt_tokens, "
                                 "output_tokens, priority, abort_step?, prefix_group?, hash_ids?, "
                                 "hash_block_tokens?}"), source)
    rows = []
    contents = []
    transfers = []
    for i, row in enumerate(data):
        if not isinstance(row, dict):
            raise InputError(Problem(f"[{i}]", row, "an object"), source)
        for key in ("id", "arrival_step", "prompt_tokens", "output_tokens"):
            if key not in row:
                raise InputError(Problem(f"[{i}].{key}", "<missing>", "this field to be given"), source)
        if not isinstance(row["id"], (str, int)) or isinstance(row["id"], bool):
            raise InputError(Problem(f"[{i}].id", row["id"], "a string or a whole number"), source)
        for key in ("arrival_step", "prompt_tokens", "output_tokens", "priority", "abort_step"):
            value = row.get(key)
            optional = key in ("priority", "abort_step")  # null means not given; the others are required
            if (value is not None or not optional) and (not isinstance(value, int) or isinstance(value, bool)
                                                        or value < 0):
                raise InputError(Problem(f"[{i}].{key}", value, "a whole number >= 0"), source)
            if key in ("arrival_step", "abort_step") and value is not None and value > MAX_STEP:
                raise InputError(Problem(f"[{i}].{key}", value, f"a step number from 0 to {MAX_STEP:,}"), source)
        if not (1 <= row["prompt_tokens"] <= MAX_TOKENS and 1 <= row["output_tokens"] <= MAX_TOKENS):
            raise InputError(Problem(f"[{i}].prompt_tokens/output_tokens", f"{row['prompt_tokens']}/{row['output_tokens']}",
                                     f"both from 1 to {MAX_TOKENS:,}"), source)
        if row.get("ignore_eos", False).__class__ is not bool:
            raise InputError(Problem(f"[{i}].ignore_eos", row["ignore_eos"], "true or false"), source)
        rows.append(row)
        contents.append(_content(row, i, source))  # i: the row's position in the file, as the harness numbers it
        transfers.append(_transfer(row, i, source))
    order = sorted(range(len(rows)), key=lambda i: (rows[i]["arrival_step"], i))
    specs, ids = [], []
    for rid, i in enumerate(order):
        row = rows[i]
        abort = row.get("abort_step")
        specs.append(RequestSpec(rid=rid, arrival_us=row["arrival_step"] * STEP_US, prompt_len=row["prompt_tokens"],
                                 output_len=row["output_tokens"], max_output=row["output_tokens"],
                                 priority=row.get("priority", 0) or 0, tenant=0, cls=0,
                                 cancel_us=None if abort is None else abort * STEP_US, content=contents[i],
                                 ignore_eos=row.get("ignore_eos", False), **transfers[i]))
        ids.append(row["id"])
    index = {key: rid for rid, key in enumerate(ids)}
    if len(index) != len(ids):
        raise InputError(Problem("id", "<duplicate>", "each request id once"), source)
    by_name: dict[str, int] = {}
    for rid, key in enumerate(ids):
        by_name.setdefault(str(key), rid)
    return Arrivals(specs, ids, index, by_name)


# ----------------------------------------------------------------------------------------- reading the log
_new_tuple = tuple.__new__  # LogStep(...) without NamedTuple's Python-level __new__


def parse_step(rec: Any, line_no: int, arrivals: Arrivals, source: str, page: int = 1) -> LogStep:
    """One log line, checked, with request ids turned into request numbers. ``page``: the policy's block size, to
    read SGLang's step records (sglang_record)."""
    try:
        k, raw, pre, fin, ab = rec["step"], rec["scheduled"], rec["preempted"], rec["finished"], rec["aborted"]
        running, waiting, free = rec["running"], rec["waiting"], rec["free_blocks"]
        if rec.__class__ is not dict:
            raise TypeError
    except (KeyError, TypeError, IndexError):
        if isinstance(rec, dict) and "free_blocks" not in rec and "available_tokens" in rec:
            entry = parse_step(sglang_record(rec, line_no, source, page), line_no, arrivals, source)
            counts = tuple(rec.get(k) for k in IDENTITY_KEYS)
            if all(c.__class__ is int for c in counts):
                entry = entry._replace(pool_counts=counts)
            if "chunked" in rec:
                entry = entry._replace(chunked=_sglang_chunked(rec["chunked"], line_no, arrivals, source))
            return entry
        missing = [k for k in LOG_KEYS if not isinstance(rec, dict) or k not in rec]
        raise InputError(Problem(missing[0], "<missing>", "the keys " + ", ".join(LOG_KEYS), line_no), source) from None
    index = arrivals.index
    if raw:
        try:  # the common case at C speed: known ids, whole token counts >= 1 (a float or a string sums to no int)
            counts = raw.values()
            if sum(counts).__class__ is not int or min(counts) < 1:
                raise TypeError
            scheduled = {index[key]: n for key, n in raw.items()}
        except (TypeError, KeyError, AttributeError):
            scheduled = _scheduled_slowly(raw, line_no, arrivals, source)
    else:
        scheduled = {}  # null, {} (or any empty value, as before)
    lists = []
    for name, ids in (("preempted", pre), ("finished", fin), ("aborted", ab)):
        if not ids:
            lists.append([])
        elif ids.__class__ is list:
            try:
                lists.append([index[key] for key in ids])
            except (TypeError, KeyError):
                lists.append(_ids_slowly(ids, name, line_no, arrivals, source))
        else:
            lists.append(_ids_slowly(ids, name, line_no, arrivals, source))
    if k.__class__ is not int or not 0 <= k <= MAX_STEP:
        raise InputError(Problem("step", k, f"a step number (a whole number from 0 to {MAX_STEP:,})", line_no),
                         source)
    if running.__class__ is not int or waiting.__class__ is not int or free.__class__ is not int:
        name, value = next((n, v) for n, v in (("running", running), ("waiting", waiting), ("free_blocks", free))
                           if v.__class__ is not int)
        raise InputError(Problem(name, value, "a whole number", line_no), source)
    raw_held = rec.get("held")
    if raw_held is None:
        held = loading = None
    else:
        held, loading = _connector_fields(raw_held, rec.get("loading"), line_no, arrivals, source)
    raw_accepted = rec.get("accepted")
    accepted = None if raw_accepted is None else _accepted(raw_accepted, line_no, arrivals, source)
    return _new_tuple(LogStep, (k, scheduled, lists[0], lists[1], lists[2], running, waiting, free, line_no, held,
                                loading, None, None, accepted))


def _accepted(raw: Any, line_no: int, arrivals: Arrivals, source: str) -> dict[int, int]:
    """A speculative log's ``accepted``: {request id: drafts accepted, a whole number >= 0}."""
    if not isinstance(raw, dict):
        raise InputError(Problem("accepted", raw, "an object: request id -> drafts accepted", line_no), source)
    out = {}
    for key, a in raw.items():
        r = arrivals.rid(key)
        if r is None:
            raise InputError(Problem(f"accepted.{key}", key, "the id of a request of the arrivals", line_no), source)
        if a.__class__ is not int or a < 0:
            raise InputError(Problem(f"accepted.{key}", a, "a whole number >= 0", line_no), source)
        out[r] = a
    return out


SGLANG_KEYS = ("retracted", "available_tokens", "evictable_tokens")


def _sglang_chunked(raw: Any, line_no: int, arrivals: Arrivals, source: str) -> tuple[int, ...]:
    if raw is None:
        return ()
    r = arrivals.rid(raw)
    if r is None:
        raise InputError(Problem("chunked", raw, "null or the id of a request of the arrivals", line_no), source)
    return (r,)


def taken_as_prefilled(entry: LogStep, r: int) -> bool:
    """An SGLang record keeps at most one request mid-prefill (its chunked request): any other request the step gave
    fewer tokens than the rest of its prompt, and that it neither retracted nor aborted, SGLang takes as prefilled
    (it samples a token after it and never computes the rest: the truncation of docs/semantics.md, SGLang's rules).
    False on a line that does not say (vLLM logs, where several requests may be mid-prefill)."""
    chunked = entry.chunked
    return chunked is not None and r not in chunked and r not in entry.preempted and r not in entry.aborted


def sglang_record(rec: dict, line_no: int, source: str, page: int) -> dict:
    """An SGLang step record (tests/sglang_driver.py; docs/check-log.md, "SGLang's step records") as a log line:
    its retractions and priority preemptions are the preemptions, its free blocks the available and evictable
    tokens in whole pages."""
    for key in SGLANG_KEYS:
        if key not in rec:
            raise InputError(Problem(key, "<missing>", "the keys of an SGLang step record: " + ", ".join(
                ("step", "scheduled", "retracted", "preempted", "finished", "aborted", "running", "waiting",
                 "available_tokens", "evictable_tokens")), line_no), source)
    retracted, tokens = rec["retracted"], [rec["available_tokens"], rec["evictable_tokens"]]
    if retracted.__class__ is not list:
        raise InputError(Problem("retracted", retracted, "a list of request ids", line_no), source)
    for name, value in zip(SGLANG_KEYS[1:], tokens):
        if value.__class__ is not int or value < 0:
            raise InputError(Problem(name, value, "a whole number of tokens >= 0", line_no), source)
    pre = rec.get("preempted")
    out = dict(rec)
    out["preempted"] = retracted + pre if pre.__class__ is list else pre  # parse_step says what is wrong with it
    out["free_blocks"] = sum(tokens) // page
    return out


IDENTITY_KEYS = ("available_tokens", "evictable_tokens", "protected_tokens", "held_tokens")


def identity_note(step: Any, counts: tuple | list, total: int) -> str | None:
    """SGLang's memory identity on one step record: available + evictable + protected + held tokens = the pool
    (docs/sglang-harness.md, "The memory identity"); the note where it fails, None where it holds."""
    if sum(counts) == total:
        return None
    return (f"step {step}: SGLang's memory identity fails: available {counts[0]} + evictable {counts[1]} + "
            f"protected {counts[2]} + held {counts[3]} = {sum(counts)} tokens, the pool is {total} "
            "(kv.num_blocks x kv.block_size)")


class IdentityNotes:
    """The memory identity over a log's steps: the first MAX_NOTES failing steps' notes, and how many fail; nothing
    if a line lacks the four counts (not such a log)."""

    def __init__(self, policy: Policy):
        self.total = policy.kv.num_blocks * policy.kv.block_size
        self.notes: list[str] = []
        self.failing = 0
        self.applies = True

    def feed(self, step: Any, counts: tuple | list | None) -> None:
        if not self.applies:
            return
        if counts is None:
            self.applies, self.notes, self.failing = False, [], 0
            return
        note = identity_note(step, counts, self.total)
        if note is not None:
            self.failing += 1
            if len(self.notes) < MAX_NOTES:
                self.notes.append(note)


def sglang_identity_notes(log: str | Path, policy: Policy) -> tuple[list[str], int]:
    """IdentityNotes over a log file read on its own (check-log checks it as it streams the log: check_stream)."""
    identity = IdentityNotes(policy)
    for line_no, raw in log_lines(log):
        rec = parse_line(raw, line_no, str(log))
        counts = [rec.get(k) for k in IDENTITY_KEYS] if isinstance(rec, dict) else None
        identity.feed(rec.get("step") if isinstance(rec, dict) else None,
                      counts if counts and all(c.__class__ is int for c in counts) else None)
    return identity.notes, identity.failing


def _connector_fields(raw_held: Any, raw_loading: Any, line_no: int, arrivals: Arrivals, source: str
                      ) -> tuple[dict[int, int], list[int]]:
    """A connector log line's ``held`` ({id: blocks >= 1}) and ``loading`` (ids; none given: [])."""
    if raw_held.__class__ is not dict:
        raise InputError(Problem("held", raw_held, "an object: request id -> blocks it holds while not running",
                                 line_no), source)
    held = {}
    for key, n in raw_held.items():
        if not _whole(n, 1):
            raise InputError(Problem(f"held.{key}", n, "a block count >= 1", line_no), source)
        r = arrivals.rid(key)
        if r is None:
            raise InputError(Problem("held", key, "a request id from the arrivals file", line_no), source)
        held[r] = n
    loading = [] if raw_loading is None else _ids_slowly(raw_loading, "loading", line_no, arrivals, source)
    return held, loading


def _scheduled_slowly(raw: Any, line_no: int, arrivals: Arrivals, source: str) -> dict[int, int]:
    """``scheduled`` entry by entry: the first bad one is the error (a count, then its id)."""
    if raw.__class__ is not dict:
        raise InputError(Problem("scheduled", raw, "an object: request id -> tokens scheduled", line_no), source)
    scheduled = {}
    for key, n in raw.items():
        if not isinstance(n, int) or n < 1:
            raise InputError(Problem(f"scheduled.{key}", n, "a token count >= 1", line_no), source)
        r = arrivals.rid(key)
        if r is None:
            raise InputError(Problem("scheduled", key, "a request id from the arrivals file", line_no), source)
        scheduled[r] = n
    return scheduled


def _ids_slowly(ids: Any, name: str, line_no: int, arrivals: Arrivals, source: str) -> list[int]:
    if ids.__class__ is not list:
        raise InputError(Problem(name, ids, "a list of request ids", line_no), source)
    rids = []
    for key in ids:
        r = arrivals.rid(key)
        if r is None:
            raise InputError(Problem(name, key, "a request id from the arrivals file", line_no), source)
        rids.append(r)
    return rids


def _open(path: str | Path):
    p = Path(path)
    try:
        return open(p, "rb")
    except FileNotFoundError:
        raise InputError(Problem("", str(p), "an existing file"), str(p)) from None
    except IsADirectoryError:
        raise InputError(Problem("", str(p), "a file, not a directory"), str(p)) from None
    except OSError as exc:
        raise InputError(Problem("", str(p), f"a readable file ({exc.strerror})"), str(p)) from None


@dataclass
class Follow:
    """Follow a growing log (like ``tail -f``): wait for new lines, stop after ``idle_s`` without one."""

    idle_s: float = 10.0
    poll_s: float = 0.05
    stopped: str | None = None  # "idle" once the reader gave up waiting


def log_lines(path: str | Path, follow: Follow | None = None) -> Iterator[tuple[int, bytes]]:
    """(line number, bytes) of each non-blank line of the log, read lazily. With ``follow``, lines are
    yielded as they are appended (a line counts once it ends in a newline, or when the wait ends)."""
    source = str(path)
    if follow is None:
        with _open(path) as f:
            for line_no, raw in enumerate(f, start=1):
                if not raw.isspace():
                    yield line_no, raw
        return
    last = time.monotonic()
    while not os.path.exists(path):  # the server may not have created it yet
        if time.monotonic() - last >= follow.idle_s:
            follow.stopped = "idle"
            _open(path)  # the usual error: an existing file
        time.sleep(follow.poll_s)
    with _open(path) as f:
        line_no, partial = 0, b""
        while True:
            chunk = f.readline()
            if chunk:
                last = time.monotonic()
                partial += chunk
                if partial.endswith(b"\n"):
                    line_no += 1
                    raw, partial = partial, b""
                    if not raw.isspace():
                        yield line_no, raw
                continue
            if time.monotonic() - last >= follow.idle_s:
                follow.stopped = "idle"
                if partial and not partial.isspace():  # a last line without its newline
                    yield line_no + 1, partial
                return
            if os.fstat(f.fileno()).st_size < f.tell():
                raise InputError(Problem("", f"{os.fstat(f.fileno()).st_size} bytes", f"a log that only grows "
                                         f"(it was {f.tell()} bytes: truncated or replaced)"), source)
            time.sleep(follow.poll_s)


def parse_line(raw: bytes, line_no: int, source: str) -> Any:
    if orjson is not None:
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError:
            pass  # json says what is wrong, as it always did (and reads what orjson does not: huge ints, NaN)
    try:
        text = raw.decode("utf-8").rstrip("\r\n")
    except UnicodeDecodeError as exc:
        raise InputError(Problem("", f"byte {exc.start} of the line", "UTF-8 text", line_no), source) from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(Problem(f"line {line_no}", text[:40], f"a JSON object ({exc.msg})", line_no),
                         source) from None


def stream_log(path: str | Path, arrivals: Arrivals, follow: Follow | None = None, page: int = 1) -> Iterator[LogStep]:
    """The log's steps, parsed and checked one line at a time (steps must be consecutive: the first gap is
    an input error, raised at the end of the file, after every line has been checked, as load_log does;
    at once when following)."""
    source = str(path)
    prev: LogStep | None = None
    gap: Problem | None = None
    count = 0
    for line_no, raw in log_lines(path, follow):
        entry = parse_step(parse_line(raw, line_no, source), line_no, arrivals, source, page)
        count += 1
        if prev is not None and entry.step != prev.step + 1 and gap is None:
            gap = Problem("step", entry.step, f"consecutive steps ({prev.step + 1} after {prev.step})", entry.line)
            if follow is not None:
                raise InputError(gap, source)
        prev = entry
        if gap is None:
            yield entry
    if not count and (follow is None or follow.stopped is None):
        raise InputError(Problem("lines", 0, "at least one step"), source)
    if gap is not None:
        raise InputError(gap, source)


# ----------------------------------------------------------------------------------------- the observed state
class _Ignore:
    """Stands in for the set of touched requests when nothing reads it (no windowed invariant)."""

    @staticmethod
    def add(r: int) -> None:
        pass


def release_aborted(rids: list[int], blocks: list[int], extra: int) -> list[tuple[int, int]]:
    """Aborted requests (oldest abort first) that hold ``blocks`` while the log shows ``extra`` blocks in use
    beyond what the other requests hold: the blocks each keeps, where that changes. The extra blocks stay
    with the most recently aborted (the latest deadline under cancellation_releases), the rest are freed."""
    keep = max(extra, 0)
    changed = []
    for r, b in reversed(list(zip(rids, blocks))):
        left = min(b, keep)
        keep -= left
        if left != b:
            changed.append((r, left))
    return changed


def _initial_slot() -> dict[str, int]:
    return {**{f: 0 for f in FIELDS}, "status": PENDING, "release_step": -1}


class Observed:
    """The requests' state as the log shows it, advanced one step at a time; a step touches only the
    requests its line names (and those whose arrival step it is). The same rules as observed_frames.

    After ``apply``: ``status_changed``, ``blocks_changed`` (requests whose status / blocks changed in the
    step), ``touched`` (every request whose fields changed or that the step scheduled, preempted, finished
    or aborted, and those that arrived), ``produced``; sets of running, waiting and KV-holding requests,
    the sum of blocks held, and how many requests are finished or aborted.

    With ``keep`` >= 0 the slots are copy-on-write: a slot written in step t is a new dict, and the one it
    replaces is kept for ``keep`` steps (``slot_at``), so frames of earlier steps stay valid."""

    def __init__(self, policy: Policy, arrivals: Arrivals, keep: int | None = None):
        specs = arrivals.specs
        self.n = len(specs)
        self.slots = [_initial_slot() for _ in specs]
        self.prompt = [s.prompt_len for s in specs]  # as the scheduler takes it (SGLang's truncation shortens one)
        self.specs = specs
        self.loading: set[int] = set()  # a connector log's requests loading after the last step
        self.arrival_us = [s.arrival_us for s in specs]  # specs are in arrival order (load_arrivals)
        self.next_arrival = 0
        self.size = policy.kv.block_size
        self.pool = policy.kv.num_blocks
        self.running: set[int] = set()
        self.waiting: set[int] = set()
        self.holding: set[int] = set()  # blocks != 0
        self.held = 0  # blocks summed over the requests
        self.done = 0  # finished or aborted
        # requests cancelled at some step so far -> [(step t, status from t on)], the status before first
        self.status_since: dict[int, list[tuple[int, int]]] = {}
        # Aborted requests still holding blocks, in abort order (caching off: the log's free blocks say when
        # they are freed; with the cache they are freed at once, see release_aborted)
        self.aborted_holding: dict[int, None] = {}
        self.keeps_aborted = not policy.kv.prefix_caching.enabled
        # speculative decoding: the drafter's lookahead slots (a decode's blocks cover them) and the length cap
        self.lookahead = policy.speculative.lookahead_slots if policy.speculative.enabled else None
        self.max_len = policy.max_model_len
        # async scheduling (policy.pipeline): a verifying row counts every draft until the next line resolves its
        # batch; (request, drafts rejected) of the last line's rows, rolled back after the next line's rows
        self.in_flight = policy.pipeline.enabled
        self.rollbacks: list[tuple[int, int]] = []
        self.seq = 1
        self.t = -1  # position in the log of the last step applied
        self.keep = keep
        self.written = [-1] * self.n  # copy-on-write: the step in which a slot was last copied
        self.history: dict[int, list[tuple[int, dict]]] = {}  # rid -> [(t, the slot before step t)]
        self.entry: LogStep | None = None
        self.status_changed: list[int] = []
        self.blocks_changed: list[int] = []
        self.admitted: list[int] = []  # admitted (first scheduled, or again after a preemption) in the step
        self.produced: set[int] = set()
        self.touched: set[int] = set()
        self.kv_used = 0
        self.now_us = 0

    # the slot of request r, writable in this step
    def _w(self, r: int) -> dict[str, int]:
        s = self.slots[r]
        if self.keep is not None and self.written[r] != self.t:
            hist = self.history.setdefault(r, [])
            while hist and hist[0][0] <= self.t - self.keep:
                del hist[0]
            hist.append((self.t, s))
            s = self.slots[r] = dict(s)
            self.written[r] = self.t
        return s

    def _status(self, r: int, s: dict[str, int], new: int) -> None:
        old = s["status"]
        if old == new:
            return
        s["status"] = new
        self.status_changed.append(r)
        if old == RUNNING:
            self.running.discard(r)
        elif old == WAITING or old == LOADING:
            self.waiting.discard(r)
        elif old in DONE:
            self.done -= 1
        if new == RUNNING:
            self.running.add(r)
        elif new == WAITING or new == LOADING:
            self.waiting.add(r)
        elif new in DONE:
            self.done += 1
        if new == CANCELLED and r not in self.status_since:
            self.status_since[r] = [(-1, old)]
        if r in self.status_since:
            self.status_since[r].append((self.t, new))

    def _blocks(self, r: int, s: dict[str, int], b: int) -> None:
        old = s["blocks"]
        if old == b:
            return
        s["blocks"] = b
        self.held += b - old
        self.blocks_changed.append(r)
        if b:
            self.holding.add(r)
        else:
            self.holding.discard(r)

    def apply(self, entry: LogStep) -> None:
        self.t += 1
        self.entry = entry
        now = self.now_us = entry.step * STEP_US
        self.status_changed, self.blocks_changed = [], []
        admitted = self.admitted = []
        produced = self.produced = set()
        touched = self.touched = set(entry.scheduled) if self.keep is not None else _Ignore
        w, status, blocks = self._w, self._status, self._blocks
        arrival = self.arrival_us
        while self.next_arrival < self.n and arrival[self.next_arrival] <= now:
            r = self.next_arrival
            self.next_arrival += 1
            touched.add(r)  # touched at its arrival step even when the log named it earlier
            if self.slots[r]["status"] == PENDING:
                status(r, w(r), WAITING)
        sched = entry.scheduled
        rollbacks: list[tuple[int, int]] = []
        # SGLang ends an aborted running request after its next row (the row is in the step): it ends after it
        after = [r for r in entry.aborted if r in sched] if entry.aborted and sched else ()
        if entry.aborted:
            self._end([r for r in entry.aborted if r not in after] if after else entry.aborted, CANCELLED, ABORTED,
                      touched, keep=self.keeps_aborted)
        late = [r for r in entry.preempted if r in sched] if entry.preempted and sched else ()
        if entry.preempted:
            for r in entry.preempted:
                if not late or r not in late:  # scheduled too: preempted after its tokens (below)
                    self._preempt(r, w(r), touched)
        size, prompt, slots, running, produce = self.size, self.prompt, self.slots, RUNNING, produced.add
        cow = self.keep is not None
        lookahead, chunked = self.lookahead, entry.chunked is not None  # read once a step, not once a request
        accepted = entry.accepted if lookahead is not None else None
        for r, n in entry.scheduled.items():
            s = w(r) if cow else slots[r]
            if s["status"] != running:
                if s["status"] == LOADING:  # promoted and admitted in this step
                    s["num_computed"] = loaded_tokens(self.specs[r])
                    if self.specs[r].load_fails:  # recompute: its blocks were freed at the promotion
                        blocks(r, s, 0)
                status(r, s, running)
                s["admitted_seq"] = self.seq
                self.seq += 1
                admitted.append(r)
            g = s["num_generated"]
            if accepted and r in accepted:
                if self.in_flight:
                    self._verified_later(r, s, n, accepted[r], rollbacks)
                else:
                    self._verified(r, s, n, accepted[r])
                produce(r)
                continue
            c = s["num_computed"] = s["num_computed"] + n
            t = c if lookahead is None else min(c + lookahead, self.max_len)  # and the lookahead slots
            if t > s["blocks"] * size:  # blocks is 0 or blocks_for(computed before): it grows only past them
                blocks(r, s, blocks_for(t, size))
            if c >= prompt[r] + g:
                s["num_generated"] = g + 1
                produce(r)
            elif chunked and taken_as_prefilled(entry, r):
                prompt[r] = c - g  # its prompt, as the scheduler now takes it, ends here (as the engine's)
                s["num_generated"] = g + 1
                produce(r)
        for r in late:
            self._preempt(r, w(r), touched)
        if self.in_flight:
            self._resolve(rollbacks, touched)
        if after:
            self._end(after, CANCELLED, ABORTED, touched, keep=self.keeps_aborted)
        if entry.finished:
            self._end(entry.finished, FINISHED, STOPPED, touched)
        self.kv_used = self.pool - entry.free_blocks
        if entry.held is not None:
            self._apply_held(entry, touched)
        elif self.aborted_holding:
            self._release_aborted()

    def _verified(self, r: int, s: dict[str, int], n: int, a: int) -> None:
        """A decode that verified drafts (a speculative log): n tokens scheduled, a drafts accepted; the rejected
        ones rolled back, 1 + a output tokens (fewer at the request's output length or max_model_len), the blocks
        of the scheduled tokens and the lookahead slots (as checker.semantics.speculative.verify)."""
        c, g = s["num_computed"], s["num_generated"]
        total = self.prompt[r] + g
        need = blocks_for(min(c + n + self.lookahead, self.max_len), self.size)
        if need > s["blocks"]:
            self._blocks(r, s, need)
        m = max(1, min(1 + a, self.specs[r].output_len - g, self.max_len - total))
        s["num_computed"], s["num_generated"] = c + m, g + m

    def _verified_later(self, r: int, s: dict[str, int], n: int, a: int, rollbacks: list[tuple[int, int]]) -> None:
        """A row verifying drafts under async scheduling: the blocks of the scheduled tokens and the lookahead slots,
        every draft counted (vLLM's placeholders) until the next line resolves the batch (``_resolve``)."""
        c, g = s["num_computed"], s["num_generated"]
        need = blocks_for(min(c + n + self.lookahead, self.max_len), self.size)
        if need > s["blocks"]:
            self._blocks(r, s, need)
        d = n - (self.prompt[r] + g - c)
        s["num_computed"], s["num_generated"] = c + n, g + 1 + d
        rollbacks.append((r, d - a))

    def _resolve(self, rollbacks: list[tuple[int, int]], touched) -> None:
        """The last line's batch resolved in this one (after this line's rows were scheduled): its rejected drafts
        rolled back (only the output of a request preempted since: its counters were reset)."""
        for r, rejected in self.rollbacks:
            if rejected and self.slots[r]["status"] in (RUNNING, WAITING):
                s = self._w(r)
                if s["status"] == RUNNING:
                    s["num_computed"] -= rejected
                s["num_generated"] -= rejected
                touched.add(r)
        self.rollbacks = rollbacks

    def _apply_held(self, entry: LogStep, touched) -> None:
        """A connector log line: the blocks each request that is not running holds, and which are loading
        (held_update), for the requests it names and those that held blocks or loaded after the last step."""
        held, loading = entry.held, set(entry.loading)
        slots = self.slots
        for r in set(held) | loading | self.loading | {r for r in self.holding if slots[r]["status"] != RUNNING}:
            if slots[r]["status"] == RUNNING:
                continue
            change = held_update(slots[r], self.specs[r], held.get(r, 0), r in loading, entry.step)
            if not change:
                continue
            s = self._w(r)
            if "status" in change:
                self._status(r, s, change.pop("status"))
            if "blocks" in change:
                self._blocks(r, s, change.pop("blocks"))
            s.update(change)
            touched.add(r)
        self.loading = loading
        self.aborted_holding.clear()  # the line says exactly what each request holds

    def _preempt(self, r: int, s: dict[str, int], touched) -> None:
        self._status(r, s, WAITING)
        s["num_computed"] = 0
        self._blocks(r, s, 0)
        s["num_preemptions"] += 1
        s["requeue_seq"] = self.seq
        self.seq += 1
        touched.add(r)

    def _end(self, rids: list[int], status: int, reason: int, touched, keep: bool = False) -> None:
        """Requests the log ends in this step (aborted or finished): their final status and reason, no blocks
        (``keep``: aborted requests keep theirs until the log's free blocks show them freed)."""
        for r in rids:
            s = self._w(r)
            self._status(r, s, status)
            s["reason"] = reason
            if keep and s["blocks"]:
                s["release_step"] = self.entry.step  # the abort's log step (request_conservation: may hold KV)
                self.aborted_holding[r] = None
            else:
                self._blocks(r, s, 0)
            touched.add(r)

    def _release_aborted(self) -> None:
        """Free aborted requests' blocks as far as the log's free blocks show them freed: the blocks in use
        beyond what the running requests hold stay with the aborted ones, the most recently aborted first
        (release_aborted: the attribution no cancellation_releases verdict can be stricter than)."""
        holding = self.aborted_holding
        extra = self.kv_used - self.held + sum(self.slots[r]["blocks"] for r in holding)
        for r, left in release_aborted(list(holding), [self.slots[r]["blocks"] for r in holding], extra):
            s = self._w(r)
            self._blocks(r, s, left)
            if not left:
                s["release_step"] = -1
                del holding[r]

    def note(self) -> str | None:
        """Where the log's counts disagree with the arrivals and events (observed_frames' note)."""
        e = self.entry
        running, waiting = len(self.running), len(self.waiting)
        if running == e.running and waiting == e.waiting:
            return None
        return (f"step {e.step}: the log counts running={e.running} waiting={e.waiting}, the arrivals and "
                f"events give running={running} waiting={waiting}")

    def status_at(self, r: int, j: int) -> int:
        """A request's status after log step j, for a request that has been cancelled (status_since)."""
        status = None
        for t, value in self.status_since[r]:
            if t > j:
                break
            status = value
        return status

    def slot_at(self, r: int, j: int) -> dict[str, int]:
        """Request r's slot after the step at log position j (j >= t - keep)."""
        for tc, old in self.history.get(r, ()):
            if tc > j:
                return old
        return self.slots[r]

    def live(self) -> set[int]:
        return self.running | self.waiting


# ----------------------------------------------------------------------------------------- frames, quickly
_new = object.__new__


_FRAME_DEFAULTS = {f.name: f.default for f in fields(Frame) if f.default is not MISSING}  # counters, pool (None: a
# log shows no block tables)


def _frame(slots: tuple, scheduled: tuple, produced: tuple, preempted: tuple, kv_used: int, now_us: int) -> Frame:
    """A Frame (the same frozen dataclass, its other fields at their defaults), built without its __init__:
    the frozen dataclass's object.__setattr__ per field costs ~2.5 us, and check-log builds a few per step."""
    f = _new(Frame)
    d = f.__dict__
    d.update(_FRAME_DEFAULTS)
    d.update(slots=slots, scheduled=scheduled, produced=produced, preempted=preempted, kv_used=kv_used, now_us=now_us)
    return f


def _context(policy: Policy, params: tuple, frames: Any) -> TraceContext:
    ctx = _new(TraceContext)
    ctx.__dict__.update(policy=policy, params=params, frames=frames)
    return ctx


class _Frames:
    """The frames an invariant may read at step t: positions base..t of the log, each restricted to the
    same requests. Reading outside them is a bug in check-log's window table: said loudly."""

    __slots__ = ("base", "frames")

    def __init__(self, base: int, frames: list[Frame]):
        self.base = base
        self.frames = frames

    def __getitem__(self, j: int) -> Frame:
        i = j - self.base
        if 0 <= i < len(self.frames):
            return self.frames[i]
        raise InternalError(f"check-log: an invariant read frame {j}; it keeps frames {self.base}.."
                            f"{self.base + len(self.frames) - 1} (checker/checklog.py WINDOW is wrong)")

    def __len__(self) -> int:
        return self.base + len(self.frames)


# ----------------------------------------------------------------------------------------- invariants, incrementally
# How each catalogue invariant is evaluated on what changed. Each is decided by its own predicate, on a
# frame restricted to the requests that can change its verdict (docs/check-log.md, "How it scales", says
# why each restriction gives the verdict of the whole frame; tests/unit/test_checklog_stream.py compares
# every invariant with the whole-frame path on several logs):
#   globals       only the frame's globals (no request); it reads the KV in use only: re-evaluated when
#                 that changes;
#   pool          only the frame's globals; it reads the frame's block pool only, None in every frame of a
#                 log (a log shows no block tables): evaluated at the first step;
#   scheduled     the requests scheduled in the step (every other one contributes 0 tokens);
#   served        the requests scheduled in the step, with their statuses (every other one holds: 0 tokens);
#   running       the running requests (every other one counts 0); the verdict can only change in a step
#                 in which some request's status changed;
#   conservation  the requests whose status or blocks changed in the step, with the KV in use less the
#                 blocks of the others (each request's own conditions read only its own fields, which
#                 held when they last changed; the sum is the same; no pool, so no shared blocks);
#   preempted     the requests preempted in the step (the count only grows there; a step's count of preemptions
#                 and what its victims hold are read there only);
#   lookahead     (lookahead_fits) the requests scheduled in the step, with the KV in use (only they can lack
#                 lookahead blocks); without lookahead slots it reads the KV in use only, as globals;
#   produced      the requests that produced a token in the step (every other one holds trivially);
#   cancelled     (cancellation_releases) the requests holding KV now that have been cancelled: only those can
#                 fail (cancelled at the window's start, still holding now); the predicate reads their status
#                 then and their blocks now, and gets exactly those (the status from status_since).
#   fairness      (tenant_fairness) every request's frame, read by catalogue.TenantFairnessSteps: the least and
#                 greatest service difference over the current backlogged stretch stand for every earlier
#                 start the predicate compares (constant time a step and pair; was the whole history a step).
# The first step evaluates every request, so each request's initial state is checked once.
INCREMENTAL: dict[Callable, str] = {
    catalogue.kv_never_overcommitted: "globals",
    catalogue.block_pool_conservation: "pool",
    catalogue.no_referenced_block_reused: "pool",
    catalogue.hit_only_on_identical_chain: "pool",
    catalogue.token_budget: "scheduled",
    catalogue.scheduled_requests_run: "served",
    catalogue.seq_cap: "running",
    catalogue.request_conservation: "conservation",
    catalogue.sglang_memory_identity: "globals",  # a log frame has no tree: true there (IdentityNotes checks the log)
    catalogue.bounded_preemptions: "preempted",
    catalogue.bounded_preemptions_per_step: "preempted",
    catalogue.preemption_frees_capacity: "preempted",
    catalogue.lookahead_fits: "lookahead",
    catalogue.prompt_fully_computed: "produced",
    catalogue.cancellation_releases: "cancelled",
    catalogue.tenant_fairness: "fairness",
}

# Invariants that look back a bounded number of steps: how many (from their parameters), and which
# requests their frames need (each frame of the window restricted to the same requests). Any other request
# cannot change the verdict (docs/check-log.md, "How it scales"):
#   live        the live requests (waiting or running) at the step, those holding KV, and those touched
#               within the window; any other one is dormant through the window (pending, or ended and
#               unchanged, holding nothing), which these predicates cannot fail on;
#   holding     those holding KV at the step (a request fails only while it still holds blocks);
#   running     those running at the step (only a request running through the window can fail);
#   running+    those running at the step or touched within the window (every request running at the
#               window's start is one of them);
#   witness     those touched within the window, and one live request untouched through it (it has the
#               same status in every frame: a witness that someone has work, wherever one exists);
#   admissions  those admitted in the step and, if any, the most urgent waiting request (only a waiting
#               request can fail, only against one admitted in the step, and its condition only gets
#               easier as it is less urgent).
WINDOW: dict[Callable, tuple[Callable[[dict[str, int]], int], str]] = {
    catalogue.decode_progress: (lambda p: p["gap"], "running"),
    catalogue.bounded_starvation: (lambda p: p["steps"], "live"),
    catalogue.no_deadlock: (lambda p: p["steps"] - 1 if p["steps"] > 0 else 0, "witness"),
    catalogue.work_conserving: (lambda p: 0, "live"),
    catalogue.priority_inversion: (lambda p: 1, "admissions"),
    catalogue.degradation_order: (lambda p: p["gap"], "running+"),
    catalogue.finished_releases: (lambda p: p["steps"], "holding"),
    catalogue.no_hold_and_wait: (lambda p: p["steps"], "holding"),
}
# Anything else (user invariants) runs on whole frames of every request, all kept: the old path, memory
# growing with the log.


@dataclass
class Violation:
    invariant: str
    step: int
    line: int
    context: list[str] = field(default_factory=list)


MEMO_LIMIT = 4096  # verdicts remembered per invariant (then forgotten all at once): memory stays bounded


def _bound(seen: dict) -> None:
    if len(seen) > MEMO_LIMIT:
        seen.clear()


def conservation_reads(slot: dict[str, int]) -> tuple[int, int, bool, bool]:
    """What request_conservation reads of one request's own fields: its status, the sign of its blocks (== 0,
    >= 0), whether it has swapped blocks and whether a release is pending. Its blocks count otherwise only in the
    sum the KV in use is compared with; in a frame restricted to some requests with the KV in use less the blocks
    of all the others (and no pool or tree: a log frame), that comparison is whether the others' blocks are the KV
    in use. So the verdict is a function of these and that difference (tests/unit/test_checklog_stream.py tries
    the predicate on frames that differ in everything else)."""
    b = slot["blocks"]
    return slot["status"], (b > 0) - (b < 0), slot["swapped_blocks"] == 0, slot["release_step"] == -1


class Incremental:
    """The chosen invariants, evaluated step by step on an Observed state."""

    def __init__(self, policy: Policy, arrivals: Arrivals, invariants: list[tuple[Invariant, dict[str, int]]]):
        self.policy = policy
        self.arrivals = arrivals
        self.params = tuple(SlotParams(s.arrival_us, s.prompt_len, s.output_len, s.max_output, s.priority, s.tenant)
                            for s in arrivals.specs)
        self.plans: list[tuple[Invariant, dict[str, int], str, int]] = []
        window = -1
        for inv, params in invariants:
            full = {**inv.defaults, **params}
            if inv.check in INCREMENTAL:
                self.plans.append((inv, params, INCREMENTAL[inv.check], 0))
                continue
            if inv.check in WINDOW:
                w = WINDOW[inv.check][0](full)
                if w < 0:
                    raise InputError(Problem("--invariant", f"{inv.name}:{params}", "a window of 0 steps or more "
                                             "(check-log reads the log in order)"))
                self.plans.append((inv, params, "window", w))
                window = max(window, w)
            else:
                self.plans.append((inv, params, "whole", 0))
                window = max(window, 0)
        self.whole = any(kind == "whole" for _, _, kind, _ in self.plans)
        self.window = window  # steps of history the windowed invariants read (-1: none)
        keep = None if window < 0 and not self.whole else max(window, 0) + 1
        self.obs = Observed(policy, arrivals, keep)
        self.ring: deque = deque(maxlen=max(window, 0) + 1)  # per step: what the windowed frames need
        self.frames: list[Frame] = []  # whole frames (only for "whole" invariants)
        self.failed: Violation | None = None
        self._windowed: dict[tuple[str, int], TraceContext] = {}  # this step's windowed frames, by support
        self._windowed_at = -1
        self._urgency_ctx = _context(policy, self.params, _Frames(0, []))
        self.checks = [getattr(self, "_" + kind)(inv, {**inv.defaults, **params}) for inv, params, kind, _ in self.plans]

    def _restricted(self, rids, kv_used: int) -> Frame:
        obs, entry = self.obs, self.obs.entry
        slots, sched = obs.slots, entry.scheduled
        produced, preempted = obs.produced, entry.preempted
        return _frame(tuple([slots[r] for r in rids]), tuple([sched.get(r, 0) for r in rids]),
                      tuple([r in produced for r in rids]) if produced else (False,) * len(rids),
                      tuple([r in preempted for r in rids]) if preempted else (False,) * len(rids),
                      kv_used, obs.now_us)

    def _evaluator(self, inv: Invariant, full: dict[str, int]) -> Callable[[Any, int, Frame], bool]:
        """Evaluates the invariant's own predicate at step t on one frame restricted to some requests (what
        inv.holds does, its parameters merged once)."""
        check, policy, prm = inv.check, self.policy, self.params
        frames = _Frames(0, [None])  # type: ignore[list-item]
        ctx = _context(policy, (), frames)
        state = ctx.__dict__

        def holds(rids, t: int, frame: Frame) -> bool:
            state["params"] = tuple([prm[r] for r in rids]) if rids else ()
            frames.base = t
            frames.frames[0] = frame
            return bool(check(IntOps, ctx, t, **full))
        return holds

    # One function per kind of INCREMENTAL / WINDOW / whole: each says whether the invariant holds at step t.
    # The incremental ones remember their verdicts by what the predicate reads of the restricted frame (a
    # pure function of those values, the policy and the parameters, which are fixed): a step whose
    # restricted frame reads the same as an earlier one gets that step's verdict, computed by the predicate.
    def _globals(self, inv: Invariant, full: dict[str, int]) -> Callable[[int], bool]:
        holds, obs = self._evaluator(inv, full), self.obs
        seen: dict[int, bool] = {}  # KV in use -> verdict: it reads the KV in use only

        def check(t: int) -> bool:
            ok = seen.get(obs.kv_used)
            if ok is None:
                ok = seen[obs.kv_used] = holds((), t, _frame((), (), (), (), obs.kv_used, obs.now_us))
                _bound(seen)
            return ok
        return check

    def _pool(self, inv: Invariant, full: dict[str, int]) -> Callable[[int], bool]:
        holds, obs = self._evaluator(inv, full), self.obs
        first: list[bool] = []

        def check(t: int) -> bool:
            if not first:  # it reads the frame's pool only: None in every step
                first.append(holds((), t, _frame((), (), (), (), obs.kv_used, obs.now_us)))
            return first[0]
        return check

    def _scheduled(self, inv: Invariant, full: dict[str, int]) -> Callable[[int], bool]:
        holds, obs = self._evaluator(inv, full), self.obs
        seen: dict[tuple, bool] = {}  # tokens scheduled (in order) -> verdict: it reads those only

        def check(t: int) -> bool:
            sched = obs.entry.scheduled
            key = tuple(sched.values())
            ok = seen.get(key)
            if ok is None:
                rids = list(sched)
                ok = seen[key] = holds(rids, t, self._restricted(rids, obs.kv_used))
                _bound(seen)
            return ok
        return check

    def _produced(self, inv: Invariant, full: dict[str, int]) -> Callable[[int], bool]:
        holds, obs = self._evaluator(inv, full), self.obs

        def check(t: int) -> bool:
            rids = sorted(obs.produced)
            return not rids or holds(rids, t, self._restricted(rids, obs.kv_used))
        return check

    def _served(self, inv: Invariant, full: dict[str, int]) -> Callable[[int], bool]:
        holds, obs = self._evaluator(inv, full), self.obs
        seen: dict[tuple, bool] = {}  # (tokens > 0, status) of each scheduled request -> verdict: it reads those
        running = ((True, RUNNING),)

        def check(t: int) -> bool:
            slots, sched = obs.slots, obs.entry.scheduled
            rids = list(sched)
            if rids and min(sched.values()) > 0 and obs.running.issuperset(rids):
                key = running * len(rids)  # the key below when every one has tokens and runs (most steps), at C speed
            else:
                key = tuple([(sched[r] > 0, slots[r]["status"]) for r in rids])
            ok = seen.get(key)
            if ok is None:
                ok = seen[key] = holds(rids, t, self._restricted(rids, obs.kv_used))
                _bound(seen)
            return ok
        return check

    def _running(self, inv: Invariant, full: dict[str, int]) -> Callable[[int], bool]:
        holds, obs = self._evaluator(inv, full), self.obs
        seen: dict[int, bool] = {}  # running requests -> verdict: it reads statuses only, all RUNNING here

        def check(t: int) -> bool:
            key = len(obs.running)
            ok = seen.get(key)
            if ok is None:
                rids = list(obs.running)
                ok = seen[key] = holds(rids, t, self._restricted(rids, obs.kv_used))
                _bound(seen)
            return ok
        return check

    def _conservation(self, inv: Invariant, full: dict[str, int]) -> Callable[[int], bool]:
        holds, obs = self._evaluator(inv, full), self.obs
        seen: dict[tuple, bool] = {}  # (conservation_reads of each request, KV in use less all blocks held) -> verdict

        def check(t: int) -> bool:
            if t == 0:
                return holds(range(obs.n), t, self._restricted(range(obs.n), obs.kv_used))
            if obs.status_changed:
                changed = set(obs.status_changed)
                changed.update(obs.blocks_changed)
                rids = list(changed)
            else:  # each once: a request's blocks change twice only with its status (none: no request in the frame)
                rids = obs.blocks_changed
            slots, rest = obs.slots, obs.kv_used - obs.held
            key = (tuple([conservation_reads(slots[r]) for r in rids]), rest)
            ok = seen.get(key)
            if ok is None:  # the frame's KV in use: the blocks of the others (rest) and theirs
                ok = seen[key] = holds(rids, t, self._restricted(rids, rest + sum([slots[r]["blocks"] for r in rids])))
                _bound(seen)
            return ok
        return check

    def _cancelled(self, inv: Invariant, full: dict[str, int]) -> Callable[[int], bool]:
        check, obs, steps = inv.check, self.obs, full["steps"]

        empty: list[bool] = []  # the verdict on no request (the same at every step once t >= steps)

        def holds(t: int) -> bool:
            since = obs.status_since
            rids = [r for r in obs.holding if r in since] if since else []
            if not rids and empty and t >= steps:
                return empty[0]
            now = tuple([obs.slots[r] for r in rids])
            then = tuple([{**obs.slots[r], "status": obs.status_at(r, t - steps)} for r in rids]) if rids else ()
            frames = [None] * (steps + 1)  # only frames t - steps and t are read
            frames[0] = _frame(then, (0,) * len(rids), (False,) * len(rids), (False,) * len(rids), obs.kv_used, 0)
            frames[-1] = _frame(now, (0,) * len(rids), (False,) * len(rids), (False,) * len(rids), obs.kv_used,
                                obs.now_us)
            ctx = _context(self.policy, tuple([self.params[r] for r in rids]), _Frames(t - steps, frames))
            ok = bool(check(IntOps, ctx, t, **full))
            if not rids and t >= steps and not empty:
                empty.append(ok)
            return ok
        return holds

    def _preempted(self, inv: Invariant, full: dict[str, int]) -> Callable[[int], bool]:
        holds, obs = self._evaluator(inv, full), self.obs

        def check(t: int) -> bool:
            if t and not obs.entry.preempted:
                return True  # nobody's count of preemptions changed (and every earlier step passed)
            rids = range(obs.n) if t == 0 else list(dict.fromkeys(obs.entry.preempted))
            return holds(rids, t, self._restricted(rids, obs.kv_used))
        return check

    def _lookahead(self, inv: Invariant, full: dict[str, int]) -> Callable[[int], bool]:
        if not self.obs.lookahead:  # no lookahead slots: the KV in use only
            return self._globals(inv, full)
        holds, obs = self._evaluator(inv, full), self.obs

        def check(t: int) -> bool:
            rids = range(obs.n) if t == 0 else list(obs.entry.scheduled)
            return holds(rids, t, self._restricted(rids, obs.kv_used))
        return check

    def _window(self, inv: Invariant, full: dict[str, int]) -> Callable[[int], bool]:
        check = inv.check
        w, support = WINDOW[inv.check][0](full), WINDOW[inv.check][1]

        def window(t: int) -> bool:
            if self._windowed_at != t:
                self._windowed, self._windowed_at = {}, t
            ctx = self._windowed.get((support, w))
            if ctx is None:  # built once per step for all the invariants that read the same frames
                ctx = self._windowed[support, w] = self._frames_back(t, w, self._support(support, w))
            return bool(check(IntOps, ctx, t, **full))
        return window

    def _fairness(self, inv: Invariant, full: dict[str, int]) -> Callable[[int], bool]:
        steps, obs = catalogue.TenantFairnessSteps(**full), self.obs
        frames = _Frames(0, [None])  # type: ignore[list-item]
        ctx = _context(self.policy, self.params, frames)

        def check(t: int) -> bool:
            frames.base, frames.frames[0] = t, self._restricted(range(obs.n), obs.kv_used)
            return steps.holds(IntOps, ctx, t)
        return check

    def _whole(self, inv: Invariant, full: dict[str, int]) -> Callable[[int], bool]:
        check = inv.check
        ctx = _context(self.policy, self.params, _Frames(0, self.frames))
        return lambda t: bool(check(IntOps, ctx, t, **full))

    def step(self, entry: LogStep) -> Violation | None:
        """Advance by one log step; the first invariant (in the chosen order) that fails there. After a
        violation the state still advances, and the first violation is returned again (what is evaluated
        on what changed relies on every earlier step having passed)."""
        obs = self.obs
        obs.apply(entry)
        if self.failed is not None:
            return self.failed
        t = obs.t
        if self.window >= 0:
            self.ring.append((entry.scheduled, obs.produced, set(entry.preempted), obs.kv_used, obs.now_us,
                              obs.touched))
            if self.whole:
                self.frames.append(self._restricted(range(obs.n), obs.kv_used))
        for i, check in enumerate(self.checks):
            if not check(t):
                self.failed = Violation(self.plans[i][0].name, entry.step, entry.line,
                                        violation_context(self.arrivals, entry, obs))
                return self.failed
        return None

    def _support(self, kind: str, w: int) -> list[int]:
        """The requests the windowed frames of this kind need at the current step (see WINDOW)."""
        obs = self.obs
        recent = list(self.ring)[-(w + 1):]
        if kind == "holding":
            rids = set(obs.holding)
        elif kind == "running":
            rids = set(obs.running)
        elif kind == "admissions":
            rids = set(obs.admitted)
            if obs.admitted and obs.waiting:
                urgency = catalogue._urgency  # the invariant's own notion of urgency
                rids.add(min(obs.waiting, key=lambda r: (urgency(self._urgency_ctx, r), r)))
        else:
            rids = set()
            for rec in recent:
                rids |= rec[5]
            if kind == "live":
                rids |= obs.running
                rids |= obs.waiting
                rids |= obs.holding
            elif kind == "running+":
                rids |= obs.running
            elif kind == "witness":
                witness = next((r for r in obs.waiting if r not in rids), None)
                if witness is None:
                    witness = next((r for r in obs.running if r not in rids), None)
                if witness is not None:
                    rids.add(witness)
            else:
                raise InternalError(f"check-log: unknown support {kind!r} in WINDOW")
        return sorted(rids)

    def _frames_back(self, t: int, w: int, rids: list[int]) -> TraceContext:
        """The frames of the last w + 1 steps, each restricted to ``rids``."""
        obs = self.obs
        recent = list(self.ring)[-(w + 1):]
        base = t - len(recent) + 1
        frames = []
        for i, (sched, produced, preempted, kv_used, now_us, _) in enumerate(recent):
            j = base + i
            slots = tuple([obs.slot_at(r, j) for r in rids]) if j < t else tuple([obs.slots[r] for r in rids])
            frames.append(_frame(slots, tuple([sched.get(r, 0) for r in rids]), tuple([r in produced for r in rids]),
                                 tuple([r in preempted for r in rids]), kv_used, now_us))
        return _context(self.policy, tuple([self.params[r] for r in rids]), _Frames(base, frames))


def violation_context(arrivals: Arrivals, entry: LogStep, obs: Observed) -> list[str]:
    return context_lines(arrivals, entry, obs.slots, sorted(obs.live()),
                         sorted(r for r in obs.holding if obs.slots[r]["status"] == CANCELLED), obs.kv_used)


def context_lines(arrivals: Arrivals, entry: LogStep, slots, live: list[int], cancelled_holding: list[int],
                  kv_used: int) -> list[str]:
    """What a violation message shows of the step (both paths): the log's line, each live request, each
    cancelled request still holding blocks (with the counts that keep them there), and each request scheduled
    but not running after the step."""
    ids = arrivals.ids
    context = [f"log line {entry.line}: scheduled {{{', '.join(f'{ids[r]}: {n}' for r, n in entry.scheduled.items())}}}"
               f", preempted {[ids[r] for r in entry.preempted]}, running {entry.running}, "
               f"waiting {entry.waiting}, free_blocks {entry.free_blocks}"]
    for r in live:
        slot = slots[r]
        context.append(f"request {ids[r]}: {Status(slot['status']).name}, computed {slot['num_computed']}, "
                       f"generated {slot['num_generated']}, preemptions {slot['num_preemptions']}")
    if cancelled_holding:
        held = sum(slots[r]["blocks"] for r in cancelled_holding)
        context.append(f"blocks in use {kv_used} (free_blocks {entry.free_blocks}), of which the requests the log "
                       f"still serves hold {kv_used - held}: the other {held} are still held by aborted requests")
    for r in cancelled_holding:
        context.append(f"request {ids[r]}: CANCELLED (aborted at log step {slots[r]['release_step']}), still holding {slots[r]['blocks']} blocks")
    for r, n in entry.scheduled.items():
        status = slots[r]["status"]
        if n and status not in (RUNNING, FINISHED):
            context.append(f"request {ids[r]}: scheduled {n} tokens in this step, {Status(status).name} after it")
    specs = arrivals.specs
    for r in entry.scheduled:
        slot = slots[r]
        if slot["num_generated"] and slot["num_computed"] + 1 < specs[r].prompt_len + slot["num_generated"]:
            context.append(f"request {ids[r]}: {slot['num_generated']} output token(s) after {slot['num_computed']} "
                           f"computed tokens of a {specs[r].prompt_len}-token prompt (taken as prefilled: the "
                           f"record's chunked request is {ids[entry.chunked[0]] if entry.chunked else 'none'})")
    return context


# ----------------------------------------------------------------------------------------- conformance, in lockstep
@dataclass
class Conformance:
    steps: int
    agreeing: int
    first_divergence: int | None
    detail: str
    # steps whose free-block count matches too: the reference path counts them; the streaming one cannot (a
    # fast-forwarded stretch has no per-step pool), so it is not part of the comparison of two results
    free_blocks_agreeing: int | None = field(default=None, compare=False)
    # SGLang's radix cache (reference path): steps whose evictable and protected tokens match the record's too
    tree_agreeing: int | None = field(default=None, compare=False)

    @property
    def share(self) -> float:
        return self.agreeing / self.steps if self.steps else 1.0


class _FixedClock:
    """The fast-forward's durations on the fixed clock: every step STEP_US, as many as start before the
    horizon (the Profile method stretch_durations calls)."""

    @staticmethod
    def decode_steps_us(seqs: int, context: int, max_steps: int, start_us: int, horizon_us: int | None) -> list[int]:
        if horizon_us is not None:
            max_steps = min(max_steps, max(0, -(-(horizon_us - start_us) // STEP_US)))
        return [STEP_US] * max_steps


MAX_STRETCH = 1 << 30


class Lockstep:
    """The engine on the log's arrivals under the policy, one step per log step (step k at k * STEP_US, as
    replay_fixed_clock runs it), compared with the log as it is read. Quiet decode stretches (every
    running request decodes one token, until an event) are applied at once, as the engine's simulate does
    (checker/fastforward.py, engine.quiet_stretch): each of their steps schedules one token per running request,
    arrivals behind the queue's head join them, and the last may be the step in which the first requests reach
    their last token (it finishes them)."""

    def __init__(self, policy: Policy, arrivals: Arrivals, fast_forward: bool = True):
        self.s = SchedulerState(policy, arrivals.specs, num_tenants=1)
        self.clock = _Clock(self.s.requests)
        self.ids = arrivals.ids
        self.next = 0  # the engine's next step
        self.quiet: dict[int, int] = {}
        self.quiet_until = 0  # steps before this one are a quiet stretch already applied
        self.quiet_finished: list[int] = []  # requests the stretch's last step (quiet_until - 1) finishes, sorted
        self.fast_forward = fast_forward  # next_steps_are_quiet_decodes says no where it does not apply
        self.steps = self.agreeing = 0
        self.first: int | None = None
        self.detail = ""

    def _stretch(self, start: int) -> None:
        s = self.s
        durations, finishing, _ = quiet_stretch(s, _FixedClock, self.clock, start * STEP_US, MAX_STRETCH)
        k = len(durations)
        if k:
            self.quiet = {r.rid: 1 for r in s.running}
            apply_stretch(s, k)
            self.quiet_finished = sorted([r.rid for r in finish_stretch(s)]) if finishing else []
            self.quiet_until = self.next = start + k

    def _quiet(self, k: int) -> tuple[dict[int, int], list[int], list[int]]:
        """The engine's decision at step k of the quiet stretch."""
        return self.quiet, [], self.quiet_finished if k == self.quiet_until - 1 else []

    def engine(self, k: int) -> tuple[dict[int, int], list[int], list[int]]:
        """What the engine scheduled, preempted and finished at step k (steps asked in order)."""
        while True:
            if k < self.quiet_until:
                return self._quiet(k)
            j = self.next
            if j > k:
                raise InternalError(f"check-log: engine step {k} asked after step {j - 1}")
            now = j * STEP_US
            arrived, cancelled = self.clock.due(now)
            d = step(self.s, arrived, cancelled, now)
            self.next = j + 1
            if self.fast_forward and d.scheduled and next_steps_are_quiet_decodes(self.s, d):
                self._stretch(j + 1)
            if j == k:
                return dict(d.scheduled), sorted(d.preempted), sorted(d.finished)

    def feed(self, entry: LogStep) -> bool:
        """Compare one log step with the engine's; whether they agree."""
        self.steps += 1
        if entry.accepted and self.s.spec is not None:  # the verifier's choices, before the engine's step
            speculative.feed(self.s, entry.accepted)
        if entry.step < self.quiet_until:  # in a quiet stretch: one token per running request, finishes at its end
            ours = self._quiet(entry.step)
            agree = (entry.scheduled == self.quiet and not entry.preempted
                     and (sorted(entry.finished) == ours[2] if entry.finished else not ours[2]))
        else:
            ours = self.engine(entry.step)
            agree = (ours[0] == entry.scheduled and ours[1] == sorted(entry.preempted)
                     and ours[2] == sorted(entry.finished))
        if agree:
            self.agreeing += 1
            return True
        if self.first is None:
            self.first = entry.step
            self.detail = divergence_detail(self.ids, entry, ours)
        return False

    def result(self) -> Conformance:
        return Conformance(self.steps, self.agreeing, self.first, self.detail)


def divergence_detail(ids: list[Any], entry: LogStep, ours: tuple) -> str:
    theirs = (entry.scheduled, sorted(entry.preempted), sorted(entry.finished))
    name = lambda rids: [ids[r] for r in rids]  # noqa: E731
    return (f"step {entry.step} (log line {entry.line}): engine scheduled "
            f"{ {ids[r]: n for r, n in ours[0].items()} }, preempted {name(ours[1])}, finished "
            f"{name(ours[2])}; log scheduled { {ids[r]: n for r, n in theirs[0].items()} }, "
            f"preempted {name(theirs[1])}, finished {name(theirs[2])}")


# ----------------------------------------------------------------------------------------- the streaming check
@dataclass
class CheckLogResult:
    steps: int  # log steps read
    invariants: list[tuple[Invariant, dict[str, int]]]
    violation: Violation | None
    notes: list[str]  # the first MAX_NOTES
    notes_total: int
    conformance: Conformance | None
    requests: int
    done: int  # requests finished or aborted in the log (when every step was observed)
    stopped: str | None = None  # --follow: "violation", "finished" (every request done) or "idle"


def check_stream(policy: Policy, arrivals: Arrivals, steps: Iterator[LogStep],
                 invariants: list[tuple[Invariant, dict[str, int]]], with_conformance: bool = False,
                 fast_forward: bool = True, stop_early: bool = False,
                 progress: Callable[[CheckLogResult], None] | None = None,
                 progress_every_s: float = 1.0, identity: IdentityNotes | None = None) -> CheckLogResult:
    """Check a stream of log steps: the first violation (as check_log finds it), the notes, and with
    ``with_conformance`` the comparison with the engine (as conformance computes it). Without
    ``stop_early`` every step is read (the notes and conformance cover the whole log, as the reference
    path's do); with it (following a log) reading stops at a violation or once every request is done."""
    checker = Incremental(policy, arrivals, invariants)
    obs = checker.obs
    lockstep = Lockstep(policy, arrivals, fast_forward) if with_conformance else None
    result = CheckLogResult(0, invariants, None, [], 0, None, obs.n, 0)
    shown = time.monotonic()
    diverged = False
    for entry in steps:
        result.steps += 1
        result.violation = checker.step(entry)  # after a violation: only the state advances (for the notes)
        if len(obs.running) != entry.running or len(obs.waiting) != entry.waiting:
            result.notes_total += 1
            if len(result.notes) < MAX_NOTES:
                result.notes.append(obs.note())
        if lockstep is not None:
            lockstep.feed(entry)
        if identity is not None:
            identity.feed(entry.step, entry.pool_counts)
        if stop_early:
            result.done = obs.done
            if result.violation is not None:
                result.stopped = "violation"
                break
            if obs.done == obs.n:
                result.stopped = "finished"
                break
            if progress is not None:
                now = time.monotonic()
                new_divergence = lockstep is not None and lockstep.first is not None and not diverged
                if new_divergence or now - shown >= progress_every_s:
                    diverged = diverged or new_divergence
                    shown = now
                    result.conformance = lockstep.result() if lockstep is not None else None
                    progress(result)
    result.done = obs.done
    result.conformance = lockstep.result() if lockstep is not None else None
    return result


def default_invariants(policy: Policy) -> list[str]:
    """What check-log checks when no --invariant is given: CHECK_LOG_INVARIANTS, a cancelled request's blocks
    due back after the policy's own release lag; with a KV connector, after its release rule's bound (an aborted
    load's report within connector.max_load_steps, or the deadline), and a pinned request's likewise
    (finished_releases)."""
    lag = policy.cancellation.release_lag_steps
    con = policy.connector
    deadline = con.release_deadline_steps if con.release is ReleaseRule.DEADLINE else None
    if con.loads and con.release is not ReleaseRule.IMMEDIATE:
        lag = max(lag, deadline or con.max_load_steps)
    names = [f"{name}:steps={lag}" if name == "cancellation_releases" else name for name in CHECK_LOG_INVARIANTS]
    if con.pins:
        names.append(f"finished_releases:steps={deadline or con.max_load_steps + 1}")
    if policy.scheduler is Scheduler.SGLANG:  # its records name the chunked request: a truncated prompt shows
        names.append("prompt_fully_computed")
    return names


def _says_what_is_held(log: str | Path) -> bool:
    """Whether the log's first line carries a connector's ``held`` field (tests/vllm_connector_driver.py)."""
    try:
        for line_no, raw in log_lines(log):
            rec = parse_line(raw, line_no, str(log))
            return isinstance(rec, dict) and "held" in rec
    except InputError:
        return False  # the reading proper reports it
    return False


def run_check_log(policy: PolicyInput, log: str | Path, arrivals: str | Path, invariants: list[str] | None = None,
                  with_conformance: bool = False, *, follow: bool = False, follow_idle_s: float = 10.0,
                  progress: Callable[[CheckLogResult], None] | None = None,
                  fast_forward: bool = True) -> CheckLogResult:
    """Check invariants on a real scheduler's per-step log, read line by line; optionally compare it with
    the engine. ``follow``: read the log as it grows, stop at a violation, when every request is done or
    after ``follow_idle_s`` seconds without a new line (CheckLogResult.stopped says which)."""
    from checker.inputfiles import load_policy
    from checker.verify.run import parse_invariant

    pol = load_policy(policy)
    arr = load_arrivals(arrivals)
    names = list(invariants or default_invariants(pol))
    cache_note = None
    held = pol.connector.enabled and _says_what_is_held(log)
    for blind_under, blinded, what, why, under, because in _BLIND_RULES:
        if not blind_under(pol, held):
            continue
        blind = [text for text in names if text.split(":", 1)[0] in blinded]
        if blind and invariants:
            raise InputError(Problem("--invariant", blind[0], f"an invariant a log can show under a policy with {what}: "
                                     f"{why}, so the blocks each request holds are unknown (use --conformance: the "
                                     "engine models them)"))
        if blind:
            names = [text for text in names if text not in blind]
            cache_note = f"not checked under {under}: {', '.join(t.split(':', 1)[0] for t in blind)} ({because})"
    chosen = [parse_invariant(text) for text in names]
    waiter = Follow(idle_s=follow_idle_s) if follow else None
    identity = IdentityNotes(pol) if pol.scheduler is Scheduler.SGLANG and not follow else None
    result = check_stream(pol, arr, stream_log(log, arr, waiter, pol.kv.block_size), chosen, with_conformance, fast_forward,
                          stop_early=follow, progress=progress, identity=identity)
    if waiter is not None and result.stopped is None:
        result.stopped = waiter.stopped or "idle"
    if cache_note is not None:
        result.notes.insert(0, cache_note)
        result.notes_total += 1
    if identity is not None:
        result.notes[:0] = identity.notes
        result.notes_total += identity.failing
    return result


# ----------------------------------------------------------------------------------------- the reference path
def load_log(path: str | Path, arrivals: Arrivals, page: int = 1) -> list[LogStep]:
    """The whole log in memory (the reference path; the CLI streams it with stream_log)."""
    source = str(path)
    steps = [parse_step(rec, line_no, arrivals, source, page) for line_no, _, rec in json_lines(path)]
    if not steps:
        raise InputError(Problem("lines", 0, "at least one step"), source)
    for prev, cur in zip(steps, steps[1:]):
        if cur.step != prev.step + 1:
            raise InputError(Problem("step", cur.step, f"consecutive steps ({prev.step + 1} after {prev.step})", cur.line), source)
    return steps


def observed_frames(policy: Policy, arrivals: Arrivals, log: list[LogStep]) -> tuple[TraceContext, list[str]]:
    """Frames reconstructed from the log, and notes where the log's counts disagree with them."""
    specs = arrivals.specs
    size = policy.kv.block_size
    slots = [{**{f: 0 for f in FIELDS}, "status": int(Status.PENDING), "release_step": -1} for _ in specs]
    keep_aborted = not policy.kv.prefix_caching.enabled
    aborted_holding: list[int] = []  # in abort order
    seq = 1
    frames: list[Frame] = []
    notes: list[str] = []
    prompt = [s.prompt_len for s in specs]  # as the scheduler takes it (SGLang's truncation shortens one)
    # speculative decoding and async scheduling: the same rules as Observed (_verified, _verified_later, _resolve)
    lookahead = policy.speculative.lookahead_slots if policy.speculative.enabled else None
    max_len, in_flight = policy.max_model_len, policy.pipeline.enabled
    pending: list[tuple[int, int]] = []  # (request, drafts rejected) of the last line's rows, rolled back in this one

    def preempt(r: int) -> None:
        nonlocal seq
        slots[r].update(status=int(Status.WAITING), num_computed=0, blocks=0,
                        num_preemptions=slots[r]["num_preemptions"] + 1, requeue_seq=seq)
        preempted[r] = True
        seq += 1

    for t, entry in enumerate(log):
        k = entry.step
        produced = [False] * len(specs)
        preempted = [False] * len(specs)
        rollbacks: list[tuple[int, int]] = []
        for s, slot in zip(specs, slots):
            if slot["status"] == int(Status.PENDING) and s.arrival_us <= k * STEP_US:
                slot["status"] = int(Status.WAITING)
        def abort(r: int) -> None:
            slots[r].update(status=int(Status.CANCELLED), reason=int(Reason.ABORTED))
            if keep_aborted and slots[r]["blocks"]:  # until the log's free blocks show them freed (below)
                slots[r]["release_step"] = k  # the abort's log step (request_conservation: it may hold KV)
                if r not in aborted_holding:
                    aborted_holding.append(r)
            else:
                slots[r]["blocks"] = 0

        for r in entry.aborted:
            if r not in entry.scheduled:  # scheduled too (SGLang): aborted after its row (below)
                abort(r)
        for r in entry.preempted:
            if r not in entry.scheduled:  # scheduled too: preempted after its tokens (below)
                preempt(r)
        for r, n in entry.scheduled.items():
            slot = slots[r]
            if slot["status"] == LOADING:  # promoted and admitted in this step
                slot["num_computed"] = loaded_tokens(specs[r])
            if slot["status"] != int(Status.RUNNING):
                slot.update(status=int(Status.RUNNING), admitted_seq=seq)
                seq += 1
            if lookahead is not None and entry.accepted and r in entry.accepted:
                c, g, a = slot["num_computed"], slot["num_generated"], entry.accepted[r]
                slot["blocks"] = max(slot["blocks"], blocks_for(min(c + n + lookahead, max_len), size))
                if in_flight:  # every draft counted until the next line resolves the batch
                    d = n - (prompt[r] + g - c)
                    slot["num_computed"], slot["num_generated"] = c + n, g + 1 + d
                    rollbacks.append((r, d - a))
                else:
                    m = max(1, min(1 + a, specs[r].output_len - g, max_len - prompt[r] - g))
                    slot["num_computed"], slot["num_generated"] = c + m, g + m
                produced[r] = True
                continue
            slot["num_computed"] += n
            if lookahead is None:
                slot["blocks"] = blocks_for(slot["num_computed"], size)
            else:  # and the lookahead slots; never given back on rejection
                slot["blocks"] = max(slot["blocks"], blocks_for(min(slot["num_computed"] + lookahead, max_len), size))
            if slot["num_computed"] >= prompt[r] + slot["num_generated"]:
                slot["num_generated"] += 1
                produced[r] = True
            elif taken_as_prefilled(entry, r):
                prompt[r] = slot["num_computed"] - slot["num_generated"]
                slot["num_generated"] += 1
                produced[r] = True
        for r in entry.preempted:
            if r in entry.scheduled:
                preempt(r)
        if in_flight:  # the last line's batch resolved: its rejected drafts rolled back
            for r, rejected in pending:
                if rejected and slots[r]["status"] in (RUNNING, WAITING):
                    if slots[r]["status"] == RUNNING:
                        slots[r]["num_computed"] -= rejected
                    slots[r]["num_generated"] -= rejected
            pending = rollbacks
        for r in entry.aborted:
            if r in entry.scheduled:
                abort(r)
        for r in entry.finished:
            slots[r].update(status=int(Status.FINISHED), reason=int(Reason.STOPPED), blocks=0)
        kv_used = policy.kv.num_blocks - entry.free_blocks
        if entry.held is not None:  # the line says what every request that is not running holds
            loading = set(entry.loading)
            for r, slot in enumerate(slots):
                if slot["status"] != RUNNING:
                    slot.update(held_update(slot, specs[r], entry.held.get(r, 0), r in loading, k))
            aborted_holding.clear()
        elif aborted_holding:
            others = sum(s["blocks"] for i, s in enumerate(slots) if i not in aborted_holding)
            for r, left in release_aborted(aborted_holding, [slots[r]["blocks"] for r in aborted_holding],
                                           kv_used - others):
                slots[r]["blocks"] = left
                if not left:
                    slots[r]["release_step"] = -1
                    aborted_holding.remove(r)
        running = sum(s["status"] == int(Status.RUNNING) for s in slots)
        waiting = sum(s["status"] in (WAITING, LOADING) for s in slots)
        if (running, waiting) != (entry.running, entry.waiting):
            notes.append(f"step {k}: the log counts running={entry.running} waiting={entry.waiting}, the arrivals and "
                         f"events give running={running} waiting={waiting}")
        frames.append(Frame(
            slots=tuple(dict(s) for s in slots),
            scheduled=tuple(entry.scheduled.get(r, 0) for r in range(len(specs))),
            produced=tuple(produced), preempted=tuple(preempted),
            kv_used=kv_used, now_us=k * STEP_US))
    params = tuple(SlotParams(s.arrival_us, s.prompt_len, s.output_len, s.max_output, s.priority, s.tenant)
                   for s in specs)
    return TraceContext(policy, params, frames), notes


def check_log(policy: Policy, arrivals: Arrivals, log: list[LogStep],
              invariants: list[tuple[Invariant, dict[str, int]]]) -> tuple[Violation | None, list[str]]:
    """The first step at which an invariant fails on the observed states (and the log's inconsistencies):
    the reference path, on whole frames."""
    ctx, notes = observed_frames(policy, arrivals, log)
    for t, entry in enumerate(log):
        for inv, params in invariants:
            if not inv.holds(IntOps, ctx, t, params):
                frame = ctx.frames[t]
                slots = frame.slots
                live = [r for r, slot in enumerate(slots) if slot["status"] in (WAITING, RUNNING, LOADING)]
                holding = [r for r, slot in enumerate(slots) if slot["status"] == CANCELLED and slot["blocks"]]
                context = context_lines(arrivals, entry, slots, live, holding, frame.kv_used)
                return Violation(inv.name, entry.step, entry.line, context), notes
    return None, notes


def conformance(policy: Policy, arrivals: Arrivals, log: list[LogStep]) -> Conformance:
    """Run the engine on the same arrivals, step by step, and compare what each schedules, preempts and
    finishes with the log (the reference path: every engine decision recorded)."""
    first = log[0].step
    replay = replay_fixed_clock(policy, with_accepted(arrivals.specs, log, policy), first + len(log), STEP_US, 1)
    agreeing, free_agreeing, divergence, detail = 0, 0, None, ""
    tree_agreeing = 0 if policy.scheduler is Scheduler.SGLANG and policy.sglang.radix_cache else None
    for entry in log:
        d = replay.decisions[entry.step]
        ours = (dict(d.scheduled), sorted(d.preempted), sorted(d.finished))
        theirs = (entry.scheduled, sorted(entry.preempted), sorted(entry.finished))
        free_agreeing += d.kv_blocks_free == entry.free_blocks
        if tree_agreeing is not None and entry.pool_counts is not None:
            tree_agreeing += replay.frames[entry.step].radix == entry.pool_counts[1:3]
        if ours == theirs:
            agreeing += 1
        elif divergence is None:
            divergence = entry.step
            detail = divergence_detail(arrivals.ids, entry, ours)
    return Conformance(len(log), agreeing, divergence, detail, free_agreeing, tree_agreeing)


def with_accepted(specs: list[RequestSpec], log: list[LogStep], policy: Policy) -> list[RequestSpec]:
    """Under speculative decoding, each request's ``accepted`` list as the log's lines give it, in step order (the
    environment's choices the engine reads at its verifying steps); the specs unchanged otherwise."""
    if not policy.speculative.enabled:
        return specs
    given: dict[int, list[int]] = {}
    for entry in log:
        for r, a in (entry.accepted or {}).items():
            given.setdefault(r, []).append(a)
    return [replace(s, accepted=tuple(given[s.rid])) if s.rid in given else s for s in specs]


def engine_log(policy: Policy, arrivals: Arrivals, steps: int) -> list[dict]:
    """What the engine does on the arrivals, in the log format (a reference log, and test fixture)."""
    replay = replay_fixed_clock(policy, arrivals.specs, steps, STEP_US, 1)
    out = []
    for k, d in enumerate(replay.decisions):
        out.append({"step": k, "scheduled": {str(arrivals.ids[r]): n for r, n in d.scheduled},
                    "preempted": [arrivals.ids[r] for r in d.preempted],
                    "finished": [arrivals.ids[r] for r in d.finished],
                    "aborted": [arrivals.ids[r] for r in d.cancelled],
                    "running": d.num_running, "waiting": d.num_waiting, "free_blocks": d.kv_blocks_free})
    return out
