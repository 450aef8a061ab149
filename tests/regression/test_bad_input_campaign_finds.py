"""Finds of the input-fuzz campaign (bench/input_fuzz.py, issue 23), each its class's test."""

from __future__ import annotations

import json

from tests.cli.test_cli import run
from tests.helpers import ROOT

SLO_CEX = ROOT / "counterexamples" / "sglang_v05__interactive_max_tbt__d8efa1a9.json"


def test_an_slo_counterexample_request_with_class_null_replays(capsys, tmp_path):
    """``class: null`` (the schema allows it: no class recorded) is the default class, as in a report; replay
    sorted the class names and compared None with a string (TypeError, exit 101)."""
    doc = json.loads(SLO_CEX.read_text())
    doc["requests"][0]["class"] = None
    path = tmp_path / "cex.json"
    path.write_text(json.dumps(doc))
    code, out, err = run(capsys, "replay", str(path))
    assert code in (0, 1) and err == "", err
    assert "interactive_max_tbt" in out


def _mutated(tmp_path, name: str, edit) -> str:
    doc = json.loads((ROOT / "counterexamples" / name).read_text())
    edit(doc)
    path = tmp_path / "cex.json"
    path.write_text(json.dumps(doc))
    return str(path)


def test_a_counterexample_number_pydantic_would_coerce_is_refused(capsys, tmp_path):
    """The 100,000-case campaign (2026-12-05): a request id or tenant written 0.0, a parameter written "-1" passed
    pydantic's lax validation, but replay reads the raw document, so the float or string reached the engine
    (TypeError, exit 101, 4 cases). Integers in a counterexample are strict: exit 2, located."""
    path = _mutated(tmp_path, "tiered_unprotected__degradation_order__5d4f6cbb.json",
                    lambda d: d["requests"][0].update(id=0.0))
    assert run(capsys, "replay", path) == (2, "", f"batchcheck: error: {path}:1: requests[0].id=0.0 (expected an "
                                                  "integer)\n")
    path = _mutated(tmp_path, "tiered_unprotected__degradation_order__5d4f6cbb.json",
                    lambda d: d["property"]["params"].update(protected="-1"))
    assert run(capsys, "replay", path) == (2, "", f"batchcheck: error: {path}:1: property.params.protected='-1' "
                                                  "(expected an integer)\n")
    path = _mutated(tmp_path, "strict_priority__eventually_served_lasso__4d3d6ba9.json",
                    lambda d: d["requests"][0].update(tenant=0.0))
    code, out, err = run(capsys, "replay", path)
    assert code == 2 and f"{path}:1: requests[0].tenant" in err and "=0.0 (expected an integer)" in err
