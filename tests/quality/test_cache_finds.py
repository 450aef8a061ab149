"""Planted prefix-cache bugs are found, and their fixes are not: spec/policies/broken/vllm_v1_cache_*.yaml."""

from __future__ import annotations

import json

from checker.api import load_policy, run_fuzz
from checker.cli import main
from checker.requests import GREEDY_OUTPUT_TOKEN, RequestSpec, content_from_prefix_group
from checker.smt.ops import IntOps
from checker.verify.replay import replay_fixed_clock
from invariants.catalogue import CATALOGUE
from tests.helpers import POLICIES, ROOT, WORKLOADS, fixed_policy

KV_SLO = ROOT / "spec" / "slo" / "kv_safety.slo.yaml"
UNCOUNTED = POLICIES / "broken" / "vllm_v1_cache_uncounted_hits.yaml"
UNCHAINED = POLICIES / "broken" / "vllm_v1_cache_unchained_hashes.yaml"


def test_uncounted_free_hits_over_commit_the_pool_and_fuzz_finds_a_minimal_trace(tmp_path):
    (result,) = run_fuzz(UNCOUNTED, WORKLOADS / "weakness_cache_uncounted_hits.yaml", KV_SLO, ["kv_within_pool"], 200,
                         time_budget_s=120, seed=1, out_dir=tmp_path, database_dir=None)
    assert result.violated, result.line()
    assert len(result.trace) <= 3
    doc = json.loads(result.counterexample.read_text())
    assert all("prompt_runs" in row for row in doc["requests"])  # the prompt identity is recorded
    assert main(["replay", str(result.counterexample)]) == 1  # the file reproduces on the engine
    # the fix (vLLM's accounting) passes the very same trace, and the search finds nothing against it
    fix = fixed_policy(UNCOUNTED, "count_evictable_hits", tmp_path)
    assert main(["replay", str(result.counterexample), "--policy", str(fix)]) == 0
    (clean,) = run_fuzz(fix,
                        WORKLOADS / "weakness_cache_uncounted_hits.yaml", KV_SLO, ["kv_within_pool"], 200,
                        time_budget_s=120, seed=1, out_dir=tmp_path, database_dir=None)
    assert not clean.violated and clean.examples >= 200


def test_unchained_hashes_give_a_hit_on_another_context(tmp_path):
    # request 0 decodes 32 tokens: its two output blocks hold the output token 16 times each. Request 1's
    # prompt starts with 16 of those tokens (a run of one repeated token): with unchained hashes its first
    # block "hits" request 0's output block, KV computed after another prefix.
    repeated = tuple((GREEDY_OUTPUT_TOKEN, 1) for _ in range(16)) + ((5_000_000, 8),)
    specs = [RequestSpec(0, 0, 16, 40, 40, content=content_from_prefix_group(1, 16)),
             RequestSpec(1, 40_000, 24, 2, 2, content=repeated)]
    inv = CATALOGUE["hit_only_on_identical_chain"]
    broken = replay_fixed_clock(load_policy(UNCHAINED), specs, 45, 1000)
    bad = [t for t in range(len(broken.frames)) if not inv.holds(IntOps, broken.ctx, t)]
    assert bad and broken.decisions[bad[0]].cache_hits == ((1, 16),)
    good = replay_fixed_clock(load_policy(fixed_policy(UNCHAINED, "chained_hashes", tmp_path)), specs, 45, 1000)
    assert all(inv.holds(IntOps, good.ctx, t) for t in range(len(good.frames)))
    assert not any(d.cache_hits for d in good.decisions)


def test_the_cache_invariants_hold_on_a_correct_pool_under_pressure():
    # prefix_caching/vllm_v1.yaml on a 12-block pool: hits, sharing, evictions and preemptions all happen
    policy = load_policy(POLICIES / "prefix_caching" / "vllm_v1.yaml")
    small = policy.model_copy(update={"kv": policy.kv.model_copy(update={"num_blocks": 12}),
                                      "max_model_len": 1024})
    specs = [RequestSpec(i, 3000 * i, 40 + 24 * (i % 3), 30, 30, content=content_from_prefix_group(i % 2, 40 + 24 * (i % 3)))
             for i in range(8)]
    rep = replay_fixed_clock(small, specs, 200, 1000)
    assert any(d.preempted for d in rep.decisions) and any(d.cache_hits for d in rep.decisions)
    assert rep.state.pool.evictions > 0 and any(f.pool.shared for f in rep.frames)
    for name in ("kv_never_overcommitted", "request_conservation", "block_pool_conservation",
                 "no_referenced_block_reused", "hit_only_on_identical_chain"):
        inv = CATALOGUE[name]
        assert all(inv.holds(IntOps, rep.ctx, t) for t in range(len(rep.frames))), name
