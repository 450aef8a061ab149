"""What `batchcheck liveness` must find and prove with prefix caching on (docs/liveness.md, "Prefix caching").

Every lasso is replayed on the engine (prefix + two turns) before it is reported, and with the cache the engine's
states after the prefix, one turn and two turns must have the same whole key, block pool content included
(checker.liveness.check._pool_closes); here each lasso file is replayed once more from disk.
"""

from __future__ import annotations

import json

from checker.api import run_liveness
from checker.liveness.check import PROVED, VIOLATED
from checker.verify.replay import replay_counterexample
from tests.helpers import POLICIES

CACHING = POLICIES / "prefix_caching" / "vllm_v1.yaml"
CACHE_ON = ["kv.prefix_caching.enabled=true"]


def _verdicts(report) -> dict[str, str]:
    return {r.prop: r.verdict for r in report.results}


def _replays(result) -> dict:
    replayed = replay_counterexample(result.counterexample)
    cycle, prefix = len(result.lasso.cycle), len(result.lasso.prefix)
    assert replayed.violation == replayed.recorded_violation == prefix + 2 * cycle - 1
    return json.loads(result.counterexample.read_text())


def test_strict_priority_starvation_is_still_found_with_the_cache_on(tmp_path):
    report = run_liveness(POLICIES / "strict_priority.yaml", ["eventually_served"], 2, (32,), (1, 2),
                          overrides=CACHE_ON + ["batch.max_num_seqs=1", "kv.num_blocks=4"], out_dir=tmp_path)
    (result,) = report.results
    assert result.verdict == VIOLATED and report.graph.complete
    g = report.graph
    assert g.found_choices >= g.hit_choices > 0  # the cache is exercised: high-priority arrivals hit group 0's block
    doc = _replays(result)
    assert {tuple(map(tuple, r["prompt_runs"])) for r in doc["requests"]} == {((0, 32),)}  # prefix group 0
    assert doc["environment"]["prompt_identities"] == ["g0"]
    assert doc["graph"]["cache_hit_transitions"] == g.hit_choices
    assert report.bound.after_lasso


def test_the_shipped_caching_policy_is_proved_on_a_small_instance_with_hits(tmp_path):
    report = run_liveness(CACHING, None, 2, (20, 40), (1, 2), overrides=["kv.num_blocks=6", "batch.max_num_seqs=1"],
                          out_dir=tmp_path, identities=((0, 0), (1, 0)))
    assert _verdicts(report) == {"eventually_served": PROVED, "no_livelock": PROVED, "no_deadlock": PROVED}
    g = report.graph
    assert g.complete and g.states > 100 and g.hit_choices > g.choices_run // 2
    assert report.bound.bound.iterations == 2 and report.bound.engine_iteration is not None
    assert not list(tmp_path.iterdir())


def test_a_head_larger_than_the_pool_deadlocks_with_the_cache_and_rejecting_it_proves_all_three(tmp_path):
    small = ["kv.num_blocks=4"]
    report = run_liveness(CACHING, None, 2, (32, 80), (1,), overrides=small, out_dir=tmp_path)
    verdicts = _verdicts(report)
    assert verdicts["no_deadlock"] == VIOLATED and verdicts["eventually_served"] == VIOLATED
    assert report.graph.found_choices > 0
    for r in report.results:
        if r.verdict == VIOLATED:
            _replays(r)
    fixed = run_liveness(CACHING, None, 2, (32, 80), (1,), overrides=small + ["admission.reject_never_fits=true"],
                         out_dir=tmp_path / "fixed")
    assert _verdicts(fixed) == {"eventually_served": PROVED, "no_livelock": PROVED, "no_deadlock": PROVED}


def test_the_cache_turns_recompute_thrash_into_a_deadlock(tmp_path):
    """thrash_recompute without the cache: a prompt larger than the pool is admitted chunk by chunk, preempts
    itself and starts over (a livelock). With the cache its freed blocks stay cached, so its next admission finds
    them as a hit that the admission check counts against the pool (adopting free cached blocks takes them): it is
    never admitted again (a deadlock). A found-but-never-adopted hit decides here."""
    thrash = POLICIES / "broken" / "thrash_recompute.yaml"
    plain = run_liveness(thrash, ["no_livelock"], 1, (160,), (1,), out_dir=tmp_path / "plain")
    assert _verdicts(plain) == {"no_livelock": VIOLATED}
    cached = run_liveness(thrash, ["no_livelock", "no_deadlock"], 1, (160,), (1,), overrides=CACHE_ON,
                          out_dir=tmp_path / "cached", identities=((0, 0),))
    assert _verdicts(cached) == {"no_livelock": PROVED, "no_deadlock": VIOLATED}
    assert cached.graph.found_choices > 0 and cached.graph.hit_choices == 0
    _replays(cached.results[1])
