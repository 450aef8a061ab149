"""Every --json output has a JSON Schema under docs/schemas/, and real output validates against it (a schema
that no longer matches what the verb prints fails here; so does a verb that drifts from its schema)."""

from __future__ import annotations

import gzip
import json

import jsonschema
import pytest

from checker.cli import main
from tests.helpers import POLICIES, ROOT

SCHEMAS = ROOT / "docs" / "schemas"
WORKLOAD = ROOT / "spec" / "workloads" / "chat_mixed.yaml"


def output(capsys, *argv: str) -> dict:
    main(list(argv))
    return json.loads(capsys.readouterr().out)


def check(name: str, doc: dict) -> None:
    schema = json.loads((SCHEMAS / f"{name}.schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.validate(doc, schema, cls=jsonschema.Draft202012Validator)


def test_simulate(capsys):
    check("simulate", output(capsys, "simulate", str(POLICIES / "vllm_v1.yaml"), "--workload", str(WORKLOAD),
                             "--limit", "20", "--json"))


def test_verify(capsys, tmp_path):
    check("verify", output(capsys, "verify", str(POLICIES / "broken" / "unchecked_growth.yaml"), "--invariant",
                           "kv_never_overcommitted", "--invariant", "token_budget", "--requests", "2", "--depth", "2",
                           "--json", "--out", str(tmp_path)))


def test_liveness(capsys, tmp_path):
    check("liveness", output(capsys, "liveness", str(POLICIES / "strict_priority.yaml"), "--set",
                             "batch.max_num_seqs=1", "--json", "--out", str(tmp_path)))


def test_check_metrics(capsys, tmp_path):
    data = ROOT / "tests" / "data" / "vllm_metrics"
    scrapes = tmp_path / "s.prom"
    scrapes.write_bytes(gzip.decompress((data / "pressure.prom.gz").read_bytes()))
    check("check-metrics", output(capsys, "check-metrics", str(data / "pressure.yaml"), str(scrapes), "--json"))


def test_a_schema_rejects_output_that_drifted():
    doc = {"source": "x", "scrapes": 1, "server": "vllm", "policy": "p",
           "findings": [{"check": "seq_cap", "verdict": "SAFE", "detail": "", "engine": {}, "scrape": None}]}
    with pytest.raises(jsonschema.ValidationError):
        check("check-metrics", doc)


def test_every_schema_is_tested_here():
    tested = {"simulate", "verify", "liveness", "check-metrics"}
    assert {p.name.removesuffix(".schema.json") for p in SCHEMAS.glob("*.schema.json")} == tested
