"""What `batchcheck verify` must find and prove (issue 3's list; the slow ones live in bench/).

Each find asserts the verdict, the minimal size, and that a counterexample of that size is checked into
counterexamples/ (tests/regression replays them all).
"""

from __future__ import annotations

import json

import pytest

from checker.api import run_verify
from checker.verify.run import Verdict
from tests.helpers import POLICIES, ROOT

FINDS = [
    # (policy, invariant, requests, depth, prompt range, minimal requests, failing iteration)
    ("tgi_router", "cancellation_releases:0", 2, 3, (1, 64), 1, 1),  # lazy release: KV held one more step
    ("vllm_v0_no_chunking", "decode_progress:1", 2, 4, (1, 64), 2, 1),  # a prefill-first step stalls decodes
    ("broken/unchecked_growth", "kv_never_overcommitted", 3, 6, None, 2, 1),  # on-demand, unchecked growth
    ("broken/vllm_v1_small_pool", "no_deadlock:2", 2, 4, None, 1, 1),  # a head larger than the pool blocks all
    ("static_batching", "work_conserving", 2, 4, (1, 64), 2, 1),  # slots idle while the batch runs on
    # a low-priority request arrives with a high one; full-budget prompts; a later high one jumps ahead of it
    ("strict_priority", "bounded_starvation:1", 3, 3, (8192, 8192), 3, 1),
    # a prompt larger than the pool is admitted chunk by chunk, fills the pool and preempts itself, again
    ("broken/thrash_recompute", "bounded_preemptions:1", 2, 6, None, 1, 5),
]


@pytest.mark.parametrize("policy,invariant,requests,depth,prompt,minimal,iteration", FINDS,
                         ids=[f"{p}:{i}" for p, i, *_ in FINDS])
def test_finds_the_weakness_with_a_minimal_replayed_counterexample(tmp_path, policy, invariant, requests, depth,
                                                                    prompt, minimal, iteration):
    _, (result,) = run_verify(POLICIES / f"{policy}.yaml", [invariant], requests, depth, timeout_s=60,
                              out_dir=tmp_path, prompt=prompt)
    assert result.verdict is Verdict.VIOLATED
    assert (result.requests, result.violation_step) == (minimal, iteration)
    assert not result.notes  # minimality was checked
    # A counterexample of the same minimal size is checked in (z3's model, hence the file, can differ between
    # processes: only its size is canonical).
    prefix = result.counterexample.name.rsplit("__", 1)[0]
    shipped = [json.loads(p.read_text()) for p in (ROOT / "counterexamples").glob(f"{prefix}__*.json")]
    assert shipped, f"check in the counterexample: cp {result.counterexample} counterexamples/"
    assert [(len(doc["requests"]), doc["violation"]["iteration"]) for doc in shipped] == [(minimal, iteration)]


def test_rejecting_requests_that_never_fit_removes_the_deadlock(tmp_path):
    fixed = tmp_path / "fixed.yaml"
    text = (POLICIES / "broken" / "vllm_v1_small_pool.yaml").read_text()
    fixed.write_text(text.replace("\nkv:", "\nadmission: {reject_never_fits: true}\nkv:"))
    _, (result,) = run_verify(fixed, ["no_deadlock:2"], 2, 4, timeout_s=60, out_dir=tmp_path)
    assert result.verdict is Verdict.HOLDS_UP_TO


@pytest.mark.parametrize("policy", ["vllm_v1", "sarathi_serve"])
def test_proves_the_safety_invariants_for_any_depth(tmp_path, policy):
    _, results = run_verify(POLICIES / f"{policy}.yaml", None, requests=2, depth=2, timeout_s=60,
                            out_dir=tmp_path, prompt=(1, 2048), unbounded=True, proof_dir=tmp_path)
    assert {r.invariant.name: r.verdict for r in results} == {
        "kv_never_overcommitted": Verdict.PROVED, "token_budget": Verdict.PROVED, "seq_cap": Verdict.PROVED,
        "request_conservation": Verdict.PROVED}
    # two 2,048-token prompts cannot fill 2,500 blocks, nor can the 12 slots verify raises N to: the KV invariant
    # is proved for any N (issue 19 item 3), and the verdict says so
    (kv,) = [r for r in results if r.invariant.name == "kv_never_overcommitted"]
    assert "so it was proved for any N (--any-n)" in kv.abstraction


def test_proves_kv_safety_where_the_pool_can_fill(tmp_path):
    from checker.api import load_policy
    from checker.verify.env import default_environment
    from checker.verify.run import check_one
    from invariants import CATALOGUE

    policy = load_policy(POLICIES / "vllm_v1.yaml")
    small = policy.model_copy(update={"kv": policy.kv.model_copy(update={"num_blocks": 64})})
    env = default_environment(small, 2, 3, prompt=(1, 1024), output=(1, 8))
    result = check_one(small, None, CATALOGUE["kv_never_overcommitted"], {}, env, 60, tmp_path, True, tmp_path)
    assert result.verdict is Verdict.PROVED


def test_degradation_order_holds_with_the_protection_and_fails_without_it(tmp_path):
    # issue 6, "prove the mechanism": the tiered server keeps interactive decodes going while background
    # requests run; without its protection (FCFS, prefill-first, newest-first victims) a background prompt
    # takes the step. Ranges, priorities and tenants come from the tiered workload.
    tiered = ROOT / "spec" / "workloads" / "tiered_normal.yaml"
    _, (bad,) = run_verify(POLICIES / "tiered_unprotected.yaml", ["degradation_order"], 2, 3, timeout_s=120,
                           workload=tiered, out_dir=tmp_path)
    assert bad.verdict is Verdict.VIOLATED and (bad.requests, bad.violation_step) == (2, 1) and not bad.notes
    shipped = list((ROOT / "counterexamples").glob("tiered_unprotected__degradation_order__*.json"))
    assert [len(json.loads(p.read_text())["requests"]) for p in shipped] == [2]
    _, (good,) = run_verify(POLICIES / "tiered_shedding.yaml", ["degradation_order"], 2, 3, timeout_s=120,
                            workload=tiered, out_dir=tmp_path, unbounded=True, proof_dir=tmp_path)
    assert good.verdict is Verdict.PROVED and good.induction_depth == 2  # plain induction has an unreachable CTI


def test_proves_decode_progress_for_sarathi_serve_by_2_induction(tmp_path):
    from checker.api import run_recheck

    _, (result,) = run_verify(POLICIES / "sarathi_serve.yaml", ["decode_progress"], requests=2, depth=3,
                              timeout_s=120, out_dir=tmp_path, unbounded=True, proof_dir=tmp_path)
    assert result.verdict is Verdict.PROVED and result.induction_depth == 2
    assert "(2-induction with " in result.line()
    assert run_recheck(result.certificate) == ("unsat", 1)


def test_proves_cancellation_releases_within_one_step_for_any_depth(tmp_path):
    from checker.api import run_recheck

    _, (result,) = run_verify(POLICIES / "vllm_v1.yaml", ["cancellation_releases:1"], requests=2, depth=3,
                              timeout_s=120, out_dir=tmp_path, unbounded=True, proof_dir=tmp_path)
    assert result.verdict is Verdict.PROVED and result.certificate is not None
    assert run_recheck(result.certificate) == ("unsat", 1)



def test_the_starvation_trace_is_served_in_arrival_order(tmp_path):
    # With N slots any order's worst wait is the same (everyone may arrive at once), so the verdict alone does
    # not blame priority; the trace does: the same arrivals under FCFS serve the low-priority request in time.
    from checker.api import run_replay

    fcfs = tmp_path / "fcfs.yaml"
    fcfs.write_text((POLICIES / "strict_priority.yaml").read_text()
                    .replace("order: priority", "order: fcfs").replace(", priority_inversion]", "]"))
    (shipped,) = (ROOT / "counterexamples").glob("strict_priority__bounded_starvation__*.json")
    assert run_replay(shipped)[1] and not run_replay(shipped, fcfs)[1]


def test_finds_the_over_commit_among_eight_requests_and_shows_it_minimal(tmp_path):
    # issue 3's speed case (8 x 32): fewer slots are searched first and one slot is ruled out for any depth by
    # induction, so minimality no longer needs 32 unrolled depths of every smaller size (it timed out before)
    _, (result,) = run_verify(POLICIES / "broken" / "unchecked_growth.yaml", ["kv_never_overcommitted"], 8, 32,
                              timeout_s=20, out_dir=tmp_path)
    assert result.verdict is Verdict.VIOLATED and (result.requests, result.violation_step) == (2, 1)
    assert not result.notes
