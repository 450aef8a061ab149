"""`batchcheck audit`: the seed's output byte for byte, exit codes, and bad input word for word."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from checker.cli import main
from tests.helpers import POLICIES, ROOT, WORKLOADS

AUDIT = ROOT / "spec" / "audit"
CONTRACT = AUDIT / "illustrative_contract.yaml"
WORKLOAD = AUDIT / "illustrative_workload.yaml"
TIERED = AUDIT / "tiered_contract.yaml"

SEED_OUTPUT = """\
example=illustrative_only
decision=CAPACITY_WITHIN_DECLARED_BOUND
utilization_permille=180;prefill=250;decode=75
queue_ms=5;worst_ttft_ms=185;tpot_ms=20
peak_kv_bytes=8808038400
claim=LOCAL_FLUID_CAPACITY_MODEL_NOT_QUEUEING_OR_DEVICE_BENCHMARK
"""


def run(capsys, *argv: object) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def edit(tmp_path: Path, source: Path, old: str, new: str, name: str = "edited.yaml") -> Path:
    text = source.read_text()
    assert old in text, old
    path = tmp_path / name
    path.write_text(text.replace(old, new, 1))
    return path


def error(path: Path, line: int, message: str) -> str:
    return f"batchcheck: error: {path}:{line}: {message}\n"


# ----------------------------------------------------------------------------------------- the seed
def test_the_seed_example_byte_for_byte(capsys):
    code, out, err = run(capsys, "audit", CONTRACT, WORKLOAD)
    assert (code, err) == (0, "")
    assert out == SEED_OUTPUT


def test_the_seed_example_as_json(capsys):
    code, out, _ = run(capsys, "audit", CONTRACT, WORKLOAD, "--json")
    assert code == 0
    d = json.loads(out)
    assert d["example"] == "illustrative_only"
    assert d["decision"] == "CAPACITY_WITHIN_DECLARED_BOUND" and d["failure"] is None
    assert d["demand_tokens_per_min"] == {"prefill": 6_000 * 60, "decode": 1_200 * 60}
    assert d["utilization_permille"] == {"total": 180, "prefill": 250, "decode": 75}
    assert (d["queue_ms"], d["worst_ttft_ms"], d["tpot_ms"]) == (5, 185, 20)
    assert d["peak_kv_bytes"] == 8_808_038_400 == 67_200 * 131_072
    assert d["peak_active_sequences"] == 25
    assert d["contract_id"] == "sha256:1bd77c09a9ebf1d6"
    assert d["claim"] == "LOCAL_FLUID_CAPACITY_MODEL_NOT_QUEUEING_OR_DEVICE_BENCHMARK"
    assert [(c["name"], c["active_sequences"], c["ttft_ms"]) for c in d["classes"]] == [
        ("chat", 12, 22), ("summarize", 13, 185)]


def test_the_example_line_comes_from_the_contract(capsys, tmp_path):
    contract = edit(tmp_path, CONTRACT, "example: illustrative_only\n", "")
    workload = edit(tmp_path, WORKLOAD, "sha256:1bd77c09a9ebf1d6", _id(contract), "w.yaml")
    code, out, _ = run(capsys, "audit", contract, workload)
    assert code == 0
    assert out == SEED_OUTPUT.removeprefix("example=illustrative_only\n")


def _id(path: Path) -> str:
    from checker.audit import content_id, load_contract

    return content_id(load_contract(path)[0])


# ----------------------------------------------------------------------------------------- exit 1
def test_a_failing_bound_exits_1_and_names_the_background_class(capsys):
    code, out, _ = run(capsys, "audit", TIERED, AUDIT / "tiered_overload_2x.yaml")
    assert code == 1
    assert out.splitlines()[1] == \
        "decision=PREFILL_CAPACITY_EXCEEDED;class=background;tenant=batch;value=1084;limit=999"
    assert "queue_ms=unbounded;worst_ttft_ms=unbounded;tpot_ms=20" in out
    code, out, _ = run(capsys, "audit", TIERED, AUDIT / "tiered_normal.yaml")
    assert code == 0 and out.splitlines()[1] == "decision=CAPACITY_WITHIN_DECLARED_BOUND"


def test_the_derived_form_on_the_shipped_tiers(capsys):
    base = ("audit", "--policy", POLICIES / "tiered_shedding.yaml", "--profile",
            ROOT / "spec" / "profiles" / "default_linear.json", "--tpot-slo-ms", "100", "--workload")
    code, out, _ = run(capsys, *base, WORKLOADS / "tiered_normal.yaml")
    assert code == 0, out
    assert out.splitlines()[0] == "decision=CAPACITY_WITHIN_DECLARED_BOUND"
    assert not out.startswith("example=")
    code, out, _ = run(capsys, *base, WORKLOADS / "tiered_overload_2x.yaml", "--json")
    assert code == 1
    d = json.loads(out)
    assert d["failure"]["bound"] == "PREFILL_CAPACITY_EXCEEDED"
    assert (d["failure"]["class"], d["failure"]["tenant"]) == ("background", "batch")
    assert d["derived"]["contract"]["active_sequence_cap"] == 96
    assert d["derived"]["workload_record"]["contract_id"] == d["contract_id"]


# ----------------------------------------------------------------------------------------- exit 2
BAD_CONTRACTS = [
    ("iteration_ms: 20\n", "iteration_ms: 20\nchunk_size: 3\n", 15,
     "chunk_size=3 (expected a known key; allowed here: active_sequence_cap, admission_headroom_permille, "
     "cancel_release_lag_ms, decode_tokens_per_s, example, fairness_bound_permille, format, iteration_ms, "
     "kv_budget_bytes, kv_bytes_per_token, prefill_chunk_tokens, prefill_tokens_per_s, scope, slo, "
     "tenant_shares_permille, total_tokens_per_s, version)"),
    ("decode_tokens_per_s: 16000", "decode_tokens_per_s: -16000", 13,
     "decode_tokens_per_s=-16000 (expected a number >= 1)"),
    ("decode_tokens_per_s: 16000", "decode_tokens_per_s: 15000", 11,
     "total_tokens_per_s=40000 (expected prefill_tokens_per_s + decode_tokens_per_s = 39000: the partitions "
     "must add up to the total)"),
    ("iteration_ms: 20", "iteration_ms: 0", 14, "iteration_ms=0 (expected a number >= 1)"),
    ("total_tokens_per_s: 40000", "total_tokens_per_s: 40000.0", 11,
     "total_tokens_per_s=40000.0 (expected an integer)"),
    ("prefill_chunk_tokens: 480 ", "prefill_chunk_tokens: 512 ", 15,
     "prefill_chunk_tokens=512 (expected <= 480: what the prefill partition (24000 tokens/s) serves in one "
     "20 ms iteration; a larger chunk contradicts the declared service rate)"),
    ("decode_tokens_per_s: 16000", "decode_tokens_per_s: 1000000000000001", 13,
     "decode_tokens_per_s=1000000000000001 (expected a number <= 1000000000000000)"),
    ("  tpot_ms: 50", "  tpot_ms: -1", 22, "slo.tpot_ms=-1 (expected a number >= 1)"),
]


@pytest.mark.parametrize(("old", "new", "line", "message"), BAD_CONTRACTS,
                         ids=["unknown-field", "negative-rate", "partitions", "zero-iteration", "float",
                              "chunk-contradicts-capacity", "absurd-rate", "negative-slo"])
def test_bad_contracts_exit_2_with_path_and_value(capsys, tmp_path, old, new, line, message):
    contract = edit(tmp_path, CONTRACT, old, new)
    code, out, err = run(capsys, "audit", contract, WORKLOAD)
    assert (code, out) == (2, "")
    assert err == error(contract, line, message)


BAD_WORKLOADS = [
    ("    prompt_tokens: 300\n", "    prompt_tokens: 0\n", 16,
     "classes[0].prompt_tokens=0 (expected a number >= 1)"),
    ("    output_tokens: 600\n", "", 20, "classes[1].output_tokens=<missing> (expected this field to be given)"),
    ("    arrivals_per_min: 360", "    arrivals_per_min: -360", 15,
     "classes[0].arrivals_per_min=-360 (expected a number >= 1)"),
    ("    tenant: docs", "    tenant: docs\n    weight: 2", 26,
     "classes[1].weight=2 (expected a known key; allowed here: arrivals_per_min, cancel_permille, "
     "max_prompt_tokens, name, output_tokens, priority, prompt_tokens, tenant)"),
]


@pytest.mark.parametrize(("old", "new", "line", "message"), BAD_WORKLOADS,
                         ids=["zero-prompt", "no-output", "negative-arrivals", "unknown-field"])
def test_bad_workloads_exit_2_with_path_and_value(capsys, tmp_path, old, new, line, message):
    workload = edit(tmp_path, WORKLOAD, old, new)
    code, out, err = run(capsys, "audit", CONTRACT, workload)
    assert (code, out) == (2, "")
    assert err == error(workload, line, message)


def test_an_absurd_class_demand_is_an_input_error(capsys, tmp_path):
    workload = edit(tmp_path, WORKLOAD, "    arrivals_per_min: 60\n", "    arrivals_per_min: 1000000000000\n")
    workload = edit(tmp_path, workload, "    prompt_tokens: 4200", "    prompt_tokens: 900000000", "w2.yaml")
    code, _, err = run(capsys, "audit", CONTRACT, workload)
    assert code == 2
    assert err == error(workload, 21, "classes[1].arrivals_per_min=1000000000000 (expected a class "
                        "demand <= 1000000000000000 tokens/s (this one asks 15000010000000000000 tokens/s))")


def test_a_workload_for_another_contract_is_refused(capsys, tmp_path):
    workload = edit(tmp_path, WORKLOAD, "sha256:1bd77c09a9ebf1d6", "sha256:0000000000000000")
    code, out, err = run(capsys, "audit", CONTRACT, workload)
    assert (code, out) == (2, "")
    assert err == error(workload, 12, f"contract_id='sha256:0000000000000000' (expected "
                        f"sha256:1bd77c09a9ebf1d6, the content id of {CONTRACT}: workload belongs to another "
                        "batching contract)")


def test_an_edited_contract_no_longer_matches_its_workload(capsys, tmp_path):
    contract = edit(tmp_path, CONTRACT, "active_sequence_cap: 256", "active_sequence_cap: 255")
    code, _, err = run(capsys, "audit", contract, WORKLOAD)
    assert code == 2
    assert err == error(WORKLOAD, 12, f"contract_id='sha256:1bd77c09a9ebf1d6' (expected "
                        f"{_id(contract)}, the content id of {contract}: workload belongs to another batching "
                        "contract)")


def test_scope_and_id_mismatch_are_both_named(capsys):
    code, _, err = run(capsys, "audit", TIERED, WORKLOAD)
    assert code == 2
    assert err == (
        f"batchcheck: error: {WORKLOAD}:11: scope='illustrative/llama-3-8b/one-replica' (expected "
        f"'illustrative/llama-3-8b/one-replica/tiered', the scope of {TIERED}: workload belongs to another "
        "batching contract)\n"
        f"{WORKLOAD}:12: contract_id='sha256:1bd77c09a9ebf1d6' (expected sha256:121ae93b99bea4e7, the content "
        f"id of {TIERED}: workload belongs to another batching contract)\n")


def test_a_tenant_without_a_share_is_refused(capsys, tmp_path):
    workload = edit(tmp_path, AUDIT / "tiered_normal.yaml", "    tenant: batch", "    tenant: research")
    code, _, err = run(capsys, "audit", TIERED, workload)
    assert code == 2
    assert err == error(workload, 28, f"classes[2].tenant='research' (expected a tenant with a share "
                        f"in {TIERED} (app, batch))")


def test_swapped_records_are_named(capsys):
    code, _, err = run(capsys, "audit", WORKLOAD, CONTRACT)
    assert code == 2
    assert err == (f"batchcheck: error: {WORKLOAD}:9: format='batchcheck-audit-workload' (expected "
                   "batchcheck-audit-contract: CONTRACT comes first, then the WORKLOAD written for it)\n")


@pytest.mark.parametrize(("argv", "message"), [
    ((), "give CONTRACT WORKLOAD (audit records) or --policy FILE --workload FILE [--profile FILE]"),
    ((CONTRACT,), "give CONTRACT WORKLOAD (audit records) or --policy FILE --workload FILE [--profile FILE]"),
    ((CONTRACT, WORKLOAD, "--policy", "p.yaml"),
     f"give either CONTRACT WORKLOAD or --policy/--profile/--workload, not both (got {CONTRACT} and --policy)"),
    (("--policy", "p.yaml"), "the derived form needs --policy FILE and --workload FILE or --trace FILE (--profile is optional)"),
], ids=["nothing", "one-record", "both-forms", "no-workload"])
def test_usage_errors_exit_2(capsys, argv, message):
    code, out, err = run(capsys, "audit", *argv)
    assert (code, out) == (2, "")
    assert err == f"batchcheck: error: {message}\n"


def test_derived_form_needs_a_model_shape_in_the_profile(capsys, tmp_path):
    data = json.loads((ROOT / "spec" / "profiles" / "default_linear.json").read_text())
    del data["model"]
    profile = tmp_path / "no_model.json"
    profile.write_text(json.dumps(data))
    code, _, err = run(capsys, "audit", "--policy", POLICIES / "tiered_shedding.yaml", "--profile", profile,
                       "--workload", WORKLOADS / "tiered_normal.yaml")
    assert code == 2
    assert err == (f"batchcheck: error: {profile}: model=None (expected the model shape (layers, hidden, heads, "
                   "kv_heads): the audit needs KV bytes per token)\n")


def test_derived_form_needs_prefill_room_in_the_budget(capsys, tmp_path):
    policy = edit(tmp_path, POLICIES / "tiered_shedding.yaml", "max_num_seqs: 96", "max_num_seqs: 1024")
    code, _, err = run(capsys, "audit", "--policy", policy, "--workload", WORKLOADS / "tiered_normal.yaml")
    assert code == 2
    assert err == (f"batchcheck: error: {policy}: batch.max_num_seqs=1024 (expected < batch.max_num_batched_tokens"
                   "=1024: the audit's prefill share of an iteration is the budget left after one decode token "
                   "per sequence)\n")


# ----------------------------------------------------------------------------------------- validate, schema
def test_validate_and_schema_know_the_audit_records(capsys):
    code, out, _ = run(capsys, "validate", CONTRACT, WORKLOAD)
    assert code == 0
    assert out == f"{CONTRACT}: valid audit-contract\n{WORKLOAD}: valid audit-workload\n"
    for kind, title in (("audit-contract", "AuditContract"), ("audit-workload", "AuditWorkload")):
        code, out, _ = run(capsys, "schema", "--kind", kind)
        assert code == 0 and json.loads(out)["title"] == title
