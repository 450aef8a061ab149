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


def test_check_log(capsys, tmp_path):
    from checker.checklog import engine_log, load_arrivals
    from checker.inputfiles import load_policy

    rows = [{"id": "a", "arrival_step": 0, "prompt_tokens": 100, "output_tokens": 20, "abort_step": 9},
            {"id": "b", "arrival_step": 2, "prompt_tokens": 60, "output_tokens": 10}]
    (tmp_path / "arrivals.json").write_text(json.dumps(rows))
    lines = engine_log(load_policy(POLICIES / "vllm_v1.yaml"), load_arrivals(tmp_path / "arrivals.json"), 30)
    (tmp_path / "log.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    argv = ["check-log", str(POLICIES / "vllm_v1.yaml"), str(tmp_path / "log.jsonl"), "--arrivals",
            str(tmp_path / "arrivals.json"), "--conformance", "--json"]
    doc = output(capsys, *argv)
    check("check-log", doc)
    assert doc["violation"] is None and doc["conformance"]["agreeing"] == doc["steps"]
    lines[4]["scheduled"]["b"] = 10 ** 5  # over the token budget
    (tmp_path / "log.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    doc = output(capsys, *argv)
    check("check-log", doc)
    assert doc["violation"]["invariant"] == "token_budget" and doc["exit_code"] == 1


def test_recheck(capsys, tmp_path):
    main(["verify", str(POLICIES / "vllm_v1.yaml"), "--invariant", "token_budget", "--requests", "2", "--depth", "2",
          "--unbounded", "--proof-dir", str(tmp_path), "--out", str(tmp_path)])
    capsys.readouterr()
    [cert] = tmp_path.glob("*.smt2")
    doc = output(capsys, "recheck", str(cert), "--json")
    check("recheck", doc)
    assert doc["holds"] and doc["exit_code"] == 0


def test_fuzz(capsys, tmp_path):
    doc = output(capsys, "fuzz", str(POLICIES / "vllm_v1.yaml"), "--workload", str(WORKLOAD), "--property",
                 "interactive_tpot_p99", "--max-examples", "5", "--time-budget", "30", "--database", "none",
                 "--out", str(tmp_path), "--json")
    check("fuzz", doc)
    assert doc["results"][0]["verdict"] == "VIOLATED" and doc["results"][0]["counterexample"]


def test_import(capsys):
    doc = output(capsys, "import", "vllm", "--max-num-seqs", "8", "--max-model-len", "4096",
                 "--num-gpu-blocks-override", "100", "--json")
    check("import", doc)
    assert doc["policy"]["batch"]["max_num_seqs"] == 8 and doc["assumed"]


def test_a_schema_rejects_output_that_drifted():
    doc = {"source": "x", "scrapes": 1, "server": "vllm", "policy": "p",
           "findings": [{"check": "seq_cap", "verdict": "SAFE", "detail": "", "engine": {}, "scrape": None}]}
    with pytest.raises(jsonschema.ValidationError):
        check("check-metrics", doc)


def test_every_schema_is_tested_here():
    tested = {"simulate", "verify", "liveness", "check-metrics", "check-log", "recheck", "fuzz", "import"}
    assert {p.name.removesuffix(".schema.json") for p in SCHEMAS.glob("*.schema.json")} == tested
