"""Every --json output has a JSON Schema under docs/schemas/, and real output validates against it (a schema
that no longer matches what the verb prints fails here; so does a verb that drifts from its schema)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

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


AUDIT = ROOT / "spec" / "audit"


def test_audit(capsys):
    doc = output(capsys, "audit", str(AUDIT / "illustrative_contract.yaml"), str(AUDIT / "illustrative_workload.yaml"),
                 "--json")
    check("audit", doc)
    assert doc["failure"] is None and doc["exit_code"] == 0 and "derived" not in doc
    doc = output(capsys, "audit", "--policy", str(POLICIES / "vllm_v1.yaml"), "--workload", str(WORKLOAD),
                 "--ttft-slo-ms", "1", "--json")  # the derived form, a bound that fails
    check("audit", doc)
    assert doc["failure"]["bound"] == doc["decision"] and doc["exit_code"] == 1 and doc["derived"]["contract"]


def test_diff(capsys, tmp_path):
    doc = output(capsys, "diff", str(POLICIES / "vllm_v1.yaml"), str(POLICIES / "broken" / "vllm_v1_small_pool.yaml"),
                 "--invariant", "no_deadlock", "--requests", "2", "--depth", "3", "--prompt-range", "1:4096",
                 "--output-range", "1:8", "--out", str(tmp_path), "--json")
    check("diff", doc)
    assert doc["regressions"] == ["no_deadlock"] and doc["exit_code"] == 1
    assert doc["properties"][0]["new_worse_witness"]["file"].startswith(str(tmp_path))


def _counterexample(capsys, tmp_path) -> str:
    main(["verify", str(POLICIES / "broken" / "unchecked_growth.yaml"), "--invariant", "kv_never_overcommitted",
          "--requests", "2", "--depth", "2", "--out", str(tmp_path / "cx")])
    capsys.readouterr()
    [path] = (tmp_path / "cx").glob("*.json")
    return str(path)


def test_replay(capsys, tmp_path):
    path = _counterexample(capsys, tmp_path)
    doc = output(capsys, "replay", path, "--json")
    check("replay", doc)
    assert (doc["kind"], doc["violated"], doc["violation_iteration"], doc["exit_code"]) == ("invariant", True, 1, 1)
    assert [row["holds"] for row in doc["iterations"]] == [True, False] and doc["slo"] is None
    doc = output(capsys, "replay", path, "--policy", str(POLICIES / "vllm_v1.yaml"), "--json")  # a fixed policy
    check("replay", doc)
    assert (doc["violated"], doc["violation_iteration"], doc["exit_code"]) == (False, None, 0)
    main(["fuzz", str(POLICIES / "vllm_v1.yaml"), "--workload", str(WORKLOAD), "--property", "interactive_tpot_p99",
          "--max-examples", "5", "--time-budget", "30", "--database", "none", "--out", str(tmp_path / "slo")])
    capsys.readouterr()
    [slo] = (tmp_path / "slo").glob("*.json")
    doc = output(capsys, "replay", str(slo), "--json")
    check("replay", doc)
    assert doc["kind"] == "slo" and doc["iterations"] is None and doc["slo"]["observed"] > doc["slo"]["allowed"]


def test_report(capsys, tmp_path):
    path = _counterexample(capsys, tmp_path)
    doc = output(capsys, "report", path, "--out", str(tmp_path / "r"), "--html", "--json")
    check("report", doc)
    assert doc["still_violated"] and doc["exit_code"] == 0
    assert all(Path(doc[key]).is_file() for key in ("markdown", "png", "html"))


def test_ci(capsys, tmp_path, monkeypatch):
    from tests.unit.ci_sample import make_project

    monkeypatch.chdir(tmp_path)
    make_project(tmp_path, 'policies = ["spec/policies/unchecked_growth.yaml", "spec/policies/vllm_v1.yaml"]\n'
                           '[defaults]\nrequests = 2\ndepth = 2\nunbounded = false\n'
                           '[[verify]]\ninvariants = ["kv_never_overcommitted"]\n')
    doc = output(capsys, "ci", "--jobs", "1", "--summary", "out/summary.md", "--json")
    check("ci", doc)
    assert doc["exit_code"] == 1 and doc["gating_violations"] == 1 and doc["written"][-1] == "out/summary.md"
    assert [(f["policy_name"], f["verdict"]) for f in doc["findings"]] == [("unchecked_growth", "VIOLATED"),
                                                                            ("vllm_v1", "VACUOUS")]


def test_a_schema_rejects_output_that_drifted():
    doc = {"source": "x", "scrapes": 1, "server": "vllm", "policy": "p",
           "findings": [{"check": "seq_cap", "verdict": "SAFE", "detail": "", "engine": {}, "scrape": None}]}
    with pytest.raises(jsonschema.ValidationError):
        check("check-metrics", doc)


def test_every_schema_is_tested_here():
    tested = {"simulate", "verify", "liveness", "check-metrics", "check-log", "recheck", "fuzz", "import", "audit",
              "diff", "replay", "report", "ci", "fleet", "fleet-search", "sweep",
              # tested in tests/cli/test_json_validate_calibrate.py
              "validate", "calibrate-measure", "calibrate-import-vidur", "calibrate-fit"}
    assert {p.name.removesuffix(".schema.json") for p in SCHEMAS.glob("*.schema.json")} == tested


def test_fleet(capsys):
    from tests.quality.test_fleet_finds import CEX, STORM

    doc = output(capsys, "fleet", str(STORM), "--limit", "10", "--json")
    check("fleet", doc)
    assert doc["faults"][0]["kind"] == "lost" and doc["mode"] == "run"
    check("fleet", output(capsys, "fleet", str(STORM), "--replay", str(CEX), "--json"))
    check("fleet", output(capsys, "simulate", "--fleet", str(STORM), "--limit", "10", "--json"))
    from tests.unit.test_fleet_cli import FLEETS

    doc = output(capsys, "fleet", str(FLEETS / "lost_replica_no_recovery.yaml"), "--json")
    check("fleet", doc)
    assert [p["verdict"] for p in doc["properties"] if p["kind"] == "recovery_time"] == ["VIOLATED"]
    doc = output(capsys, "fleet", str(FLEETS / "pd_disaggregated.yaml"), "--limit", "40", "--json")
    assert doc["pools"]["kind"] == "disaggregated"
    check("fleet", doc)
    for name, verdict in (("canary_rollback", "rollback"), ("canary_promote", "promote")):
        doc = output(capsys, "simulate", "--fleet", str(FLEETS / f"{name}.yaml"), "--json")
        check("fleet", doc)
        assert doc["canary"]["verdict"] == verdict
    doc = output(capsys, "fleet", str(FLEETS / "canary_promote.yaml"), "--limit", "60", "--json")
    check("fleet", doc)
    assert doc["canary"]["verdict"] == "undecided" and doc["exit_code"] == 3


def test_fleet_search(capsys, tmp_path):
    from tests.quality.test_fleet_finds import SHORT, STORM

    (tmp_path / "short.yaml").write_text(SHORT)
    doc = output(capsys, "fleet", str(STORM), "--search", "--workload", str(tmp_path / "short.yaml"), "--property",
                 "retry_amplification", "--max-examples", "3", "--max-requests", "2", "--json")
    check("fleet-search", doc)
    check("fleet-search", output(capsys, "fuzz", "--fleet", str(STORM), "--workload", str(tmp_path / "short.yaml"),
                                 "--property", "retry_amplification", "--max-examples", "3", "--max-requests", "2",
                                 "--database", "none", "--out", str(tmp_path), "--json"))


def test_sweep(capsys):
    from tests.unit.test_fleet_cli import FLEETS

    doc = output(capsys, "sweep", str(FLEETS / "prefix_capped.yaml"), "--knob", "replicas=1,2", "--knob",
                 "batch.max_num_seqs=8,16", "--json")
    check("sweep", doc)
    assert doc["best_config"] == {"replicas": "2", "batch.max_num_seqs": "16"} and doc["exit_code"] == 0
    doc = output(capsys, "sweep", str(FLEETS / "prefix_capped.yaml"), "--knob", "replicas=1", "--random", "1", "--json")
    check("sweep", doc)
    assert doc["best"] is None and doc["exit_code"] == 1
