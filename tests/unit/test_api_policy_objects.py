"""The library API takes Policy objects as well as policy files (issue 19): a team can build or vary a policy
in Python and check it without writing a file; results and counterexamples record no file for it."""

from __future__ import annotations

import json

import pytest

from checker import api
from checker.checklog import engine_log, load_arrivals
from checker.errors import InputError
from checker.policy import Policy
from tests.helpers import POLICIES, ROOT

WORKLOAD = ROOT / "spec" / "workloads" / "chat_mixed.yaml"


def varied() -> Policy:
    """vLLM v1 with a smaller pool and fewer sequences, built in Python."""
    base = api.load_policy(POLICIES / "vllm_v1.yaml")
    return base.model_copy(update={"name": "v1_small", "kv": base.kv.model_copy(update={"num_blocks": 300}),
                                   "batch": base.batch.model_copy(update={"max_num_seqs": 8})})


def test_load_policy_passes_a_policy_object_through():
    policy = varied()
    assert api.load_policy(policy) is policy
    unnamed = policy.model_copy(update={"name": None})
    assert api.load_policy(unnamed).name == "policy"


def test_simulate_and_audit_take_a_policy_object():
    policy = varied()
    from_object = api.run_simulation(policy, workload=WORKLOAD, limit=40)
    assert from_object.policy.name == "v1_small" and from_object.policy.batch.max_num_seqs == 8
    audit = api.run_derived_audit(policy, WORKLOAD)
    assert audit.contract is not None


def test_fuzz_records_no_file_for_a_policy_object(tmp_path):
    policy = api.load_policy(POLICIES / "vllm_v1.yaml").model_copy(update={"name": "v1_obj"})
    report = api.run_fuzz(policy, WORKLOAD, properties=["interactive_tpot_p99"], max_examples=5,
                          time_budget_s=30, out_dir=tmp_path, database_dir=None)
    files = list(tmp_path.glob("*.json"))
    assert files, report
    doc = json.loads(files[0].read_text())
    assert doc["policy"]["name"] == "v1_obj" and doc["policy"]["file"] is None
    assert api.run_replay(files[0])[1]  # the replay needs no file: the spec is recorded


def test_check_log_takes_a_policy_object(tmp_path):
    policy = varied()
    rows = [{"id": "a", "arrival_step": 0, "prompt_tokens": 100, "output_tokens": 20}]
    (tmp_path / "arrivals.json").write_text(json.dumps(rows))
    lines = engine_log(policy, load_arrivals(tmp_path / "arrivals.json"), 30)
    (tmp_path / "log.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    result = api.run_check_log(policy, tmp_path / "log.jsonl", tmp_path / "arrivals.json", with_conformance=True)
    assert result.violation is None and result.conformance.agreeing == result.steps


def test_liveness_takes_a_policy_object():
    policy = api.load_policy(POLICIES / "strict_priority.yaml")
    small = policy.model_copy(update={"name": "sp1", "batch": policy.batch.model_copy(update={"max_num_seqs": 1})})
    report = api.run_liveness(small, out_dir=None)
    assert any(r.verdict == "VIOLATED" for r in report.results), report


# verify and diff (issue 19: the Python API takes Policy objects everywhere)
SMALL_POOL = POLICIES / "broken" / "vllm_v1_small_pool.yaml"


def test_run_verify_takes_a_policy_object(tmp_path):
    policy = api.load_policy(SMALL_POOL)
    _, (result,) = api.run_verify(policy, ["no_deadlock"], 1, 2, out_dir=tmp_path, proof_dir=None,
                                  prompt=(1, 4096), output=(1, 8))
    assert result.verdict.value == "VIOLATED"
    doc = json.loads(result.counterexample.read_text())
    assert doc["policy"]["file"] is None and doc["policy"]["name"] == "vllm_v1_small_pool"
    assert api.replay_outcome(result.counterexample).violated  # replayed from the recorded spec


def test_run_diff_takes_policy_objects(tmp_path):
    old = api.load_policy(POLICIES / "vllm_v1.yaml")
    new = old.model_copy(update={"name": "small_pool", "kv": old.kv.model_copy(update={"num_blocks": 32}),
                                 "max_model_len": 1024})
    report = api.run_diff(old, new, invariants=["no_deadlock"], requests=1, depth=2, prompt=(1, 4096),
                          output=(1, 8), out_dir=tmp_path)
    assert [p.label for p in report.regressions] == ["no_deadlock"]
    assert report.as_dict()["old"] == {"name": "vllm_v1", "file": None}
    text = report.text()
    assert "--policy <vllm_v1: a Policy object> (OLD holds)" in text
    other = new.model_copy(update={"kv": new.kv.model_copy(update={"block_size": 32})})
    with pytest.raises(InputError) as err:
        api.run_diff(old, other, invariants=["no_deadlock"], out_dir=None)
    assert str(err.value) == ("NEW (small_pool): kv.block_size=32 (expected the same KV block size as OLD vllm_v1 (16 "
                              "tokens per block) to compare their pools)")
