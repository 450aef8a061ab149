"""Fleet counterexamples: a fleet trace (requests and faults) that violates a property of a fleet, as the search
saves it and ``batchcheck fleet FLEET --replay FILE`` runs it again."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from checker.errors import InputError, Problem
from checker.fileio import safe_name, write_atomic
from checker.fleet.spec import Fault, LoadedFleet
from checker.fuzz.counterexample import request_set
from checker.fuzz.slo import Outcome
from checker.loading import load_document, validate
from checker.traces import RequestSet
from checker.verify import counterexample as verify_cex

FORMAT = "batchcheck-fleet-counterexample"


class FleetCounterexample(BaseModel):
    """A fleet trace that violates a property: the requests (rows as an SLO counterexample holds them,
    checker.fuzz.counterexample) and the faults (as a fleet file declares them)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    format: Literal["batchcheck-fleet-counterexample"]
    fleet: str
    property: Annotated[str, Field(min_length=1)]
    observed: float | None = None
    allowed: float | None = None
    detail: str = ""
    requests: Annotated[list[dict], Field(min_length=1)]
    faults: list[Fault]


def save_counterexample(fleet: LoadedFleet, prop_name: str, outcome: Outcome, requests: RequestSet,
                        faults: list[Fault], out_dir: Path) -> Path:
    rows = verify_cex.requests_json(requests.specs)
    for row, spec in zip(rows, requests.specs):
        row["class"], row["tenant"] = requests.class_names[spec.cls], requests.tenant_names[spec.tenant]
    doc = {"format": FORMAT, "fleet": fleet.name, "property": prop_name, "observed": outcome.observed,
           "allowed": outcome.allowed, "detail": outcome.detail, "requests": rows,
           "faults": [f.model_dump(mode="json") for f in faults]}
    digest = hashlib.sha256(json.dumps([rows, doc["faults"]], sort_keys=True).encode()).hexdigest()[:8]
    path = Path(out_dir) / f"{safe_name(fleet.name, 'fleet')}__{safe_name(prop_name)}__{digest}.json"
    write_atomic(path, json.dumps(doc, indent=1) + "\n", create_dirs=True)
    return path


def load_counterexample(path: str | Path) -> tuple[FleetCounterexample, RequestSet]:
    """A saved fleet counterexample and its requests."""
    data, lines = load_document(path)
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        shown = data.get("format", "<missing>") if isinstance(data, dict) else "<not a mapping>"
        raise InputError(Problem("format", shown, f"'{FORMAT}' (a fleet counterexample written by batchcheck fleet "
                                 "--search --out)"), str(path))
    cex = validate(FleetCounterexample, data, str(path), lines)
    try:
        rs = request_set({"requests": cex.requests})
    except (KeyError, TypeError, ValueError) as exc:
        raise InputError(Problem("requests", f"<a row without {exc}>", "rows as batchcheck writes them (id, "
                                 "arrival_ms, prompt_tokens, output_tokens, max_output_tokens, class, tenant)"),
                         str(path)) from None
    return cex, RequestSet(rs.specs, rs.class_names, rs.tenant_names, str(path))
