"""`verify` on policies with prefix caching: explicit-state search on the engine (checker/verify/explicit.py).

The correct cache holds within the bounds, the planted bugs (spec/policies/broken/vllm_v1_cache_*.yaml) are found
with minimal counterexamples that replay, and the search's reductions (merged states, lazy choices) give exactly
what replaying every instance of the same finite domain on the engine gives.
"""

from __future__ import annotations

import dataclasses
import itertools
import json

import pytest

from checker.api import load_policy, run_verify
from checker.cli import main
from checker.requests import RequestSpec
from checker.smt.ops import IntOps
from checker.verify import explicit
from checker.verify.env import default_environment
from checker.verify.replay import replay_fixed_clock
from checker.verify.run import DEFAULT_INVARIANTS, Verdict, check_one, parse_invariant
from tests.helpers import POLICIES, fixed_policy

CACHING = POLICIES / "prefix_caching" / "vllm_v1.yaml"
UNCOUNTED = POLICIES / "broken" / "vllm_v1_cache_uncounted_hits.yaml"
UNCHAINED = POLICIES / "broken" / "vllm_v1_cache_unchained_hashes.yaml"


def small_pool(blocks: int = 8, block_size: int = 4):
    policy = load_policy(CACHING)
    return policy.model_copy(update={"kv": policy.kv.model_copy(update={"num_blocks": blocks,
                                                                       "block_size": block_size})})


def test_the_correct_cache_holds_the_safety_invariants_up_to_the_bounds():
    # prefix_caching/vllm_v1.yaml on an 8-block pool of 4-token blocks: prompts fill it and go past it (about
    # 30 s on one core)
    policy = small_pool()
    env = default_environment(policy, 2, 4)
    chosen = [parse_invariant(name) for name in DEFAULT_INVARIANTS]
    results = explicit.check_many(policy, None, chosen, env, 30, None)
    assert [r.verdict for r in results] == [Verdict.HOLDS_UP_TO] * 4, [r.line() for r in results]
    line = results[0].line()
    assert "2 requests, 4 iterations (bounded check, not a proof; explicit-state search on the engine: prompts " \
           "{4 (1 block), 5 (1 block + 1 token), 8 (2 blocks), 16 (fills the pool with 2 requests), 31 (the pool " \
           "less 1 token), 33 (the pool + 1 token)} tokens, outputs {1, 2, 8} tokens" in line
    assert "prompt identities {own tokens, prefix group 0, prefix group 1, prefix group 0 from its second " \
           "block}" in line
    assert results[0].states > 10_000  # the pool fills, is shared and evicted: a real search, not a trivial one


def _found_and_replayed(policy, invariant: str, knob: str, tmp_path, requests: int, iteration: int) -> dict:
    """verify finds the planted bug with a minimal counterexample (``requests``, failing at ``iteration``),
    which replays on the broken policy and not on its fix; returns the counterexample file."""
    _, (result,) = run_verify(policy, [invariant], 2, 4, timeout_s=60, out_dir=tmp_path)
    assert result.verdict is Verdict.VIOLATED, result.line()
    assert (result.requests, result.violation_step) == (requests, iteration)
    assert result.seconds < 60
    assert main(["replay", str(result.counterexample)]) == 1
    assert main(["replay", str(result.counterexample), "--policy", str(fixed_policy(policy, knob, tmp_path))]) == 0
    return json.loads(result.counterexample.read_text())


def test_uncounted_free_hits_over_commit_the_pool_with_one_request(tmp_path):
    # A prompt one token short of the pool fills it; its first decode needs a new block, so it preempts itself
    # (its blocks stay cached, free); re-admitted, its whole prompt is a hit on free blocks, counted as held:
    # the one new block over-commits the pool. Fewest requests first: one request, at iteration 3.
    doc = _found_and_replayed(UNCOUNTED, "kv_never_overcommitted", "count_evictable_hits", tmp_path, 1, 3)
    assert doc["#meta"]["source"] == "explicit-state search on the engine"
    assert doc["verdict"]["minimal"] is True and doc["environment"]["method"] == "explicit-state search on the engine"
    assert [row["prompt_tokens"] for row in doc["requests"]] == [255]


def test_the_counted_hits_fix_holds_where_the_bug_fails(tmp_path):
    _, (result,) = run_verify(fixed_policy(UNCOUNTED, "count_evictable_hits", tmp_path), ["kv_never_overcommitted"], 1, 5,
                              timeout_s=60, out_dir=tmp_path)
    assert result.verdict is Verdict.HOLDS_UP_TO, result.line()


def test_unchained_hashes_hit_a_block_of_another_context(tmp_path):
    # Request 0 (prefix group 0, two blocks) caches both blocks as it is scheduled; request 1 holds group 0's
    # second block first, with no prefix: with unchained hashes it "hits" request 0's second block in the
    # same step, KV computed after another prefix.
    doc = _found_and_replayed(UNCHAINED, "hit_only_on_identical_chain", "chained_hashes", tmp_path, 2, 0)
    assert all("prompt_runs" in row for row in doc["requests"])  # the prompt identities are recorded
    first, second = (row["prompt_runs"][0][0] for row in doc["requests"])
    assert (first, second) == (0, 16)  # group 0 from its first token, group 0 from its second block


def test_a_policy_without_caching_still_goes_to_z3(tmp_path):
    _, (result,) = run_verify(POLICIES / "vllm_v1.yaml", ["token_budget"], 1, 2, timeout_s=60, out_dir=tmp_path)
    assert type(result).__name__ == "Checked" and result.verdict is Verdict.HOLDS_UP_TO
    assert result.line().split("[")[0].rstrip() == (
        "HOLDS_UP_TO  token_budget                             1 requests, 2 iterations (bounded check, not a proof)")


def test_check_one_routes_a_caching_policy_too():
    policy = small_pool()
    env = default_environment(policy, 1, 2)
    inv, params = parse_invariant("token_budget")
    result = check_one(policy, None, inv, params, env, 30, None)
    assert isinstance(result, explicit.ExplicitChecked) and result.verdict is Verdict.HOLDS_UP_TO


def test_unbounded_is_never_proved_for_the_cache():
    policy = small_pool()
    env = default_environment(policy, 1, 2)
    inv, params = parse_invariant("token_budget")
    result = check_one(policy, None, inv, params, env, 30, None, unbounded=True)
    assert result.verdict is Verdict.HOLDS_UP_TO
    assert "no proof method covers the prefix cache yet" in result.line()


def test_timeout_is_unknown_and_says_how_far_it_got():
    policy = small_pool()
    env = default_environment(policy, 3, 6)
    inv, params = parse_invariant("seq_cap")
    (result,) = explicit.check_many(policy, None, [(inv, params)], env, 0.5, None)
    assert result.verdict is Verdict.UNKNOWN
    assert result.seconds < 5
    assert "timeout; no violation with" in result.line()


def test_vacuous_when_no_prompt_of_the_domain_can_fill_the_pool():
    # the shipped caching policy: 2,500 blocks, prompts of at most max_model_len - 1 = 16,383 tokens (1,024 blocks)
    _, (result,) = run_verify(CACHING, ["kv_never_overcommitted"], 1, 2, timeout_s=60, out_dir=None)
    assert result.verdict is Verdict.VACUOUS, result.line()


# ----------------------------------------------------------------------------------------- exactness
def brute_force(policy, xenv, invariants):
    """Every instance of the domain (all arrival steps in order, every choice, every cancel step) replayed on
    the engine: per invariant the minimal (requests, iteration) violation, and whether its trigger fired."""
    steps, us = xenv.depth, xenv.step_us
    best: list[tuple[int, int] | None] = [None] * len(invariants)
    fired = [False] * len(invariants)
    for n in range(1, xenv.requests + 1):
        for arrivals in itertools.combinations_with_replacement(range(steps), n):
            cancel_steps = [[None, *(range(a, steps) if xenv.cancellations else ())] for a in arrivals]
            for choices in itertools.product(xenv.choices(), repeat=n):
                for cancels in itertools.product(*cancel_steps):
                    specs = [RequestSpec(i, a * us, c.prompt, c.output, c.max_output, c.priority, c.tenant,
                                         cancel_us=None if x is None else x * us,
                                         content=explicit.identity_content(c.identity, c.prompt, policy.kv.block_size))
                             for i, (a, c, x) in enumerate(zip(arrivals, choices, cancels))]
                    rep = replay_fixed_clock(policy, specs, steps, us, xenv.tenants)
                    for j, (inv, params) in enumerate(invariants):
                        for t in range(steps):
                            fired[j] = fired[j] or bool(inv.triggered(IntOps, rep.ctx, t, params))
                            if not inv.holds(IntOps, rep.ctx, t, params):
                                best[j] = min(best[j] or (n, t), (n, t))
                                break
    return best, fired


EXACTNESS = ["kv_never_overcommitted", "token_budget", "seq_cap", "request_conservation", "block_pool_conservation",
             "no_referenced_block_reused", "hit_only_on_identical_chain", "cancellation_releases:0",
             "cancellation_releases:1", "decode_progress:1", "bounded_starvation:1", "no_deadlock:2", "work_conserving",
             "bounded_preemptions:0"]


@pytest.mark.parametrize("path", [UNCOUNTED, UNCHAINED], ids=["uncounted", "unchained"])
def test_the_search_finds_exactly_what_replaying_every_instance_finds(path):
    policy = load_policy(path)
    invariants = [parse_invariant(name) for name in EXACTNESS]
    env = explicit.explicit_environment(policy, default_environment(policy, 2, 2), [i for i, _ in invariants])
    env = dataclasses.replace(env, prompts=(16, 32, 257), prompt_why=("a",) * 3, outputs=(1, 3))
    best, fired = brute_force(policy, env, invariants)
    for reduce in (True, False):  # with lazy choices and forgotten dead requests, and without
        found = explicit.search(policy, env, invariants, 120, reduce=reduce)
        assert not found.timed_out
        got = [None if t.found is None else (len(t.found_specs), len(t.found.frames) - 1) for t in found.targets]
        assert got == best, (reduce, list(zip(EXACTNESS, got, best)))
        assert [t.triggered for t in found.targets] == fired


def test_without_the_reductions_the_whole_history_is_kept_and_still_exact():
    # tenant_fairness looks back to frame 0 and reads finished requests' prompts: no lazy choices, no forgotten
    # requests, the whole history in the fingerprint; tenants become a choice (it reads them)
    policy = load_policy(UNCOUNTED)
    invariants = [parse_invariant("tenant_fairness:bound=16"), parse_invariant("kv_never_overcommitted")]
    env = explicit.explicit_environment(policy, default_environment(policy, 2, 2, cancellations=False),
                                        [i for i, _ in invariants])
    env = dataclasses.replace(env, prompts=(16, 257), prompt_why=("a",) * 2, outputs=(1, 3))
    assert env.search_tenants == 2 and explicit.lookback(*invariants[0]) is None
    best, fired = brute_force(policy, env, invariants)
    found = explicit.search(policy, env, invariants, 120)
    got = [None if t.found is None else (len(t.found_specs), len(t.found.frames) - 1) for t in found.targets]
    assert got == best and [t.triggered for t in found.targets] == fired
    assert best[1] == (2, 1)  # the over-commit: a cached 1-block prompt, then one the pool + 1 token long


def test_the_state_limit_is_unknown_too(monkeypatch):
    monkeypatch.setattr(explicit, "MAX_STATES", 1500)  # one request takes about 700 states to depth 4
    policy = small_pool()
    inv, params = parse_invariant("seq_cap")
    (result,) = explicit.check_many(policy, None, [(inv, params)], default_environment(policy, 2, 4), 60, None)
    assert result.verdict is Verdict.UNKNOWN
    assert "state limit (1,500 states); no violation with up to 1 request(s) to depth 4 and with 2 request(s) " \
           "to depth " in result.line()
