"""Counterexample files: self-contained, replayable, written atomically.

Format (``batchcheck-counterexample`` version 1, documented in docs/counterexamples.md): the policy
(its spec and its hash), the property and its parameters, the environment assumptions, the requests
(the same shape as the JSON trace format), the clock, and the state after every iteration as a list
of states in the ITF convention (``#meta``, ``vars``, ``states``), so TLA+ trace tools can read it.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from checker import fileio
from checker.errors import InputError, Problem
from checker.loading import load_document
from checker.policy import Policy
from checker.semantics.state import Status
from checker.requests import RequestSpec
from checker.traces import TRANSFER_FIELDS, transfer_fields

FORMAT = "batchcheck-counterexample"
ITF_DESCRIPTION = "https://apalache-mc.org/docs/adr/015adr-trace.html"  # the trace format of "vars" and "states"
STATUS_NAMES = {int(s): s.name for s in Status}


# Fields added after policies were first hashed, with the value that leaves the semantics as before: left out
# of the hash at that value, so files recorded earlier (counterexamples, certificates) keep their hash.
LATER_FIELDS = (("chunking", "threshold_when_alone", True), ("chunking", "threshold_adaptive", False),
                ("kv", "prefix_caching", {"enabled": False, "count_evictable_hits": True, "chained_hashes": True}),
                ("speculative", "reserve_lookahead", True), ("queue", "blocked_waiting", "off"),
                ("connector", "load_failure", "fail"), ("connector", "loads_may_fail", False))
LATER_SECTIONS = (("connector", Policy.model_fields["connector"].default_factory().model_dump(mode="json")),
                  ("scheduler", "vllm"),
                  ("sglang", Policy.model_fields["sglang"].default_factory().model_dump(mode="json")),
                  ("speculative", Policy.model_fields["speculative"].default_factory().model_dump(mode="json")),
                  ("pipeline", Policy.model_fields["pipeline"].default_factory().model_dump(mode="json")))


def policy_hash(policy: Policy) -> str:
    data = policy.model_dump(mode="json", exclude={"name"})
    for section, unchanged in LATER_SECTIONS:  # first: a section at its default goes whole, its later fields too
        if data.get(section) == unchanged:
            del data[section]
    for section, name, unchanged in LATER_FIELDS:
        if section in data and data[section].get(name) == unchanged:
            del data[section][name]
    canonical = json.dumps(data, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def requests_json(specs: list[RequestSpec]) -> list[dict]:
    return [{"id": s.rid, "arrival_ms": s.arrival_us / 1000, "prompt_tokens": s.prompt_len,
             "output_tokens": s.output_len, "max_output_tokens": s.max_output, "priority": s.priority,
             "tenant": s.tenant, "cancel_after_ms": None if s.cancel_us is None else (s.cancel_us - s.arrival_us) / 1000,
             **({} if s.content is None else {"prompt_runs": [list(run) for run in s.content]}),
             **transfer_fields(s), **({"accepted": list(s.accepted)} if s.accepted else {})}
            for s in specs]


def specs_from_json(rows: list[dict]) -> list[RequestSpec]:
    specs = []
    for row in rows:
        arrival = round(row["arrival_ms"] * 1000)
        cancel = row.get("cancel_after_ms")
        specs.append(RequestSpec(rid=row["id"], arrival_us=arrival, prompt_len=row["prompt_tokens"],
                                 output_len=row["output_tokens"], max_output=row["max_output_tokens"],
                                 priority=row.get("priority", 0), tenant=row.get("tenant", 0), cls=0,
                                 cancel_us=None if cancel is None else arrival + round(cancel * 1000),
                                 content=None if row.get("prompt_runs") is None
                                 else tuple((int(a), int(n)) for a, n in row["prompt_runs"]),
                                 **{k: row[k] for k in TRANSFER_FIELDS if k in row},
                                 accepted=tuple(int(a) for a in row.get("accepted") or ())))
    return specs


def build(policy: Policy, policy_file: str | None, prop: dict[str, Any], verdict: dict[str, Any],
          environment: dict[str, Any], specs: list[RequestSpec], step_us: int, violation_step: int,
          frames: list[dict], found_by: str) -> dict[str, Any]:
    states = []
    for k, f in enumerate(frames):
        states.append({"#meta": {"index": k}, "iteration": k, "now_us": f["now_us"], "kv_used": f["kv_used"],
                       "requests": [{"id": i, **r, "status": STATUS_NAMES[r["status"]]}
                                    for i, r in enumerate(f["requests"][:len(specs)])]})
    return {
        "#meta": {"format": "ITF", "format-description": ITF_DESCRIPTION,
                  "source": found_by, "description": f"{prop['name']} violated by {policy.name}"},
        "format": FORMAT, "version": 1,
        "policy": {"name": policy.name, "file": policy_file, "sha256": policy_hash(policy),
                   "spec": policy.model_dump(mode="json")},
        "property": prop, "verdict": verdict, "environment": environment,
        "clock": {"step_us": step_us}, "requests": requests_json(specs),
        "violation": {"iteration": violation_step},
        "vars": ["iteration", "now_us", "kv_used", "requests"],
        "states": states,
    }


def file_name(doc: dict[str, Any]) -> str:
    digest = hashlib.sha256(json.dumps([doc["policy"]["sha256"], doc["property"], doc["requests"]],
                                       sort_keys=True).encode()).hexdigest()[:8]
    policy, prop = fileio.safe_name(doc["policy"]["name"], "policy"), fileio.safe_name(doc["property"]["name"])
    return f"{policy}__{prop}__{digest}.json"


def write_atomic(path: Path, text: str) -> None:
    """Write a file atomically, making its directory if needed."""
    fileio.write_atomic(path, text, create_dirs=True)


def save(doc: dict[str, Any], out_dir: Path) -> Path:
    path = out_dir / file_name(doc)
    write_atomic(path, json.dumps(doc, indent=1) + "\n")
    return path


def load(path: str | Path) -> dict[str, Any]:
    data, _ = load_document(path)
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise InputError(Problem("format", data.get("format") if isinstance(data, dict) else data,
                                 f"'{FORMAT}' (a counterexample written by batchcheck)"), str(path))
    prop = data.get("property")
    if not isinstance(prop, dict):
        raise InputError(Problem("property", prop if prop is not None else "<missing>",
                                 "a mapping (kind, name, ...): the property the counterexample violates"), str(path))
    needed = ("policy", "property", "requests", "profile") if prop.get("kind") == "slo" else \
        ("policy", "property", "requests", "clock", "violation")
    for key in needed:
        if key not in data:
            raise InputError(Problem(key, "<missing>", "this section of a counterexample file"), str(path))
    return data
