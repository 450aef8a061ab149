"""The Python API's verify and diff take Policy objects as well as paths (issue 19): the counterexample of a
Policy object records no file (its whole spec is recorded), never the object's repr."""

from __future__ import annotations

import json

import pytest

from checker.api import load_policy, replay_outcome, run_diff, run_verify
from checker.errors import InputError
from tests.helpers import POLICIES

SMALL_POOL = POLICIES / "broken" / "vllm_v1_small_pool.yaml"


def test_run_verify_takes_a_policy_object(tmp_path):
    policy = load_policy(SMALL_POOL)
    _, (result,) = run_verify(policy, ["no_deadlock"], 1, 2, out_dir=tmp_path, proof_dir=None, prompt=(1, 4096),
                              output=(1, 8))
    assert result.verdict.value == "VIOLATED"
    doc = json.loads(result.counterexample.read_text())
    assert doc["policy"]["file"] is None and doc["policy"]["name"] == "vllm_v1_small_pool"
    assert replay_outcome(result.counterexample).violated  # replayed from the recorded spec


def test_run_diff_takes_policy_objects(tmp_path):
    old = load_policy(POLICIES / "vllm_v1.yaml")
    new = old.model_copy(update={"name": "small_pool", "kv": old.kv.model_copy(update={"num_blocks": 32}),
                                 "max_model_len": 1024})
    report = run_diff(old, new, invariants=["no_deadlock"], requests=1, depth=2, prompt=(1, 4096), output=(1, 8),
                      out_dir=tmp_path)
    assert [p.label for p in report.regressions] == ["no_deadlock"]
    assert report.as_dict()["old"] == {"name": "vllm_v1", "file": None}
    text = report.text()
    assert "--policy <vllm_v1: a Policy object> (OLD holds)" in text
    other = new.model_copy(update={"kv": new.kv.model_copy(update={"block_size": 32})})
    with pytest.raises(InputError) as err:
        run_diff(old, other, invariants=["no_deadlock"], out_dir=None)
    assert str(err.value) == ("NEW (small_pool): kv.block_size=32 (expected the same KV block size as OLD vllm_v1 (16 "
                              "tokens per block) to compare their pools)")
