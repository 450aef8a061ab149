"""The KV connector's inputs: policy section, trace and arrivals fields, workload classes, fuzz stresses, and
counterexample files that carry the transfer fields (a replay that dropped them would check another trace)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings

from checker.checklog import load_arrivals
from checker.errors import InputError
from checker.fuzz.strategies import STRESSES, default_stresses, request_maker
from checker.inputfiles import load_policy
from checker.policy import Policy
from checker.requests import RequestSpec
from checker.traces import dump_json_trace, load_json_trace
from checker.verify.counterexample import policy_hash, requests_json, specs_from_json
from checker.workload import Workload, generate
from tests.helpers import POLICIES

BASE = {"max_model_len": 1024, "kv": {"num_blocks": 64}}


def _policy(**connector) -> Policy:
    return Policy.model_validate({**BASE, "connector": connector})


@pytest.mark.parametrize("connector, message", [
    ({"holders_first": False}, "connector\n  holders_first=false (expected its default unless kind is offload, "
     "decode_node, prefill_node or both (without a connector no request holds KV outside the batch))"),
    ({"kind": "offload", "release": "deadline"}, "release_deadline_steps=None (expected >= 1 when release is deadline)"),
    ({"kind": "offload", "release_deadline_steps": 0}, "release_deadline_steps\n  Input should be greater than or equal to 1"),
    ({"kind": "offload", "release_deadline_steps": 3}, "release_deadline_steps=3 (expected null unless release is "
     "deadline (it is on_completion: the deadline would never apply))"),
])
def test_contradicting_connector_settings_are_refused_with_their_field(connector, message):
    with pytest.raises(Exception) as err:
        _policy(**connector)
    assert message in str(err.value)


def test_a_loading_connector_with_the_mixed_pass_is_refused():
    with pytest.raises(Exception) as err:
        Policy.model_validate({**BASE, "batch": {"phase_mode": "mixed"}, "connector": {"kind": "offload"}})
    assert "connector.kind=offload (expected none or prefill_node when batch.phase_mode is mixed" in str(err.value)


def test_the_connector_section_at_its_default_leaves_the_policy_hash_as_before():
    plain = load_policy(POLICIES / "vllm_v1.yaml")
    assert policy_hash(plain) == policy_hash(plain.model_copy(update={"connector": _policy().connector}))
    assert policy_hash(plain) != policy_hash(plain.model_copy(update={"connector": _policy(kind="offload").connector}))


def test_trace_rows_carry_the_transfer_fields_and_write_them_back(tmp_path):
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"format": "batchcheck-trace", "requests": [
        {"arrival_ms": 0, "prompt_tokens": 100, "output_tokens": 4, "external_tokens": 64, "load_steps": None},
        {"arrival_ms": 1, "prompt_tokens": 50, "output_tokens": 4, "send_steps": 2}]}))
    rs = load_json_trace(path)
    assert [(s.external_tokens, s.load_steps, s.send_steps) for s in rs.specs] == [(64, None, 0), (0, 1, 2)]
    rows = dump_json_trace(rs)["requests"]
    assert ({k: rows[0][k] for k in ("external_tokens", "load_steps")}, rows[1]["send_steps"]) == (
        {"external_tokens": 64, "load_steps": None}, 2)
    assert "external_tokens" not in rows[1]  # default values are not written: files without a connector unchanged


def test_a_trace_row_holding_more_external_tokens_than_its_prompt_is_refused(tmp_path):
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"format": "batchcheck-trace", "requests": [
        {"arrival_ms": 0, "prompt_tokens": 10, "output_tokens": 4, "external_tokens": 11}]}))
    with pytest.raises(InputError) as err:
        load_json_trace(path)
    assert "external_tokens=11 (expected <= prompt_tokens=10 (the external tier holds a prefix of the prompt))" in str(err.value)


@pytest.mark.parametrize("row, message", [
    ({"load_steps": 0}, "[0].load_steps=0 (expected a whole number from 1 to 10,000,000 or null (never reported))"),
    ({"send_steps": -1}, "[0].send_steps=-1 (expected a whole number from 0 to 10,000,000 or null (never reported))"),
    ({"external_tokens": None}, "[0].external_tokens=None (expected a whole number from 0 to 10,000,000)"),
    ({"external_tokens": 65}, "[0].external_tokens=65 (expected <= prompt_tokens=64"),
])
def test_arrivals_rows_with_bad_transfer_fields_are_refused(tmp_path, row, message):
    path = tmp_path / "a.json"
    path.write_text(json.dumps([{"id": "a", "arrival_step": 0, "prompt_tokens": 64, "output_tokens": 2, **row}]))
    with pytest.raises(InputError) as err:
        load_arrivals(path)
    assert message in str(err.value)


def test_counterexample_requests_round_trip_the_transfer_fields():
    specs = [RequestSpec(0, 0, 100, 4, 4, external_tokens=64, load_steps=None), RequestSpec(1, 5, 50, 4, 4, send_steps=3),
             RequestSpec(2, 9, 30, 2, 2)]
    rows = requests_json(specs)
    assert "external_tokens" not in rows[2] and "load_steps" not in rows[2]
    assert specs_from_json(rows) == specs


def _workload(**external) -> Workload:
    return Workload.model_validate({"duration_s": 2, "seed": 3, "classes": [{
        "name": "a", "arrival": {"process": "poisson", "rate_per_s": 40}, "prompt_tokens": {"dist": "uniform", "low": 20,
        "high": 400}, "output_tokens": {"dist": "fixed", "value": 5}, **({"external_kv": external} if external else {})}]})


def test_an_external_kv_class_draws_hits_from_its_own_stream():
    plain, loading = generate(_workload()), generate(_workload(fraction=0.5, prefix_share=0.5, lost=0.2,
                                                                load_steps={"dist": "uniform", "low": 1, "high": 4}))
    strip = [(s.arrival_us, s.prompt_len, s.output_len) for s in plain]
    assert strip == [(s.arrival_us, s.prompt_len, s.output_len) for s in loading]  # the other draws are the same
    hits = [s for s in loading if s.external_tokens]
    assert 0.3 < len(hits) / len(loading) < 0.7
    assert all(s.external_tokens == max(1, s.prompt_len // 2) for s in hits)
    assert {s.load_steps for s in hits} <= {None, 1, 2, 3, 4} and None in {s.load_steps for s in hits}
    assert all(s.external_tokens == 0 and s.load_steps == 1 for s in plain)


def test_the_connector_stresses_are_drawn_by_default_only_under_a_loading_connector():
    gated = ("slow_or_lost_transfers", "abort_during_load", "blocked_grammars", "failed_loads")  # each by its rule
    assert default_stresses(_policy()) == [n for n in STRESSES if n not in gated]
    assert default_stresses(_policy(kind="decode_node"))[-2:] == ["slow_or_lost_transfers", "abort_during_load"]
    assert default_stresses(_policy(kind="prefill_node")) == default_stresses(_policy())


@settings(max_examples=30, deadline=None)
@given(STRESSES["abort_during_load"](__import__("checker.fuzz.strategies", fromlist=["ranges"]).ranges(_workload()),
                                     _policy(kind="decode_node", max_load_steps=3), 8))
def test_abort_during_load_draws_loads_cancelled_early(draws):
    specs = request_maker(_workload())(draws).specs
    top = 2 * 3
    for d, s in zip(draws, specs):
        assert 1 <= s.external_tokens <= s.prompt_len and s.external_tokens >= (3 * s.prompt_len) // 4
        assert s.load_steps is None or 1 <= s.load_steps <= top
        assert s.cancel_us is not None and s.cancel_us - s.arrival_us <= 50_000
