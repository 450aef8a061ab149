"""`verify` on policies with prefix caching by z3 bounded model checking over the pool encoding
(checker/verify/cache_bmc.py, ``cache_method="z3"``).

The planted bugs (spec/policies/broken/vllm_v1_cache_*.yaml) on a small pool are found with minimal counterexamples
that replay on the engine (and not on the fix), the fix holds within the bounds, and a replay that disagrees with the
solver is an InternalError (exit 101), never a hidden verdict. The planted bugs' own 16-block pools are beyond what
z3 decides quickly with this encoding (docs/benchmarks.md); the explicit-state search (the default) finds them.
"""

from __future__ import annotations

import json

import pytest

from checker.api import load_policy
from checker.cli import main
from checker.errors import InternalError
from checker.verify import cache_bmc
from checker.verify.env import default_environment
from checker.verify.run import Verdict, parse_invariant
from tests.helpers import POLICIES

UNCHAINED = POLICIES / "broken" / "vllm_v1_cache_unchained_hashes.yaml"
UNCOUNTED = POLICIES / "broken" / "vllm_v1_cache_uncounted_hits.yaml"
CACHING = POLICIES / "prefix_caching" / "vllm_v1.yaml"


def small(path, blocks: int = 4, block_size: int = 2, **knobs):
    policy = load_policy(path)
    cache = policy.kv.prefix_caching.model_copy(update=knobs)
    return policy.model_copy(update={"kv": policy.kv.model_copy(update={"num_blocks": blocks, "block_size": block_size,
                                                                       "prefix_caching": cache})})


def write(policy, folder, name: str):
    path = folder / f"{name}.yaml"
    path.write_text(json.dumps(policy.model_dump(mode="json")))  # JSON is YAML
    return path


def check(policy, invariant: str, requests: int, depth: int, out_dir, timeout_s: float = 120):
    env = default_environment(policy, requests, depth, cancellations=False)
    (result,) = cache_bmc.check_many(policy, None, [parse_invariant(invariant)], env, timeout_s, out_dir)
    return result


def test_z3_finds_the_unchained_hash_hit_and_the_counterexample_replays(tmp_path):
    # Two requests arrive together: prefix group 1 (4 tokens, 2 blocks) is admitted first and caches both blocks;
    # group 1 from its second block (3 tokens) is admitted in the same step and, hashing a block's own tokens only,
    # hits the first request's block 1 at its block 0: the same tokens after a different prefix.
    policy = small(UNCHAINED)
    result = check(policy, "hit_only_on_identical_chain", 2, 1, tmp_path)
    assert result.verdict is Verdict.VIOLATED, result.line()
    assert (result.requests, result.violation_step) == (2, 0)
    assert "z3 bounded model checking with the block pool" in result.line()
    doc = json.loads(result.counterexample.read_text())
    assert doc["#meta"]["source"] == cache_bmc.METHOD and doc["verdict"]["minimal"] is True
    assert any(row.get("prompt_runs") for row in doc["requests"])  # the identities travel with the requests
    assert main(["replay", str(result.counterexample)]) == 1
    fixed = write(small(UNCHAINED, chained_hashes=True).model_copy(update={"name": "fixed"}), tmp_path, "fixed")
    assert main(["replay", str(result.counterexample), "--policy", str(fixed)]) == 0


def test_z3_finds_the_uncounted_free_hits_over_commit_with_one_request(tmp_path):
    # On a 2-block pool of 2-token blocks: a 4-token prompt fills the pool; its first decode needs a third block, so
    # it preempts itself (its blocks stay cached, free); re-admitted, its prompt's first block is a hit on a free
    # block counted as held: the pool is over-committed. Fewest requests first: one, at iteration 2.
    result = check(small(UNCOUNTED, blocks=2), "kv_never_overcommitted", 1, 4, tmp_path)
    assert result.verdict is Verdict.VIOLATED, result.line()
    assert (result.requests, result.violation_step) == (1, 2)
    assert main(["replay", str(result.counterexample)]) == 1
    fixed = write(small(UNCOUNTED, blocks=2, count_evictable_hits=True).model_copy(update={"name": "fixed"}), tmp_path,
                  "fixed")
    assert main(["replay", str(result.counterexample), "--policy", str(fixed)]) == 0


def test_the_shipped_caching_policy_holds_on_a_small_pool(tmp_path):
    result = check(small(CACHING, blocks=2), "kv_never_overcommitted", 1, 3, tmp_path)
    assert result.verdict is Verdict.HOLDS_UP_TO, result.line()


def test_the_chained_fix_holds_where_the_bug_fails(tmp_path):
    result = check(small(UNCHAINED, chained_hashes=True), "hit_only_on_identical_chain", 2, 1, tmp_path)
    assert result.verdict is Verdict.HOLDS_UP_TO, result.line()
    assert "bounded check, not a proof; z3 bounded model checking with the block pool" in result.line()


def test_a_replay_that_disagrees_with_the_solver_is_an_internal_error(tmp_path, monkeypatch):
    from checker.verify import run

    fixed = small(UNCHAINED, chained_hashes=True)
    real = run.replay_fixed_clock
    monkeypatch.setattr(run, "replay_fixed_clock", lambda policy, *a, **k: real(fixed, *a, **k))
    with pytest.raises(InternalError, match="engine and solver disagree"):
        check(small(UNCHAINED), "hit_only_on_identical_chain", 2, 1, tmp_path)


def test_run_verify_routes_a_caching_policy_by_its_method(tmp_path):
    from checker.api import run_verify

    path = write(small(UNCHAINED), tmp_path, "unchained_small")
    _, (z3_result,) = run_verify(path, ["hit_only_on_identical_chain"], 2, 1, timeout_s=120, out_dir=tmp_path,
                                 cancellations=False, cache_method="z3")
    _, (explicit_result,) = run_verify(path, ["hit_only_on_identical_chain"], 2, 1, timeout_s=120, out_dir=tmp_path,
                                       cancellations=False)
    assert z3_result.verdict is explicit_result.verdict is Verdict.VIOLATED
    assert (z3_result.requests, z3_result.violation_step) == (explicit_result.requests, explicit_result.violation_step)
    assert "explicit-state search on the engine" in explicit_result.line()
    from checker.errors import InputError
    with pytest.raises(InputError, match="cache-method"):
        run_verify(path, ["hit_only_on_identical_chain"], 1, 1, out_dir=None, cache_method="bogus")


# ----------------------------------------------------------------------------------------- diff
def test_diff_of_caching_policies_finds_the_regression(tmp_path):
    """diff accepts policies with prefix caching: each side is verified (explicit search), and the breaking side's
    counterexample is replayed under the other policy on the engine."""
    from checker.api import run_diff
    from checker.exitcodes import ExitCode

    old = write(small(UNCOUNTED, blocks=2, count_evictable_hits=True).model_copy(update={"name": "counted"}), tmp_path,
                "counted")
    new = write(small(UNCOUNTED, blocks=2).model_copy(update={"name": "uncounted"}), tmp_path, "uncounted")
    report = run_diff(old, new, invariants=["kv_never_overcommitted"], requests=1, depth=4, timeout_s=60,
                      out_dir=tmp_path, audit=False)
    assert report.exit_code is ExitCode.VIOLATED, report.headline()
    (prop,) = report.regressions
    assert prop.new_worse is not None and prop.old_worse is None


def test_the_product_encoding_with_the_pool_finds_a_replayed_witness():
    """The z3 product (checker/diff/product.py) over two caching policies on shared symbolic arrivals with prompt
    identities: unchained hashes break hit_only_on_identical_chain where chained ones keep it; the witness is
    replayed under both on the engine (inside ``witness``)."""
    from checker.diff.product import witness

    keeps, breaks = small(UNCHAINED, chained_hashes=True), small(UNCHAINED)
    env = default_environment(breaks, 2, 1, cancellations=False)
    search = witness(keeps, breaks, parse_invariant("hit_only_on_identical_chain")[0], {}, env, 240)
    assert search.status == "found", search
    assert (len(search.witness.specs), search.witness.violation) == (2, 0)
