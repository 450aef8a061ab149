"""The capacity audit (checker/audit, docs/audit.md): content ids, the integer formulas, every bound, the
derived form, and the overload-degradation result on the engine."""

from __future__ import annotations

from functools import cache
from typing import Any

import pytest
import yaml

from checker.api import load_policy, run_derived_audit
from checker.audit import (
    BOUNDS,
    AuditContract,
    AuditWorkload,
    audit,
    audit_files,
    canonical_json,
    check_pair,
    content_id,
    load_contract,
)
from checker.audit.fluid import ceil_div, permille, queue_delay_ms
from checker.audit.reference import render as render_reference
from checker.engine import simulate
from checker.errors import InputError
from checker.profile import load_profile
from checker.traces import load_requests
from tests.helpers import POLICIES, ROOT, WORKLOADS

AUDIT = ROOT / "spec" / "audit"
SEED = (AUDIT / "illustrative_contract.yaml", AUDIT / "illustrative_workload.yaml")
TIERED = AUDIT / "tiered_contract.yaml"

BASE_CONTRACT: dict[str, Any] = {
    "scope": "unit", "total_tokens_per_s": 40_000, "prefill_tokens_per_s": 24_000, "decode_tokens_per_s": 16_000,
    "iteration_ms": 20, "prefill_chunk_tokens": 480, "active_sequence_cap": 256,
    "kv_budget_bytes": 34_359_738_368, "kv_bytes_per_token": 131_072,
}
CHAT = {"name": "chat", "arrivals_per_min": 360, "prompt_tokens": 300, "output_tokens": 100, "tenant": "app"}
DOCS = {"name": "summarize", "arrivals_per_min": 60, "prompt_tokens": 4200, "output_tokens": 600, "priority": 1,
        "tenant": "docs"}


def run(contract: dict | None = None, classes: list[dict] | None = None, **changes: Any):
    c = AuditContract.model_validate({**BASE_CONTRACT, **(contract or {}), **changes})
    w = AuditWorkload.model_validate({"scope": c.scope, "contract_id": content_id(c),
                                      "classes": classes if classes is not None else [CHAT, DOCS]})
    return audit(c, w, check_pair(c, w), content_id(w))


def ints_only(value: Any) -> bool:
    if isinstance(value, dict):
        return all(ints_only(v) for v in value.values())
    if isinstance(value, list):
        return all(ints_only(v) for v in value)
    return not isinstance(value, float)


# ----------------------------------------------------------------------------------------- content id
def test_content_id_is_sha256_of_the_canonical_record():
    import hashlib

    contract, _ = load_contract(SEED[0])
    cid = content_id(contract)
    assert cid == "sha256:1bd77c09a9ebf1d6"
    assert cid == "sha256:" + hashlib.sha256(canonical_json(contract).encode()).hexdigest()[:16]
    canonical = canonical_json(contract)
    assert canonical.startswith('{"active_sequence_cap":256,"admission_headroom_permille":100,')
    assert " " not in canonical.replace("illustrative ", "")


def test_content_id_ignores_layout_and_spelled_out_defaults_but_not_values(tmp_path):
    data = yaml.safe_load(SEED[0].read_text())
    reordered = dict(reversed(list(data.items())))
    reordered["slo"] = {**data["slo"], "tpot_ms": data["slo"]["tpot_ms"]}
    same = AuditContract.model_validate({**reordered, "version": 1, "format": "batchcheck-audit-contract"})
    assert content_id(same) == "sha256:1bd77c09a9ebf1d6"
    for key, value in (("active_sequence_cap", 255), ("scope", "other"), ("cancel_release_lag_ms", 1)):
        assert content_id(AuditContract.model_validate({**data, key: value})) != "sha256:1bd77c09a9ebf1d6"


def test_every_shipped_workload_names_its_contract():
    assert audit_files(*SEED).contract_id == "sha256:1bd77c09a9ebf1d6"
    for name in ("tiered_normal.yaml", "tiered_overload_2x.yaml"):
        assert audit_files(TIERED, AUDIT / name).contract_id == "sha256:121ae93b99bea4e7"


def test_a_foreign_workload_is_refused_whatever_else_matches():
    contract, _ = load_contract(SEED[0])
    other = contract.model_copy(update={"active_sequence_cap": 128})
    w = AuditWorkload.model_validate({"scope": contract.scope, "contract_id": content_id(contract),
                                      "classes": [CHAT]})
    check_pair(contract, w)
    with pytest.raises(InputError, match="workload belongs to another batching contract"):
        check_pair(other, w)


# ----------------------------------------------------------------------------------------- arithmetic
def test_rounding_helpers():
    assert [ceil_div(a, 4) for a in (0, 1, 4, 5)] == [0, 1, 1, 2]
    assert permille(7_200, 40_000) == 180 and permille(1, 3) == 334 and permille(2, 3) == 667
    assert queue_delay_ms(20, 180) == 5  # ceil(3600 / 820) = ceil(4.39)
    assert queue_delay_ms(20, 0) == 0 and queue_delay_ms(20, 500) == 20 and queue_delay_ms(20, 999) == 19_980
    assert queue_delay_ms(20, 1000) is None and queue_delay_ms(20, 1500) is None


def test_the_seed_per_class_figures():
    r = audit_files(*SEED)
    chat, docs = r.classes
    assert (chat.prefill_tokens_per_min, chat.decode_tokens_per_min) == (108_000, 36_000)
    assert (docs.prefill_tokens_per_min, docs.decode_tokens_per_min) == (252_000, 36_000)
    assert (chat.prefill_iterations, docs.prefill_iterations) == (1, 9)  # ceil(300/480), ceil(4200/480)
    assert (chat.kv_hold_us, docs.kv_hold_us) == (2_000_000, 12_160_000)  # (1 + 99) and (9 + 599) x 20 ms
    assert (chat.active_sequences, docs.active_sequences) == (12, 13)  # 6/s x 2 s, ceil(1/s x 12.16 s)
    assert chat.kv_bytes + docs.kv_bytes == (12 * 400 + 13 * 4_800) * 131_072 == 8_808_038_400
    assert (chat.load_permille, chat.queue_ms, chat.ttft_ms) == (60, 2, 22)  # chat waits behind nobody
    assert (docs.load_permille, docs.queue_ms, docs.ttft_ms) == (180, 5, 185)
    assert r.kv_limit_bytes == 34_359_738_368 * 900 // 1000
    assert r.tenant_shares == {"app": 500, "docs": 500}  # equal shares without explicit ones


def test_no_float_anywhere_in_any_result():
    results = [audit_files(*SEED)] + [audit_files(TIERED, AUDIT / n) for n in ("tiered_normal.yaml",
                                                                              "tiered_overload_2x.yaml")]
    results.append(run_derived_audit(POLICIES / "tiered_shedding.yaml", WORKLOADS / "tiered_normal.yaml"))
    for r in results:
        assert ints_only(r.as_json())


def test_floats_are_refused_in_records():
    with pytest.raises(Exception, match="int"):
        AuditContract.model_validate({**BASE_CONTRACT, "iteration_ms": 20.0})


def test_the_cancellation_lag_holds_kv_longer():
    interactive = {**CHAT, "cancel_permille": 50}
    without = run(classes=[interactive]).classes[0]
    with_lag = run(classes=[interactive], cancel_release_lag_ms=40).classes[0]
    assert without.kv_hold_us == 2_000_000 and without.active_sequences == 12
    assert with_lag.kv_hold_us == 2_000_000 + 50 * 40 and with_lag.active_sequences == 13
    tiered = audit_files(TIERED, AUDIT / "tiered_normal.yaml")
    assert tiered.classes[0].active_sequences == 13


def test_classes_are_served_by_priority_then_as_listed():
    r = run(classes=[{**DOCS, "priority": 1}, {**CHAT, "priority": 0}, {**CHAT, "name": "chat2", "priority": 0}])
    assert [c.name for c in r.classes] == ["chat", "chat2", "summarize"]
    assert r.classes[0].queue_ms < r.classes[1].queue_ms < r.classes[2].queue_ms


def test_tpot_stretches_when_active_sequences_exceed_the_decode_slots():
    # decode 1,000 tokens/s x 20 ms = 20 slots; 12 chat sequences fit, 24 do not
    r = run(prefill_tokens_per_s=39_000, decode_tokens_per_s=1_000, prefill_chunk_tokens=480, classes=[CHAT])
    assert r.contract.decode_slots == 20 and r.last.tpot_ms == 20
    r = run(prefill_tokens_per_s=39_000, decode_tokens_per_s=1_000, classes=[{**CHAT, "arrivals_per_min": 720}])
    assert r.last.active_sequences_cum == 24 and r.last.tpot_ms == 40


# ----------------------------------------------------------------------------------------- the decision
FAILING = [
    # (contract changes, classes, expected decision line)
    ({}, [{**CHAT, "arrivals_per_min": 360 * 14}],
     "decision=PREFILL_CAPACITY_EXCEEDED;class=chat;tenant=app;value=1050;limit=999"),
    ({}, [{**CHAT, "prompt_tokens": 10, "output_tokens": 2000, "arrivals_per_min": 720}],
     "decision=DECODE_CAPACITY_EXCEEDED;class=chat;tenant=app;value=1500;limit=999"),
    ({"tenant_shares_permille": {"app": 50, "docs": 900}, "fairness_bound_permille": 20}, None,
     "decision=TENANT_SHARE_EXCEEDED;class=chat;tenant=app;value=75;limit=70"),
    ({"active_sequence_cap": 20}, None,
     "decision=ACTIVE_SEQUENCE_CAP_EXCEEDED;class=summarize;tenant=docs;value=25;limit=20"),
    ({"kv_budget_bytes": 8_000_000_000, "admission_headroom_permille": 0}, None,
     "decision=KV_BUDGET_EXCEEDED;class=summarize;tenant=docs;value=8808038400;limit=8000000000"),
    ({"slo": {"queue_ms": 4}}, None, "decision=QUEUE_SLO_EXCEEDED;class=summarize;tenant=docs;value=5;limit=4"),
    ({"slo": {"ttft_ms": 184}}, None,
     "decision=TTFT_SLO_EXCEEDED;class=summarize;tenant=docs;value=185;limit=184"),
    ({"slo": {"tpot_ms": 19}}, None, "decision=TPOT_SLO_EXCEEDED;class=chat;tenant=app;value=20;limit=19"),
]


@pytest.mark.parametrize(("changes", "classes", "line"), FAILING, ids=[b.lower() for b in BOUNDS])
def test_every_bound_can_be_the_decision(changes, classes, line):
    r = run(changes, classes)
    assert r.decision_line() == line
    assert r.decision == line.split("=")[1].split(";")[0]


def test_bounds_are_checked_in_the_documented_order():
    # capacity, KV and SLOs all fail for the same class: capacity is named
    r = run({"kv_budget_bytes": 131_072, "slo": {"tpot_ms": 1}}, [{**CHAT, "arrivals_per_min": 360 * 14}])
    assert r.failure is not None and r.failure.bound == "PREFILL_CAPACITY_EXCEEDED"
    # an earlier class failing a later bound is named before a later class failing an earlier one
    r = run({"slo": {"tpot_ms": 19}}, [CHAT, {**DOCS, "arrivals_per_min": 60 * 10}])
    assert (r.failure.bound, r.failure.cls) == ("TPOT_SLO_EXCEEDED", "chat")


def test_fairness_bound_1000_turns_the_tenant_bound_off():
    shares = {"tenant_shares_permille": {"app": 1, "docs": 1}}
    assert run({**shares, "fairness_bound_permille": 1000}).failure is None
    assert run({**shares, "fairness_bound_permille": 0}).failure.bound == "TENANT_SHARE_EXCEEDED"


def test_inconsistent_contracts_are_input_errors():
    for changes, fragment in (({"decode_tokens_per_s": 15_000}, "the partitions must add up to the total"),
                              ({"prefill_chunk_tokens": 481}, "a larger chunk contradicts the declared service rate"),
                              ({"kv_budget_bytes": 1}, "room for one token"),
                              ({"tenant_shares_permille": {"a": 600, "b": 500}}, "shares summing to <= 1000")):
        with pytest.raises(Exception, match=fragment):
            AuditContract.model_validate({**BASE_CONTRACT, **changes})
    with pytest.raises(Exception, match="at least one decode token per 20 ms iteration"):
        AuditContract.model_validate({**BASE_CONTRACT, "prefill_tokens_per_s": 39_951, "decode_tokens_per_s": 49})


# ----------------------------------------------------------------------------------------- derived form
def test_derived_contract_follows_the_documented_derivation():
    r = run_derived_audit(POLICIES / "tiered_shedding.yaml", WORKLOADS / "tiered_normal.yaml", tpot_slo_ms=100)
    policy = load_policy(POLICIES / "tiered_shedding.yaml")
    c, d = r.contract, r.derived
    assert d is not None
    assert d["decode_slots_per_iteration"] == policy.batch.max_num_seqs == c.active_sequence_cap == 96
    assert d["prefill_tokens_per_iteration"] == 1024 - 96
    assert c.kv_budget_bytes == 6000 * 16 * 131_072
    assert c.kv_bytes_per_token == load_profile(None).model.kv_bytes_per_token == 131_072
    assert c.iteration_ms == ceil_div(d["steady_iteration_us"], 1000)
    assert d["steady_iteration_us"] < d["full_iteration_us"] and not d["saturated"]
    assert c.cancel_release_lag_ms == 1 * c.iteration_ms
    assert c.slo.queue_ms == 3000 and c.slo.tpot_ms == 100 and c.slo.ttft_ms is None
    assert c.prefill_chunk_tokens == min(928, c.prefill_tokens_per_s * c.iteration_ms // 1000)
    assert c.prefill_tokens_per_s == d["prefill_tokens_per_min"] * 1_000_000 // d["busy_us_per_min"]
    assert [(k.name, k.priority, k.tenant) for k in r.workload.classes] == [
        ("interactive", 0, "app"), ("standard", 1, "app"), ("background", 5, "batch")]
    assert r.workload.classes[0].cancel_permille > 0 == r.workload.classes[1].cancel_permille
    rs = load_requests(workload=WORKLOADS / "tiered_normal.yaml")
    assert sum(k.arrivals_per_min for k in r.workload.classes) * 90 // 60 >= len(rs.specs)


def test_derived_records_audit_the_same_when_saved(tmp_path):
    import json

    r = run_derived_audit(POLICIES / "tiered_shedding.yaml", WORKLOADS / "tiered_overload_2x.yaml")
    assert r.derived is not None
    (tmp_path / "c.json").write_text(json.dumps(r.derived["contract"]))
    (tmp_path / "w.json").write_text(json.dumps(r.derived["workload_record"]))
    again = audit_files(tmp_path / "c.json", tmp_path / "w.json")
    assert again.text() == r.text() and again.contract_id == r.contract_id


def test_derived_priorities_follow_the_queue_order():
    fcfs = run_derived_audit(POLICIES / "vllm_v1.yaml", WORKLOADS / "chat_mixed.yaml")
    assert {k.priority for k in fcfs.workload.classes} == {0}  # vLLM's FCFS ignores priorities
    strict = run_derived_audit(POLICIES / "strict_priority.yaml", WORKLOADS / "chat_mixed.yaml")
    assert [k.priority for k in strict.workload.classes] == [0, 5]


def test_derived_audit_of_the_readme_example_is_within_bound():
    r = run_derived_audit(POLICIES / "vllm_v1.yaml", WORKLOADS / "chat_mixed.yaml")
    assert r.failure is None
    assert 200 <= r.last.load_permille <= 600  # observed 352: the share of device time chat_mixed needs


# ----------------------------------------------------------------------------------------- beyond the seed
def test_explicit_records_name_the_background_class_first_under_2x_overload():
    normal = audit_files(TIERED, AUDIT / "tiered_normal.yaml")
    assert normal.failure is None
    assert normal.tenant_shares == {"app": 700, "batch": 300}
    assert (normal.last.prefill_permille, normal.last.decode_permille) == (542, 94)
    over = audit_files(TIERED, AUDIT / "tiered_overload_2x.yaml")
    assert over.decision_line() == \
        "decision=PREFILL_CAPACITY_EXCEEDED;class=background;tenant=batch;value=1084;limit=999"
    interactive, standard, _ = over.classes
    assert (standard.prefill_permille, standard.decode_permille) == (500, 150)  # the upper tiers fit
    assert interactive.tpot_ms == standard.tpot_ms == 20 <= over.contract.slo.tpot_ms  # within 2 iterations


@cache
def engine(workload: str, protected: bool = True) -> dict:
    # without the protection: FCFS, prefill-first steps, newest-first victims, no timeout
    policy = load_policy(POLICIES / ("tiered_shedding.yaml" if protected else "tiered_unprotected.yaml"))
    result = simulate(policy, load_requests(workload=WORKLOADS / f"{workload}.yaml"), load_profile(None))
    assert not result.step_limit_hit and not result.livelock and not result.stuck
    return result.summary()


INTERACTIVE_TPOT_BOUND_MS = 100


def test_the_derived_audit_and_the_engine_agree_at_normal_load():
    r = run_derived_audit(POLICIES / "tiered_shedding.yaml", WORKLOADS / "tiered_normal.yaml",
                          tpot_slo_ms=INTERACTIVE_TPOT_BOUND_MS)
    assert r.failure is None  # observed 584 permille
    s = engine("tiered_normal")["by_class"]
    for name in ("interactive", "standard", "background"):
        assert s[name]["rejected"] == 0 and s[name]["unfinished"] == 0  # everybody is served
    assert s["interactive"]["preemptions"] == 0
    assert s["interactive"]["tpot_ms"]["p99"] <= INTERACTIVE_TPOT_BOUND_MS  # observed 27.4


def test_under_2x_overload_the_background_class_is_shed_before_interactive_misses_its_tpot():
    r = run_derived_audit(POLICIES / "tiered_shedding.yaml", WORKLOADS / "tiered_overload_2x.yaml",
                          tpot_slo_ms=INTERACTIVE_TPOT_BOUND_MS)
    assert r.failure is not None and (r.failure.bound, r.failure.cls) == ("PREFILL_CAPACITY_EXCEEDED", "background")
    interactive = r.classes[0]
    assert interactive.name == "interactive" and interactive.tpot_ms <= INTERACTIVE_TPOT_BOUND_MS  # observed 64

    s = engine("tiered_overload_2x")["by_class"]
    bg, it = s["background"], s["interactive"]
    # the background class is rejected (queue timeout) and preempted: observed 66 of 128 rejected, 66 preemptions
    assert bg["rejected_by_reason"].get("timeout", 0) >= 0.25 * bg["requests"]
    assert bg["preemptions"] >= 20
    # ... while the interactive class keeps its TPOT bound and loses nothing (observed p99 66.4, max tbt 82 ms)
    assert it["rejected"] == 0 and it["preemptions"] == 0 and it["unfinished"] == 0
    assert it["tpot_ms"]["p99"] <= INTERACTIVE_TPOT_BOUND_MS
    assert it["max_tbt_ms"]["max"] <= INTERACTIVE_TPOT_BOUND_MS
    assert it["queue_delay_ms"]["p99"] <= 1000  # observed 395
    assert s["standard"]["rejected"] == 0


def test_without_the_protection_the_interactive_class_is_not_protected():
    s = engine("tiered_overload_2x", protected=False)["by_class"]
    it = s["interactive"]
    assert s["background"]["rejected"] == 0  # nobody is shed ...
    assert it["queue_delay_ms"]["p99"] >= 5000  # ... so interactive requests queue for seconds (observed 24088)
    assert it["preemptions"] >= 10  # and are preempted (observed 69)
    protected = engine("tiered_overload_2x")["by_class"]["interactive"]
    assert it["ttft_ms"]["p50"] >= 20 * protected["ttft_ms"]["p50"]  # observed 16547 vs 185 ms


# ----------------------------------------------------------------------------------------- docs
def test_docs_field_reference_is_current():
    doc = (ROOT / "docs" / "audit.md").read_text()
    marker = "<!-- generated: python -m checker.audit.reference -->\n"
    assert doc.split(marker, 1)[1] == render_reference(), \
        "regenerate the end of docs/audit.md with python -m checker.audit.reference"


def test_docs_quote_the_seed_output():
    doc = (ROOT / "docs" / "audit.md").read_text()
    assert audit_files(*SEED).text() + "\n" in doc
