"""SLO counterexamples: the fuzzer's minimal traces, in the same file format as the solver's.

Differences from an invariant counterexample: ``property.kind`` is ``slo`` and carries the property's
spec, the observed and allowed values; the file stores the service-curve ``profile`` (time matters);
``states`` are the engine's iterations (what each scheduled, admitted, preempted and finished, and the KV
in use). ``batchcheck replay`` re-simulates it under the stored (or a given) policy.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from pydantic import TypeAdapter

from checker.engine import simulate
from checker.fuzz.slo import Outcome, Property, evaluate
from checker.policy import Policy
from checker.profile import Profile
from checker.traces import RequestSet
from checker.verify import counterexample as cex

PROPERTY = TypeAdapter(Property)


def build(policy: Policy, policy_file: str | None, profile: Profile, prop: Property, outcome: Outcome,
          requests: RequestSet, search: dict[str, Any]) -> dict[str, Any]:
    result = simulate(policy, requests, profile, record=True)
    states = [{"#meta": {"index": k}, "iteration": k, "now_us": d.now_us, "kv_used": d.kv_blocks_used,
               "scheduled": {str(rid): n for rid, n in d.scheduled}, "admitted": list(d.admitted),
               "preempted": list(d.preempted), "finished": list(d.finished), "cancelled": list(d.cancelled),
               "rejected": [rid for rid, _ in d.rejected]} for k, d in enumerate(result.decisions or [])]
    rows = cex.requests_json(requests.specs)
    for row, spec in zip(rows, requests.specs):
        row["class"] = requests.class_names[spec.cls]
        row["tenant"] = requests.tenant_names[spec.tenant]
    return {
        "#meta": {"format": "ITF", "format-description": cex.ITF_DESCRIPTION, "source": "hypothesis search, shrunk",
                  "description": f"{prop.name} violated by {policy.name}"},
        "format": cex.FORMAT, "version": 1,
        "policy": {"name": policy.name, "file": policy_file, "sha256": cex.policy_hash(policy),
                   "spec": policy.model_dump(mode="json")},
        "property": {"kind": "slo", "name": prop.name, "spec": PROPERTY.dump_python(prop, mode="json", by_alias=True),
                     "observed": outcome.observed, "allowed": outcome.allowed, "detail": outcome.detail},
        "verdict": {"verdict": "VIOLATED", "minimal": "shrunk by Hypothesis (fewer, shorter, simpler requests)"},
        "environment": search,
        "profile": {"name": profile.name, "spec": profile.model_dump(mode="json")},
        "requests": rows,
        "violation": {"iteration": None},
        "vars": ["iteration", "now_us", "kv_used", "scheduled", "admitted", "preempted", "finished", "cancelled",
                 "rejected"],
        "states": states,
    }


@dataclass
class SloReplay:
    policy: Policy
    prop: Property
    outcome: Outcome
    recorded: dict[str, Any]
    table: str

    @property
    def violated(self) -> bool:
        return not self.outcome.holds


def request_set(doc: dict[str, Any]) -> RequestSet:
    """The requests of an SLO counterexample, with their class and tenant names."""
    rows = doc["requests"]
    names = [("default" if r.get("class") is None else r["class"]) for r in rows]  # class null: none recorded
    classes = sorted(set(names))
    tenants = sorted({str(r.get("tenant", "default")) for r in rows})
    specs = [replace(s, cls=classes.index(name), tenant=tenants.index(str(r.get("tenant", "default"))))
             for s, r, name in zip(cex.specs_from_json([{**r, "tenant": 0} for r in rows]), rows, names)]
    return RequestSet(specs, classes, tenants, "counterexample")


def replay(doc: dict[str, Any], policy: Policy | None = None) -> SloReplay:
    policy = policy or Policy.model_validate(doc["policy"]["spec"])
    profile = Profile.model_validate(doc["profile"]["spec"])
    prop = PROPERTY.validate_python(doc["property"]["spec"])
    requests = request_set(doc)
    classes = requests.class_names
    result = simulate(policy, requests, profile)
    outcome = evaluate(prop, result.summary())
    t = result.times
    lines = [("req", "class", "arrive_ms", "prompt", "output", "status", "ttft_ms", "tpot_ms", "max_tbt_ms", "preempt")]
    for r in result.state.requests:
        rid = r.rid
        ttft = (t.first_token[rid] - r.arrival_us) / 1000 if t.first_token[rid] >= 0 else None
        tpot = ((t.done[rid] - t.first_token[rid]) / 1000 / (r.num_generated - 1)
                if r.num_generated > 1 and t.done[rid] >= 0 else None)
        lines.append((str(rid), classes[r.spec.cls], f"{r.arrival_us / 1000:g}", str(r.prompt_len), str(r.output_len),
                      r.status.name, "-" if ttft is None else f"{ttft:.1f}", "-" if tpot is None else f"{tpot:.1f}",
                      f"{t.max_gap[rid] / 1000:.1f}", str(r.num_preemptions)))
    widths = [max(len(row[i]) for row in lines) for i in range(len(lines[0]))]
    table = "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in lines)
    return SloReplay(policy, prop, outcome, doc["property"], table)
