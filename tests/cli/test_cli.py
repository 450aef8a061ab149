"""The command line: exit codes and messages, asserted word for word."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from checker.cli import main
from tests.helpers import POLICIES, ROOT, WORKLOADS


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_simulate_prints_a_table_and_exits_0(capsys):
    code, out, err = run(capsys, "simulate", str(POLICIES / "vllm_v1.yaml"), "--workload",
                         str(WORKLOADS / "chat_mixed.yaml"))
    assert code == 0, err
    assert out.startswith("policy vllm_v1  |  requests from ")
    assert "class interactive" in out and "tenant batch" in out


def test_simulate_json_has_metrics_by_class_and_tenant(capsys):
    code, out, _ = run(capsys, "simulate", str(POLICIES / "sarathi_serve.yaml"), "--workload",
                       str(WORKLOADS / "chat_mixed.yaml"), "--json")
    assert code == 0
    summary = json.loads(out)
    assert set(summary["by_class"]) == {"interactive", "background"}
    assert set(summary["by_tenant"]) == {"app", "batch"}
    assert summary["overall"]["requests"] == summary["overall"]["finished"] + summary["overall"]["cancelled"]
    for key in ("queue_delay_ms", "ttft_ms", "tpot_ms", "e2e_ms"):
        assert set(summary["overall"][key]) == {"n", "mean", "p50", "p99", "max"}


def test_schema_prints_the_policy_json_schema(capsys):
    code, out, _ = run(capsys, "schema")
    assert code == 0
    schema = json.loads(out)
    assert schema["title"] == "Policy"
    assert schema["required"] == ["max_model_len", "kv"]


@pytest.mark.parametrize("kind", ["workload", "trace", "profile"])
def test_schema_of_other_kinds(capsys, kind):
    code, out, _ = run(capsys, "schema", "--kind", kind)
    assert code == 0 and json.loads(out)["type"] == "object"


def test_validate_accepts_every_shipped_input(capsys):
    files = sorted(str(p) for p in (ROOT / "spec").rglob("*") if p.suffix in (".yaml", ".json"))
    code, out, err = run(capsys, "validate", *files)
    assert code == 0, err
    assert out.count(": valid ") == len(files)


def test_unknown_key_names_file_line_path_and_allowed_keys(capsys, tmp_path):
    path = write(tmp_path, "p.yaml", "max_model_len: 4096\nkv:\n  num_blocks: 100\n  blok_size: 16\n")
    code, _, err = run(capsys, "validate", path)
    assert code == 2
    assert err == (f"batchcheck: error: {path}:4: kv.blok_size=16 (expected a known key; did you mean block_size? "
                   "allowed here: allocation, block_size, check_allocation, num_blocks, prefix_caching, swap_blocks, "
                   "watermark)\n")


def test_validate_checks_every_file_given(capsys, tmp_path):
    bad = write(tmp_path, "bad.yaml", "max_model_len: 4096\nkv:\n  num_blocks: 100\n  blok_size: 16\n")
    worse = write(tmp_path, "worse.yaml", "max_model_len: 4096\nkv:\n  num_blocks: -1\n")
    code, out, err = run(capsys, "validate", bad, str(POLICIES / "vllm_v1.yaml"), worse)
    assert code == 2
    assert out == f"{POLICIES / 'vllm_v1.yaml'}: valid policy\n"
    lines = err.splitlines()
    assert lines[0].startswith(f"batchcheck: error: {bad}:4: kv.blok_size=16")
    assert lines[1].startswith(f"batchcheck: error: {worse}:3: kv.num_blocks=-1")
    assert lines[2] == "batchcheck: 2 of 3 files are not valid"


def test_wrong_type_and_negative_size(capsys, tmp_path):
    path = write(tmp_path, "p.yaml", "max_model_len: lots\nkv: {num_blocks: -5}\n")
    code, _, err = run(capsys, "validate", path)
    assert code == 2
    assert err == (f"batchcheck: error: {path}:1: max_model_len='lots' (expected an integer)\n"
                   f"{path}:2: kv.num_blocks=-5 (expected a number >= 1)\n")


def test_inconsistent_budgets_are_rejected_like_vllm_does(capsys, tmp_path):
    path = write(tmp_path, "p.yaml", "max_model_len: 8192\nchunking: {enabled: false}\n"
                 "batch:\n  max_num_batched_tokens: 2048\nkv: {num_blocks: 100}\n")
    code, _, err = run(capsys, "validate", path)
    assert code == 2
    assert err == (f"batchcheck: error: {path}:4: batch.max_num_batched_tokens=2048 (expected >= "
                   "max_model_len=8192 when chunking.enabled is false: without chunking a whole prompt must "
                   "fit one step (vLLM rejects this too))\n")


def test_absurd_size_is_rejected(capsys, tmp_path):
    path = write(tmp_path, "p.yaml", "max_model_len: 8192\nkv: {num_blocks: 1000000000000}\n")
    code, _, err = run(capsys, "validate", path)
    assert code == 2
    assert err == f"batchcheck: error: {path}:2: kv.num_blocks=1000000000000 (expected a number <= 100000000)\n"


def test_malformed_yaml_names_the_line(capsys, tmp_path):
    path = write(tmp_path, "p.yaml", "max_model_len: 8192\nkv: {num_blocks: 3\n")
    code, _, err = run(capsys, "validate", path)
    assert code == 2
    assert err == (f"batchcheck: error: {path}:3: (document)=<unparsable> (expected valid YAML: expected ',' "
                   "or '}', but got '<stream end>')\n")


def test_duplicate_key(capsys, tmp_path):
    path = write(tmp_path, "p.yaml", "max_model_len: 8192\nkv: {num_blocks: 3}\nmax_model_len: 4096\n")
    code, _, err = run(capsys, "validate", path)
    assert code == 2
    assert err == f"batchcheck: error: {path}:3: max_model_len=<duplicate key> (expected each key once (first given on line 1))\n"


def test_workload_errors_inside_tagged_unions(capsys, tmp_path):
    path = write(tmp_path, "w.yaml", "duration_s: 10\nclasses:\n  - name: a\n"
                 "    arrival: {process: poisson, rate_per_s: 0}\n"
                 "    prompt_tokens: {dist: gauss, value: 3}\n"
                 "    output_tokens: {dist: uniform, low: 9, high: 2}\n")
    code, _, err = run(capsys, "validate", path)
    assert code == 2
    assert err == (f"batchcheck: error: {path}:4: classes[0].arrival.rate_per_s=0 (expected a number > 0)\n"
                   f"{path}:5: classes[0].prompt_tokens.dist='gauss' (expected one of: fixed, uniform, lognormal, choice)\n"
                   f"{path}:6: classes[0].output_tokens.high=2 (expected >= low=9)\n")


def test_missing_file(capsys, tmp_path):
    code, _, err = run(capsys, "simulate", str(tmp_path / "nope.yaml"), "--workload", str(WORKLOADS / "chat_mixed.yaml"))
    assert code == 2
    assert err == f"batchcheck: error: {tmp_path / 'nope.yaml'}: (document)='{tmp_path / 'nope.yaml'}' (expected an existing file)\n"


def test_bad_trace_row_names_line_column_and_value(capsys, tmp_path):
    trace = write(tmp_path, "t.csv", "arrived_at,num_prefill_tokens,num_decode_tokens\n0.0,10,5\n0.5,ten,5\n")
    code, _, err = run(capsys, "simulate", str(POLICIES / "vllm_v1.yaml"), "--trace", trace)
    assert code == 2
    assert err == f"batchcheck: error: {trace}:3: num_prefill_tokens='ten' (expected a whole number of tokens)\n"


def test_unsorted_trace_is_rejected(capsys, tmp_path):
    trace = write(tmp_path, "t.csv", "arrived_at,num_prefill_tokens,num_decode_tokens\n1.0,10,5\n0.5,10,5\n")
    code, _, err = run(capsys, "simulate", str(POLICIES / "vllm_v1.yaml"), "--trace", trace)
    assert code == 2
    assert err == f"batchcheck: error: {trace}:3: arrived_at='row 3' (expected rows sorted by arrival time)\n"


def test_json_trace_error_names_the_request(capsys, tmp_path):
    trace = write(tmp_path, "t.json", json.dumps({"format": "batchcheck-trace", "requests": [
        {"arrival_ms": 0, "prompt_tokens": 10, "output_tokens": 5},
        {"arrival_ms": 3, "prompt_tokens": 0, "output_tokens": 5}]}, indent=1))
    code, _, err = run(capsys, "simulate", str(POLICIES / "vllm_v1.yaml"), "--trace", trace)
    assert code == 2
    assert err == f"batchcheck: error: {trace}:11: requests[1].prompt_tokens=0 (expected a number >= 1)\n"


def test_usage_error_exits_2(capsys):
    assert main(["simulate", str(POLICIES / "vllm_v1.yaml")]) == 2  # POLICY is optional with --fleet
    assert "batchcheck: error: simulate POLICY needs --workload FILE or --trace FILE" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(["simulate", str(POLICIES / "vllm_v1.yaml"), "--workload", "w.yaml", "--trace", "t.json"])
    assert exc.value.code == 2


def test_console_script_runs_without_traceback_on_bad_input(tmp_path):
    path = write(tmp_path, "p.yaml", "max_model_len: 8192\nkv: []\n")
    proc = subprocess.run([sys.executable, "-m", "checker.cli", "validate", path], capture_output=True, text=True)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert proc.stderr == f"batchcheck: error: {path}:2: kv=[] (expected a mapping)\n"
