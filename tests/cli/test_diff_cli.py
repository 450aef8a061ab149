"""batchcheck diff: summary first, exit codes, bad input word for word."""

from __future__ import annotations

import json

import pytest

from checker.cli import main
from tests.helpers import POLICIES

V1, SMALL_POOL = str(POLICIES / "vllm_v1.yaml"), str(POLICIES / "broken" / "vllm_v1_small_pool.yaml")
BOUNDS = ("--requests", "2", "--depth", "3", "--prompt-range", "1:4096", "--output-range", "1:8")


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_regression_summary_reads_first_and_exit_is_1(capsys, tmp_path):
    code, out, err = run(capsys, "diff", V1, SMALL_POOL, "--invariant", "no_deadlock", *BOUNDS, "--out", str(tmp_path))
    assert code == 1, err
    lines = out.splitlines()
    assert lines[:5] == [
        "diff vllm_v1 -> vllm_v1_small_pool: REGRESSION in 1 of 1 property  (exit 1)",
        "changed: kv.num_blocks: 2500 -> 32, max_model_len: 16384 -> 1024",
        "why no_deadlock: NEW worse, 1 request(s), fails at iteration 1",
        "",
        "REGRESSION no_deadlock                       strictly less safe  HOLDS_UP_TO -> VIOLATED"]
    witness = next(tmp_path.glob("vllm_v1_small_pool__no_deadlock__*.json"))
    assert f"  replay: batchcheck replay {witness} (NEW fails); batchcheck replay {witness} --policy {V1} (OLD holds)" in lines


def test_json_report(capsys, tmp_path):
    code, out, _ = run(capsys, "diff", SMALL_POOL, V1, "--invariant", "no_deadlock", *BOUNDS, "--out", "none", "--json")
    doc = json.loads(out)
    assert code == 0 and doc["exit_code"] == 0 and doc["regressions"] == []
    (p,) = doc["properties"]
    assert (p["change"], p["old"], p["new"]) == ("strictly safer", "VIOLATED", "HOLDS_UP_TO")
    assert p["new_worse_witness"] is None and p["old_worse_witness"]["file"] is None  # --out none: nothing saved


@pytest.mark.parametrize("argv,message", [
    (("diff", "spec/policies/nope.yaml", V1), "spec/policies/nope.yaml: (document)='spec/policies/nope.yaml' "
                                              "(expected an existing file)"),
    (("diff", V1, V1, "--threshold", "-1"), "--threshold=-1.0 (expected a relative increase between 0 and 100 "
                                            "(0.2 = 20 %))"),
    (("diff", V1, V1, "--slo", "x.slo.yaml"), "--slo and --property need --workload (the traces are generated from "
                                              "its classes)"),
    (("diff", V1, V1, "--invariant", "decode_progress:gapp=2"), "--invariant='decode_progress:gapp=2' (expected "
                                                                "parameters of decode_progress: gap)"),
], ids=["missing-policy", "threshold", "slo-without-workload", "bad-invariant-parameter"])
def test_bad_input_exits_2_with_one_line(capsys, argv, message):
    code, out, err = run(capsys, *argv)
    assert (code, out, err) == (2, "", f"batchcheck: error: {message}\n")


def test_policies_with_different_kv_block_sizes_are_refused_at_the_line(capsys, tmp_path):
    new = tmp_path / "v1_32.yaml"
    text = (POLICIES / "vllm_v1.yaml").read_text()
    assert text.count("block_size: 16") == 1
    new.write_text(text.replace("block_size: 16", "block_size: 32"))
    line = 1 + new.read_text().split("block_size: 32")[0].count("\n")
    code, out, err = run(capsys, "diff", V1, str(new))
    assert (code, out) == (2, "")
    assert err == (f"batchcheck: error: {new}:{line}: kv.block_size=32 (expected the same KV block size as OLD {V1} "
                   "(16 tokens per block) to compare their pools)\n")

