"""Issue 23, files that are not what they claim: a malformed counterexample crashed ``replay`` (pydantic
ValidationError, KeyError, TypeError in specs_from_json), ``violation.iteration: 1e100`` stepped the engine
that far, a trace cell of 1e308 seconds overflowed, a CSV with a NUL byte raised csv.Error. Each is now one
located input error (exit 2) before any work starts."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from checker.cli import main
from tests.helpers import POLICIES, ROOT

CEX = ROOT / "counterexamples" / "vllm_v1_small_pool__no_deadlock__3e1ce4a9.json"
OTHER = ROOT / "counterexamples" / "tiered_unprotected__degradation_order__5d4f6cbb.json"
LASSO = ROOT / "counterexamples" / "vllm_v1_small_pool__no_deadlock_lasso__30eae860.json"


def _run(capsys, *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    err = capsys.readouterr().err
    assert "internal error" not in err, err
    return code, err


def _mutated(tmp_path: Path, source: Path, change) -> str:
    doc = json.loads(source.read_text())
    change(doc)
    path = tmp_path / source.name
    path.write_text(json.dumps(doc))
    return str(path)


def _set(path: str, value):
    def change(doc):
        node = doc
        parts = path.split(".")
        for part in parts[:-1]:
            node = node[int(part)] if isinstance(node, list) else node[part]
        last = parts[-1]
        if value is KeyError:
            del node[int(last) if isinstance(node, list) else last]
        elif isinstance(node, list):
            node[int(last)] = value
        else:
            node[last] = value
    return change


MUTATIONS = [
    ("requests.0.prompt_tokens", KeyError, "requests[0].prompt_tokens"),
    ("requests", {"a": 1}, "requests"),
    ("requests.0.arrival_ms", "soon", "requests[0].arrival_ms"),
    ("requests.0.arrival_ms", 1e308, "requests[0].arrival_ms"),
    ("requests.0.prompt_runs", [[1]], "requests[0].prompt_runs[0][1]"),
    ("policy.spec.kv", "big", "policy.spec.kv"),
    ("violation.iteration", 1e100, "violation.iteration"),
    ("violation.iteration", 7, "violation.iteration"),
    ("clock.step_us", 0, "clock.step_us"),
    ("clock.step_us", 1e30, "clock.step_us"),
    ("property.params", [1], "property.params"),
    ("environment", "none", "environment"),
]


@pytest.mark.parametrize("path,value,where", MUTATIONS, ids=[f"{p}={v!r}"[:40] for p, v, _ in MUTATIONS])
@pytest.mark.parametrize("verb", ["replay"])
def test_a_malformed_counterexample_is_one_located_input_error(tmp_path, capsys, verb, path, value, where):
    target = _mutated(tmp_path, CEX, _set(path, value))
    started = time.monotonic()
    code, err = _run(capsys, verb, target)
    assert code == 2, err
    assert time.monotonic() - started < 10
    assert err.startswith(f"batchcheck: error: {target}") and f"{where}=" in err, err


@pytest.mark.parametrize("source,path,value,where", [
    (OTHER, "requests.0.output_tokens", None, "requests[0].output_tokens"),
    (OTHER, "property.kind", "slo", "profile"),
    (LASSO, "violation.iteration", 10**12, "violation.iteration"),
])
def test_malformed_other_and_lasso_counterexamples(tmp_path, capsys, source, path, value, where):
    target = _mutated(tmp_path, source, _set(path, value))
    code, err = _run(capsys, "replay", target)
    assert code == 2 and f"{where}=" in err, err


def test_the_shipped_counterexamples_still_replay(capsys):
    for path in (CEX, OTHER, LASSO):
        code, err = _run(capsys, "replay", str(path))
        assert code == 1, err


# ----------------------------------------------------------------------------------------- traces
def _csv(tmp_path: Path, text: str) -> str:
    path = tmp_path / "t.csv"
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("rows,where", [
    ("0,5,2\n1e308,5,2\n", "t.csv:3: arrived_at='1e308'"),
    ("0,5,2\n1,5\x00,2\n", "t.csv:3:"),
    ("0,5,2\n1," + "9" * 200 + ",2\n", "t.csv:3: num_prefill_tokens="),
])
def test_azure_csv_bad_cells(tmp_path, capsys, rows, where):
    path = _csv(tmp_path, "arrived_at,num_prefill_tokens,num_decode_tokens\n" + rows)
    code, err = _run(capsys, "simulate", str(POLICIES / "vllm_v1.yaml"), "--trace", path)
    assert code == 2 and where in err, err


def test_azure_csv_timestamp_out_of_range(tmp_path, capsys):
    path = _csv(tmp_path, "TIMESTAMP,ContextTokens,GeneratedTokens\n0001-01-01 00:00:00,5,2\n")
    code, err = _run(capsys, "simulate", str(POLICIES / "vllm_v1.yaml"), "--trace", path)
    assert code in (0, 2), err


def test_mooncake_timestamp_1e308(tmp_path, capsys):
    path = tmp_path / "t.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 5, "output_length": 2}\n'
                    '{"timestamp": 1e308, "input_length": 5, "output_length": 2}\n')
    code, err = _run(capsys, "simulate", str(POLICIES / "vllm_v1.yaml"), "--trace", str(path))
    assert code == 2 and f"{path}:2: timestamp=" in err, err


# ----------------------------------------------------------------------------------------- found by tests/fuzz
def test_a_lasso_with_a_tenant_name_instead_of_a_number(tmp_path, capsys):
    target = _mutated(tmp_path, LASSO, _set("requests.0.tenant", "x"))  # TypeError in replay's max()
    code, err = _run(capsys, "replay", target)
    assert code == 2 and "requests[0].tenant='x' (expected a tenant number >= 0)" in err, err


@pytest.mark.parametrize("field,value,message", [
    ("id", ["q0"], "[0].id=['q0'] (expected a string or a whole number)"),  # TypeError: unhashable type
    ("prompt_tokens", None, "[0].prompt_tokens=None (expected a whole number >= 0)"),  # None < 1: TypeError
    ("arrival_step", 2**63, "[0].arrival_step=9223372036854775808 (expected a step number from 0 to 10,000,000)"),
])
def test_check_log_arrivals_with_a_bad_field(tmp_path, capsys, field, value, message):
    data = ROOT / "tests" / "data" / "checklog"
    rows = json.loads((data / "arrivals.json").read_text())
    rows[0][field] = value
    arrivals = tmp_path / "arrivals.json"
    arrivals.write_text(json.dumps(rows))
    log = tmp_path / "log.jsonl"
    log.write_text('{"step": 0, "scheduled": {}, "preempted": [], "finished": [], "aborted": [], "running": 0, '
                   '"waiting": 0, "free_blocks": 64}\n')
    code, err = _run(capsys, "check-log", str(data / "vllm_fcfs.yaml"), str(log), "--arrivals", str(arrivals))
    assert code == 2 and f"{arrivals}: {message}" in err, err


def test_an_imported_policy_out_of_range_names_the_config(tmp_path, capsys):
    config = tmp_path / "vllm.yaml"
    config.write_text("max_model_len: 9223372036854775808\nnum-gpu-blocks-override: 500\n")
    code, err = _run(capsys, "import", "vllm", "--config", str(config))
    assert code == 2 and f"the policy imported from vllm ({config}): max_model_len=" in err, err


def test_trtllm_config_without_a_pool_names_the_config(tmp_path, capsys):
    config = tmp_path / "llm_api.yaml"
    config.write_text("max_seq_len: 8192\nmax_batch_size: 64\nkv_cache_config:\n  tokens_per_block: 32\n")
    code, err = _run(capsys, "import", "trtllm", str(config))
    assert code == 2 and f"batchcheck: error: {config}: kv_cache_config.max_tokens=<missing>" in err, err


def test_check_log_conformance_with_a_step_beyond_the_limit(tmp_path, capsys):
    """The lockstep engine stepped from 0 towards step 2**63 (a hang found by bench/input_fuzz.py)."""
    data = ROOT / "tests" / "data" / "checklog"
    log = tmp_path / "log.jsonl"
    log.write_text('{"step": 9223372036854775808, "scheduled": {}, "preempted": [], "finished": [], "aborted": [], '
                   '"running": 0, "waiting": 0, "free_blocks": 64}\n')
    started = time.monotonic()
    code, err = _run(capsys, "check-log", str(data / "vllm_fcfs.yaml"), str(log), "--arrivals",
                     str(data / "arrivals.json"), "--conformance")
    assert time.monotonic() - started < 10
    assert code == 2 and f"{log}:1: step=9223372036854775808 (expected a step number (a whole number from 0 to " \
        "10,000,000))" in err, err


def test_a_counterexample_whose_property_is_not_a_mapping(tmp_path, capsys):
    target = _mutated(tmp_path, LASSO, _set("property", "x"))  # AttributeError in cex.load
    code, err = _run(capsys, "replay", target)
    assert code == 2 and "property='x' (expected a mapping" in err, err
