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
