"""Runtime verification of a canary: check the invariant catalogue on a real scheduler's per-step log.

Log format (JSON lines, one per step; docs/check-log.md): ``step`` (int), ``scheduled`` (object: request
id -> tokens scheduled in the step), ``preempted``, ``finished``, ``aborted`` (lists of request ids),
``running``, ``waiting`` (counts after the step), ``free_blocks`` (int). Arrivals: a JSON list of
``{id, arrival_step, prompt_tokens, output_tokens, priority, abort_step?}``. This is what one gets by
driving vLLM's v1 ``Scheduler`` with ``schedule()`` / ``update_from_output()`` and a fake runner.

The log is turned into the same frames the engine produces (per request: status, computed and generated
tokens, blocks of its computed tokens, preemptions), with the observed KV in use (pool - free_blocks),
so the very same invariant predicates run on it. ``--conformance`` also runs the engine on the arrivals
under the policy and compares the two step by step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from checker.errors import InputError, Problem
from checker.frames import Frame, TraceContext
from checker.loading import json_lines, load_document
from checker.policy import Policy
from checker.semantics.kv import blocks_for
from checker.semantics.state import FIELDS, Reason, Status
from checker.requests import RequestSpec
from checker.smt.encode import SlotParams
from checker.smt.ops import IntOps
from checker.verify.replay import replay_fixed_clock
from invariants.catalogue import Invariant

STEP_US = 1000  # log steps are placed 1 ms apart on the engine's clock
LOG_KEYS = ("step", "scheduled", "preempted", "finished", "aborted", "running", "waiting", "free_blocks")


@dataclass(frozen=True)
class LogStep:
    step: int
    scheduled: dict[int, int]
    preempted: list[int]
    finished: list[int]
    aborted: list[int]
    running: int
    waiting: int
    free_blocks: int
    line: int


@dataclass
class Arrivals:
    specs: list[RequestSpec]
    ids: list[Any]  # the log's id of each request, by request number
    index: dict[Any, int]


def load_arrivals(path: str | Path) -> Arrivals:
    data, _ = load_document(path)
    source = str(path)
    if not isinstance(data, list):
        raise InputError(Problem("", type(data).__name__, "a JSON list of {id, arrival_step, prompt_tokens, "
                                 "output_tokens, priority, abort_step?}"), source)
    rows = []
    for i, row in enumerate(data):
        if not isinstance(row, dict):
            raise InputError(Problem(f"[{i}]", row, "an object"), source)
        for key in ("id", "arrival_step", "prompt_tokens", "output_tokens"):
            if key not in row:
                raise InputError(Problem(f"[{i}].{key}", "<missing>", "this field to be given"), source)
        for key in ("arrival_step", "prompt_tokens", "output_tokens", "priority", "abort_step"):
            value = row.get(key)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
                raise InputError(Problem(f"[{i}].{key}", value, "a whole number >= 0"), source)
        if row["prompt_tokens"] < 1 or row["output_tokens"] < 1:
            raise InputError(Problem(f"[{i}].prompt_tokens/output_tokens", f"{row['prompt_tokens']}/{row['output_tokens']}",
                                     "both >= 1"), source)
        rows.append(row)
    order = sorted(range(len(rows)), key=lambda i: (rows[i]["arrival_step"], i))
    specs, ids = [], []
    for rid, i in enumerate(order):
        row = rows[i]
        abort = row.get("abort_step")
        specs.append(RequestSpec(rid=rid, arrival_us=row["arrival_step"] * STEP_US, prompt_len=row["prompt_tokens"],
                                 output_len=row["output_tokens"], max_output=row["output_tokens"],
                                 priority=row.get("priority", 0), tenant=0, cls=0,
                                 cancel_us=None if abort is None else abort * STEP_US))
        ids.append(row["id"])
    index = {key: rid for rid, key in enumerate(ids)}
    if len(index) != len(ids):
        raise InputError(Problem("id", "<duplicate>", "each request id once"), source)
    return Arrivals(specs, ids, index)


def load_log(path: str | Path, arrivals: Arrivals) -> list[LogStep]:
    source = str(path)
    steps = []
    for line_no, _, rec in json_lines(path):
        missing = [k for k in LOG_KEYS if not isinstance(rec, dict) or k not in rec]
        if missing:
            raise InputError(Problem(missing[0], "<missing>", "the keys " + ", ".join(LOG_KEYS), line_no), source)

        def rid(key: Any, field_name: str, line_no: int = line_no) -> int:
            if key not in arrivals.index and str(key) not in arrivals.index:
                raise InputError(Problem(field_name, key, "a request id from the arrivals file", line_no), source)
            return arrivals.index.get(key, arrivals.index.get(str(key)))  # type: ignore[return-value]

        scheduled = {}
        for key, n in (rec["scheduled"] or {}).items():
            if not isinstance(n, int) or n < 1:
                raise InputError(Problem(f"scheduled.{key}", n, "a token count >= 1", line_no), source)
            scheduled[rid(key, "scheduled")] = n
        steps.append(LogStep(
            step=rec["step"], scheduled=scheduled,
            preempted=[rid(k, "preempted") for k in rec["preempted"] or []],
            finished=[rid(k, "finished") for k in rec["finished"] or []],
            aborted=[rid(k, "aborted") for k in rec["aborted"] or []],
            running=rec["running"], waiting=rec["waiting"], free_blocks=rec["free_blocks"], line=line_no))
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
    seq = 1
    frames: list[Frame] = []
    notes: list[str] = []
    for entry in log:
        k = entry.step
        produced = [False] * len(specs)
        preempted = [False] * len(specs)
        for s, slot in zip(specs, slots):
            if slot["status"] == int(Status.PENDING) and s.arrival_us <= k * STEP_US:
                slot["status"] = int(Status.WAITING)
        for r in entry.aborted:
            slots[r].update(status=int(Status.CANCELLED), reason=int(Reason.ABORTED), blocks=0)
        for r in entry.preempted:
            slots[r].update(status=int(Status.WAITING), num_computed=0, blocks=0,
                            num_preemptions=slots[r]["num_preemptions"] + 1, requeue_seq=seq)
            preempted[r] = True
            seq += 1
        for r, n in entry.scheduled.items():
            slot = slots[r]
            if slot["status"] != int(Status.RUNNING):
                slot.update(status=int(Status.RUNNING), admitted_seq=seq)
                seq += 1
            slot["num_computed"] += n
            slot["blocks"] = blocks_for(slot["num_computed"], size)
            if slot["num_computed"] >= specs[r].prompt_len + slot["num_generated"]:
                slot["num_generated"] += 1
                produced[r] = True
        for r in entry.finished:
            slots[r].update(status=int(Status.FINISHED), reason=int(Reason.STOPPED), blocks=0)
        running = sum(s["status"] == int(Status.RUNNING) for s in slots)
        waiting = sum(s["status"] == int(Status.WAITING) for s in slots)
        if (running, waiting) != (entry.running, entry.waiting):
            notes.append(f"step {k}: the log counts running={entry.running} waiting={entry.waiting}, the arrivals and "
                         f"events give running={running} waiting={waiting}")
        frames.append(Frame(
            slots=tuple(dict(s) for s in slots),
            scheduled=tuple(entry.scheduled.get(r, 0) for r in range(len(specs))),
            produced=tuple(produced), preempted=tuple(preempted),
            kv_used=policy.kv.num_blocks - entry.free_blocks, now_us=k * STEP_US))
    params = tuple(SlotParams(s.arrival_us, s.prompt_len, s.output_len, s.max_output, s.priority, s.tenant)
                   for s in specs)
    return TraceContext(policy, params, frames), notes


@dataclass
class Violation:
    invariant: str
    step: int
    line: int
    context: list[str] = field(default_factory=list)


def check_log(policy: Policy, arrivals: Arrivals, log: list[LogStep],
              invariants: list[tuple[Invariant, dict[str, int]]]) -> tuple[Violation | None, list[str]]:
    """The first step at which an invariant fails on the observed states (and the log's inconsistencies)."""
    ctx, notes = observed_frames(policy, arrivals, log)
    for t, entry in enumerate(log):
        for inv, params in invariants:
            if not inv.holds(IntOps, ctx, t, params):
                frame = ctx.frames[t]
                context = [f"log line {entry.line}: scheduled {{{', '.join(f'{arrivals.ids[r]}: {n}' for r, n in entry.scheduled.items())}}}"
                           f", preempted {[arrivals.ids[r] for r in entry.preempted]}, running {entry.running}, "
                           f"waiting {entry.waiting}, free_blocks {entry.free_blocks}"]
                for r, slot in enumerate(frame.slots):
                    if slot["status"] in (int(Status.RUNNING), int(Status.WAITING)):
                        context.append(f"request {arrivals.ids[r]}: {Status(slot['status']).name}, computed "
                                       f"{slot['num_computed']}, generated {slot['num_generated']}, "
                                       f"preemptions {slot['num_preemptions']}")
                return Violation(inv.name, entry.step, entry.line, context), notes
    return None, notes


@dataclass
class Conformance:
    steps: int
    agreeing: int
    first_divergence: int | None
    detail: str

    @property
    def share(self) -> float:
        return self.agreeing / self.steps if self.steps else 1.0


def conformance(policy: Policy, arrivals: Arrivals, log: list[LogStep]) -> Conformance:
    """Run the engine on the same arrivals, step by step, and compare what each schedules, preempts and
    finishes with the log."""
    first = log[0].step
    replay = replay_fixed_clock(policy, arrivals.specs, first + len(log), STEP_US, 1)
    agreeing, divergence, detail = 0, None, ""
    for entry in log:
        d = replay.decisions[entry.step]
        ours = (dict(d.scheduled), sorted(d.preempted), sorted(d.finished))
        theirs = (entry.scheduled, sorted(entry.preempted), sorted(entry.finished))
        if ours == theirs:
            agreeing += 1
        elif divergence is None:
            divergence = entry.step
            name = lambda rids: [arrivals.ids[r] for r in rids]  # noqa: E731
            detail = (f"step {entry.step} (log line {entry.line}): engine scheduled "
                      f"{ {arrivals.ids[r]: n for r, n in ours[0].items()} }, preempted {name(ours[1])}, finished "
                      f"{name(ours[2])}; log scheduled { {arrivals.ids[r]: n for r, n in theirs[0].items()} }, "
                      f"preempted {name(theirs[1])}, finished {name(theirs[2])}")
    return Conformance(len(log), agreeing, divergence, detail)


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
