"""Speculative decoding (policy.speculative; checker/semantics/speculative.py): hand-traced steps, the policy's
consistency checks and default, the importer's mapping and refusals, and the z3 encoding's and the liveness
explorer's refusals by name."""

from __future__ import annotations

import json

import pytest

from checker.cli import main
from checker.errors import InputError
from checker.importers import import_policy
from checker.policy import Policy
from checker.requests import RequestSpec
from checker.semantics.state import SchedulerState, Status
from checker.semantics.step import step
from checker.verify.counterexample import policy_hash

BASE = {"max_model_len": 1000, "kv": {"num_blocks": 20, "block_size": 16},
        "batch": {"max_num_batched_tokens": 64, "max_num_seqs": 4}}


def policy(method: str = "eagle", k: int = 3, **extra) -> Policy:
    return Policy(**{**BASE, **extra, "speculative": {"method": method, "num_tokens": k}})


def run(p: Policy, specs: list[RequestSpec], steps: int) -> list[tuple]:
    s = SchedulerState(p, specs)
    out = []
    for j in range(steps):
        d = step(s, [r for r in s.requests if r.arrival_us == j * 1000], [], j * 1000)
        out.append((dict(d.scheduled), [(r.num_computed, r.num_generated, r.blocks) for r in s.requests],
                    list(d.finished), d.kv_blocks_used))
    return out


def test_one_request_hand_traced():
    """A 30-token prompt, 7 output tokens, eagle k=3 (3 lookahead slots), the verifier accepting 3, 0, 1."""
    spec = RequestSpec(rid=0, arrival_us=0, prompt_len=30, output_len=7, max_output=7, accepted=(3, 0, 1))
    steps = run(policy(), [spec], 4)
    # step 0: the prompt (no drafts in a request's first step); blocks for 30 + 3 lookahead = 33 tokens: 3
    assert steps[0] == ({0: 30}, [(30, 1, 3)], [], 3)
    # step 1: 1 + 3 drafts, all accepted: 4 output tokens; 34 + 3 lookahead = 37 tokens: still 3 blocks
    assert steps[1] == ({0: 4}, [(34, 5, 3)], [], 3)
    # step 2: 1 + 3 drafts, none accepted: the 3 rolled back, 1 token
    assert steps[2] == ({0: 4}, [(35, 6, 3)], [], 3)
    # step 3: 1 accepted (2 tokens), trimmed to the one the request still has: it finishes, its blocks freed
    assert steps[3] == ({0: 4}, [(36, 7, 0)], [0], 0)


def test_ngram_has_no_lookahead_and_draft_model_takes_a_budget_slot():
    spec = RequestSpec(rid=0, arrival_us=0, prompt_len=32, output_len=9, max_output=9, accepted=(4,))
    # ngram: 32 prompt tokens fill 2 blocks exactly, no lookahead slot; the decode 1 + 4 needs a third block
    ngram = run(policy("ngram", 4), [spec], 2)
    assert ngram[0][1] == [(32, 1, 2)] and ngram[1] == ({0: 5}, [(37, 6, 3)], [], 3)
    # eagle: 32 + 4 lookahead = 36 tokens: 3 blocks from the first step on
    assert run(policy("eagle", 4), [spec], 1)[0][1] == [(32, 1, 3)]
    # draft (vLLM draft_model): one extra budget slot per scheduled request: a 64-token budget leaves 63 for one
    long = RequestSpec(rid=0, arrival_us=0, prompt_len=200, output_len=2, max_output=2)
    assert run(policy("draft", 2, kv={"num_blocks": 40, "block_size": 16}), [long], 1)[0][0] == {0: 63}


def test_a_second_request_gets_drafts_after_its_first_step_and_the_budget_cuts_them():
    a = RequestSpec(rid=0, arrival_us=0, prompt_len=40, output_len=20, max_output=20, accepted=(3, 3, 3))
    b = RequestSpec(rid=1, arrival_us=1000, prompt_len=61, output_len=20, max_output=20, accepted=(0, 0))
    steps = run(policy("ngram", 3), [a, b], 3)
    assert steps[0][0] == {0: 40}
    assert steps[1][0] == {0: 4, 1: 60}  # b's first chunk (the budget's 60 left): no drafts, and it samples nothing
    assert steps[2][0] == {0: 4, 1: 1}  # the prompt's last token: still no drafts (its last step was a chunk)
    cut = run(policy("ngram", 3, batch={"max_num_batched_tokens": 42, "max_num_seqs": 2}), [a, b], 2)
    assert cut[1][0] == {0: 4, 1: 38}


def test_default_section_leaves_the_hash_and_the_step_unchanged():
    plain = Policy(**BASE)
    explicit = Policy(**BASE, speculative={"method": "none", "num_tokens": 0})
    assert policy_hash(plain) == policy_hash(explicit)
    assert SchedulerState(explicit, []).spec is None
    assert policy_hash(policy()) != policy_hash(plain)


@pytest.mark.parametrize("extra, field, fragment", [
    ({"speculative": {"method": "none", "num_tokens": 2}}, "speculative.num_tokens", "0 when method is none"),
    ({"speculative": {"method": "eagle", "num_tokens": 0}}, "speculative.num_tokens", ">= 1 when method is eagle"),
    ({"speculative": {"method": "eagle", "num_tokens": 3}, "max_model_len": 4}, "speculative.num_tokens",
     "<= max_model_len - 2 = 2"),
    ({"speculative": {"method": "eagle", "num_tokens": 3}, "kv": {"num_blocks": 20, "block_size": 16,
                                                                  "prefix_caching": {"enabled": True}}},
     "kv.prefix_caching.enabled", "not modelled yet"),
    ({"speculative": {"method": "draft", "num_tokens": 3}, "connector": {"kind": "offload"}}, "connector.kind",
     "not modelled yet"),
])
def test_contradictory_settings_are_located(extra, field, fragment):
    with pytest.raises(Exception) as info:
        Policy(**{**BASE, **extra})
    text = str(info.value)
    assert field.split(".")[-1] in text and fragment in text


def _imported(config: str) -> Policy:
    return import_policy("vllm", ["--max-model-len", "8192", "--num-gpu-blocks-override", "90",
                                  "--no-enable-prefix-caching", "--speculative-config", config], name="x").policy


def test_import_vllm_speculative_config():
    for method, ours, lookahead in (("ngram", "ngram", 0), ("eagle", "eagle", 3), ("eagle3", "eagle", 3),
                                    ("draft_model", "draft", 3), ("mtp", "mtp", 3)):
        spec = _imported(json.dumps({"method": method, "num_speculative_tokens": 3})).speculative
        assert (spec.method.value, spec.num_tokens, spec.lookahead_slots) == (ours, 3, lookahead)


@pytest.mark.parametrize("config, fragment", [
    ('{"method": "medusa", "num_speculative_tokens": 3}', "medusa is not modelled"),
    ('{"method": "eagle"}', "num_speculative_tokens a whole number from 1 to 64"),
    ('{"method": "eagle", "num_speculative_tokens": 3, "parallel_drafting": true}', "parallel_drafting"),
    ("not json", "a JSON object"),
])
def test_import_vllm_refuses_by_name(config, fragment):
    with pytest.raises(InputError) as info:
        _imported(config)
    assert fragment in str(info.value)


def test_import_sglang_refuses_speculative_flags_by_name():
    with pytest.raises(InputError) as info:
        import_policy("sglang", ["--context-length", "8192", "--speculative-algorithm", "EAGLE"], name="x")
    assert "--speculative-algorithm" in str(info.value) and "speculative decoding" in str(info.value)


def _spec_policy_file(tmp_path) -> str:
    path = tmp_path / "spec.yaml"
    path.write_text(json.dumps({**BASE, "speculative": {"method": "eagle", "num_tokens": 2}}))
    return str(path)


def test_verify_checks_speculative_and_refuses_any_n_and_diff_by_name(tmp_path, capsys):
    """z3 encodes speculative decoding for the bounded search and whole-step induction; the proof for any N is refused
    by name, and so is diff (the two policies' verifier choices are not paired), before any verdict."""
    path = _spec_policy_file(tmp_path)
    code = main(["verify", path, "--depth", "2", "--requests", "1", "--invariant", "token_budget",
                 "--out", str(tmp_path)])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "PROVED" in out and "the verifier accepts any 0..2 of the drafts" in out  # whole-step induction, N=1
    code = main(["verify", path, "--depth", "2", "--requests", "1", "--any-n", "--out", str(tmp_path / "cx")])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "--any-n=True" in err and "speculative decoding" in err
    other = tmp_path / "unreserved.yaml"
    other.write_text(json.dumps({**BASE, "speculative": {"method": "eagle", "num_tokens": 2,
                                                          "reserve_lookahead": False}}))
    code = main(["diff", path, str(other), "--depth", "2", "--requests", "1", "--out", str(tmp_path / "cx")])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "speculative.method" in err and "diff" in err
    assert not (tmp_path / "cx").exists()  # refused before any verdict


def test_an_unknown_verdicts_hint_suggests_the_proof_only_where_one_covers_the_policy(tmp_path):
    """The UNKNOWN line's hint names the proof (drop --bounded-only) only where a proof method covers the policy:
    speculative decoding (whole-step induction) yes, a KV connector no."""
    from checker.api import load_policy
    from checker.verify.env import default_environment
    from checker.verify.run import next_step, proof_applies

    spec = load_policy(_spec_policy_file(tmp_path))
    connector = load_policy(Policy.model_validate({**BASE, "name": "c", "connector": {"kind": "offload"}}))
    env = default_environment(spec, 3, 5)
    assert proof_applies(spec) and not proof_applies(connector)
    assert "drop --bounded-only" in next_step(env, 60, False, proof_applies(spec))
    hint = next_step(env, 60, False, proof_applies(connector))
    assert "--bounded-only" not in hint and "--timeout 180" in hint


def test_liveness_explores_a_speculative_policy(tmp_path, capsys):
    """The explorer covers speculative decoding (tests/conformance/test_liveness_inflight_conformance.py): the
    verifier's choices are part of the stated environment."""
    code = main(["liveness", _spec_policy_file(tmp_path), "--out", str(tmp_path), "--accepted", "0,2"])
    out, err = capsys.readouterr()
    assert code != 2 and not err, err  # a verdict (the base policy's limits are never reached: VACUOUS, exit 3)
    assert "of how many it accepts, in {0, 2}" in out


def test_simulate_runs_a_speculative_policy(tmp_path):
    """The engine with speculative on: every request finishes, in no more steps than without drafts."""
    specs = [RequestSpec(rid=i, arrival_us=0, prompt_len=20 + i, output_len=12, max_output=12, accepted=(2,) * 12)
             for i in range(3)]
    on = run(policy("eagle", 2), specs, 12)
    assert all(s.status is Status.FINISHED for s in _final(policy("eagle", 2), specs, 12))
    assert sum(len(f) for _, _, f, _ in on) == 3


def _final(p: Policy, specs: list[RequestSpec], steps: int):
    s = SchedulerState(p, specs)
    for j in range(steps):
        step(s, [r for r in s.requests if r.arrival_us == j * 1000], [], j * 1000)
    return s.requests


def test_trace_accepted_field_round_trips(tmp_path):
    from checker.traces import dump_json_trace, load_json_trace

    path = tmp_path / "t.json"
    path.write_text(json.dumps({"format": "batchcheck-trace", "requests": [
        {"arrival_ms": 0, "prompt_tokens": 10, "output_tokens": 5, "accepted": [1, 2]},
        {"arrival_ms": 1, "prompt_tokens": 10, "output_tokens": 5}]}))
    rs = load_json_trace(path)
    assert [s.accepted for s in rs.specs] == [(1, 2), ()]
    rows = dump_json_trace(rs)["requests"]
    assert rows[0]["accepted"] == [1, 2] and "accepted" not in rows[1]  # files without it stay as they were


def test_workload_acceptance_draws_from_its_own_stream():
    from checker.workload import Workload, generate

    cls = {"name": "a", "arrival": {"process": "poisson", "rate_per_s": 3},
           "prompt_tokens": {"dist": "uniform", "low": 10, "high": 90}, "output_tokens": {"dist": "fixed", "value": 6}}
    plain = generate(Workload(seed=1, duration_s=5, classes=[cls]))
    spec = generate(Workload(seed=1, duration_s=5, classes=[{**cls, "speculative_acceptance": {"rate": 0.7,
                                                                                             "max_drafts": 4}}]))
    assert [(s.arrival_us, s.prompt_len) for s in plain] == [(s.arrival_us, s.prompt_len) for s in spec]
    assert all(s.accepted == () for s in plain)
    assert all(len(s.accepted) == 6 and max(s.accepted) <= 4 for s in spec)
    assert sum(map(sum, (s.accepted for s in spec))) > 0


def test_simulate_reports_acceptance_only_when_on():
    from checker.engine import simulate
    from checker.metrics import summarize
    from checker.profile import load_profile
    from checker.traces import RequestSet

    specs = [RequestSpec(rid=i, arrival_us=i * 1000, prompt_len=20, output_len=10, max_output=10,
                         accepted=(2, 0, 1, 2, 2, 2, 2, 2, 2)) for i in range(4)]
    rs = RequestSet(specs, ["default"], ["default"], "test")
    from tests.helpers import ROOT
    profile = load_profile(ROOT / "spec" / "profiles" / "default_linear.json")
    on = summarize(simulate(policy("eagle", 2), rs, profile))["engine"]["speculative"]
    assert on["drafts"] > 0 and 0 < on["acceptance_rate"] <= 1
    assert on["tokens_per_verifying_row"] == round((on["accepted"] + on["drafts"] / 2) / (on["drafts"] / 2), 3)
    assert "speculative" not in summarize(simulate(Policy(**BASE), rs, profile))["engine"]


@pytest.mark.parametrize("accepted, fragment", [
    ({"s0": -1}, "accepted.s0=-1 (expected a whole number >= 0)"),
    ({"nobody": 1}, "accepted.nobody='nobody' (expected the id of a request of the arrivals)"),
    ([1], "accepted=[1] (expected an object: request id -> drafts accepted)"),
])
def test_bad_accepted_in_a_log_line_is_located(tmp_path, capsys, accepted, fragment):
    from tests.vllm_spec_logs import KEPT

    name = "ngram_k3_roomy"
    lines = (KEPT / f"{name}.log.jsonl").read_text().splitlines()
    bad = json.loads(lines[3])
    bad["accepted"] = accepted
    log = tmp_path / "bad.log.jsonl"
    log.write_text("\n".join(lines[:3] + [json.dumps(bad)] + lines[4:]) + "\n")
    code = main(["check-log", str(KEPT / f"{name}.yaml"), str(log), "--arrivals", str(KEPT / f"{name}.trace.json"),
                 "--conformance"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert fragment in err and "bad.log.jsonl:4:" in err


def test_counterexample_requests_keep_the_accepted_lists():
    from checker.verify.counterexample import requests_json, specs_from_json

    specs = [RequestSpec(rid=0, arrival_us=0, prompt_len=5, output_len=3, max_output=3, accepted=(1, 0)),
             RequestSpec(rid=1, arrival_us=10, prompt_len=5, output_len=3, max_output=3)]
    rows = requests_json(specs)
    assert "accepted" not in rows[1]  # files without speculative decoding stay as they were
    assert specs_from_json(json.loads(json.dumps(rows))) == specs
