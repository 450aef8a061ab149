"""SGLang's failure modes as planted-bug policies (issue 18): `verify` (explicit-state search on the engine, under
SGLang 0.5.23's own rules, scheduler: sglang) finds each with a minimal counterexample replayed on the engine, the
counterexample is checked into counterexamples/ and `replay` reproduces it, and the fix holds within the same bounds.
The policies are spec/policies/broken/sglang_*.yaml and their fixes spec/policies/sglang/*_fixed.yaml; what each
models, what was measured and what no knob fixes: docs/sglang-finds.md."""

from __future__ import annotations

import json

from checker.api import run_replay, run_verify
from checker.verify.replay import replay_counterexample
from checker.verify.run import Verdict
from tests.helpers import POLICIES, ROOT

BROKEN = POLICIES / "broken"
FIXED = POLICIES / "sglang"
SHIPPED = ROOT / "counterexamples"


def _verify(policy, invariant: str, requests: int, depth: int, out_dir=None, **kw):
    _, (result,) = run_verify(policy, [invariant], requests=requests, depth=depth, timeout_s=120, out_dir=out_dir,
                              **kw)
    return result


def _assert_minimal_and_shipped(result, requests: int, iteration: int) -> None:
    """VIOLATED with the minimal size (the search tries fewer requests first: no note says it could not), replayed by
    verify and again from its file; a counterexample of the same size is checked in and `replay` reproduces it."""
    assert result.verdict is Verdict.VIOLATED, result.line()
    assert (result.requests, result.violation_step) == (requests, iteration), result.line()
    assert not result.notes, result.notes  # minimality was checked
    report = replay_counterexample(result.counterexample)
    assert report.violation == report.recorded_violation == iteration
    prefix = result.counterexample.name.rsplit("__", 1)[0]
    shipped = sorted(SHIPPED.glob(f"{prefix}__*.json"))
    assert shipped, f"check in the counterexample: cp {result.counterexample} counterexamples/"
    docs = [json.loads(p.read_text()) for p in shipped]
    assert [(len(d["requests"]), d["violation"]["iteration"]) for d in docs] == [(requests, iteration)]
    text, violated = run_replay(shipped[0])
    assert violated and f"VIOLATED at iteration {iteration} (recorded: iteration {iteration})" in text


# ------------------------------------------------------------------------- 1. decode starved by chunked prefill
STARVE = dict(prompt=(4, 24), output=(1, 16))


def test_prefill_first_starves_a_decode_behind_a_chunked_prompt(tmp_path):
    """--chunked-prefill-size 8, no mixed chunk: a 24-token prompt arriving beside a decoding request runs as three
    8-token chunks on three iterations in a row, and the decode waits for all of them: decode_progress(gap=2) fails
    with two requests at iteration 2."""
    r = _verify(BROKEN / "sglang_prefill_starves_decode.yaml", "decode_progress:gap=2", 2, 8, tmp_path, **STARVE)
    _assert_minimal_and_shipped(r, 2, 2)
    decoding, chunked = r.specs
    assert decoding.prompt_len <= 8 < chunked.prompt_len and decoding.arrival_us < chunked.arrival_us


def test_mixed_chunk_lets_the_decode_run_inside_every_prefill_batch():
    """--enable-mixed-chunk: the running request decodes inside each chunk's batch (its page fits): HOLDS_UP_TO 2
    requests, 8 iterations; the broken policy's counterexample no longer fails under it."""
    r = _verify(FIXED / "prefill_starves_decode_fixed.yaml", "decode_progress:gap=2", 2, 8, **STARVE)
    assert r.verdict is Verdict.HOLDS_UP_TO, r.line()
    (shipped,) = SHIPPED.glob("sglang_prefill_starves_decode__decode_progress__*.json")
    _, violated = run_replay(shipped, FIXED / "prefill_starves_decode_fixed.yaml")
    assert not violated


# ------------------------------------------------------------------------- 2. optimistic admission, retraction
OPTIMISTIC = dict(prompt=(4, 15), output=(1, 8), cancellations=False)


def test_an_optimistic_new_token_ratio_admits_into_a_retraction(tmp_path):
    """SGLANG_INIT_NEW_TOKEN_RATIO=0.05 on an 8-page pool: a 15-token prompt is admitted beside a decoding request
    whose 8 output tokens are reserved as 0.4 of a token; both decode until the pool is full and retract_decode
    frees the later one: bounded_preemptions(times=0) fails with two requests at iteration 7."""
    r = _verify(BROKEN / "sglang_optimistic_admission.yaml", "bounded_preemptions:times=0", 2, 10, tmp_path,
                **OPTIMISTIC)
    _assert_minimal_and_shipped(r, 2, 7)
    first, second = r.specs
    assert first.prompt_len + first.max_output + second.prompt_len + second.max_output > 8 * 4  # more than the pool


def test_a_conservative_ratio_never_retracts_in_the_same_instance():
    """Ratio 1.0, no decay: the whole remaining output of every running request is reserved, and no request is
    retracted in any explored state: VACUOUS (a preemption never occurs), not a violation."""
    r = _verify(FIXED / "optimistic_admission_fixed.yaml", "bounded_preemptions:times=0", 2, 10, **OPTIMISTIC)
    assert r.verdict is Verdict.VACUOUS, r.line()
    (shipped,) = SHIPPED.glob("sglang_optimistic_admission__bounded_preemptions__*.json")
    _, violated = run_replay(shipped, FIXED / "optimistic_admission_fixed.yaml")
    assert not violated


# ------------------------------------------------------------------------- 3. head-of-line blocking
HOL = dict(prompt=(4, 16))


def test_an_unclipped_estimate_blocks_the_queue_head_behind_a_long_decode(tmp_path):
    """The default clip (4096) counts a queued request's whole max_new_tokens: a 16-token prompt with 16 output
    tokens does not fit beside a decoding request's estimate and waits for it to finish: bounded_starvation(steps=4)
    fails with two requests at iteration 4. Not a deadlock: SGLang caps max_new_tokens so every request fits an empty
    pool, and no_deadlock holds in the same instance."""
    r = _verify(BROKEN / "sglang_head_of_line.yaml", "bounded_starvation:steps=4", 2, 8, tmp_path, cancellations=False,
                **HOL)
    _assert_minimal_and_shipped(r, 2, 4)
    d = _verify(BROKEN / "sglang_head_of_line.yaml", "no_deadlock", 2, 8, cancellations=False, **HOL)
    assert d.verdict is Verdict.HOLDS_UP_TO, d.line()


def test_clipping_the_estimate_admits_the_head_at_once_and_pays_with_a_retraction(tmp_path):
    """SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION=4: bounded_starvation(steps=4) HOLDS_UP_TO 2 requests, 8 iterations (with
    cancellations); the clipped estimate over-admits, and two 16-token prompts with 32 output tokens run the pool out:
    bounded_preemptions(times=0) fails at iteration 10."""
    fixed = FIXED / "head_of_line_fixed.yaml"
    r = _verify(fixed, "bounded_starvation:steps=4", 2, 8, **HOL)
    assert r.verdict is Verdict.HOLDS_UP_TO, r.line()
    (shipped,) = SHIPPED.glob("sglang_head_of_line__bounded_starvation__*.json")
    assert not run_replay(shipped, fixed)[1]
    price = _verify(fixed, "bounded_preemptions:times=0", 2, 16, tmp_path, cancellations=False, **HOL)
    assert price.verdict is Verdict.VIOLATED and (price.requests, price.violation_step) == (2, 10), price.line()


# ------------------------------------------------------------------------- 4. priority preemption thrash
THRASH = dict(prompt=(4, 8), output=(1, 4), cancellations=False)


def test_priority_preemption_at_threshold_zero_preempts_one_request_again_and_again(tmp_path):
    """One row, threshold 0: a priority-1 request is preempted by a priority-0 arrival, re-admitted when it
    finishes, and preempted again by the next one: bounded_preemptions(times=1) fails with three requests (no two
    can do it) at iteration 3."""
    r = _verify(BROKEN / "sglang_priority_thrash.yaml", "bounded_preemptions:times=1", 3, 8, tmp_path, **THRASH)
    _assert_minimal_and_shipped(r, 3, 3)
    victim, *urgent = r.specs
    assert victim.priority == 1 and [u.priority for u in urgent] == [0, 0]


def test_a_threshold_at_the_priority_spread_never_preempts():
    """Threshold 1 with priorities 0 and 1: no request outranks another by more than it; with one row nothing is
    retracted either, so no request is preempted at all within 3 requests, 4 iterations (past the counterexample's
    iteration 3): VACUOUS. The counterexample no longer fails under it."""
    fixed = FIXED / "priority_thrash_fixed.yaml"
    r = _verify(fixed, "bounded_preemptions:times=1", 3, 4, **THRASH)
    assert r.verdict is Verdict.VACUOUS, r.line()
    (shipped,) = SHIPPED.glob("sglang_priority_thrash__bounded_preemptions__*.json")
    assert not run_replay(shipped, fixed)[1]


# ------------------------------------------------------------------------- fuzz (Hypothesis on the engine)
def test_fuzz_finds_the_prefill_first_stall_on_the_shipped_sglang_policy(tmp_path):
    """`fuzz` runs SGLang's rules too: on sglang_v05 (8192-token chunks, no mixed chunk) interactive prompts that
    arrive together make prefill batches back to back, and an interactive request's time between tokens passes
    300 ms; shrunk to 3 requests, saved and replayed from its file."""
    from checker.api import run_fuzz
    from tests.helpers import WORKLOADS

    (result,) = run_fuzz(FIXED / "sglang_v05.yaml", WORKLOADS / "chat_mixed.yaml", WORKLOADS / "chat_mixed.slo.yaml",
                         ["interactive_max_tbt"], 60, time_budget_s=120, seed=1, out_dir=tmp_path, database_dir=None)
    assert result.violated, result.line()
    assert len(result.trace) <= 4, result.trace
    text, violated = run_replay(result.counterexample)
    assert violated, text


def test_the_threshold_fixes_only_by_disabling_a_wider_spread_still_thrashes(tmp_path):
    """The same threshold 1 with clients sending priorities 0, 1 and 2 (a workload declares them): priority 0
    outranks priority 2 by more than 1, and the priority-2 request is preempted twice again (3 requests, iteration
    3): a threshold bounds which pairs preempt, not how often one request is preempted."""
    lengths = "prompt_tokens: {dist: uniform, low: 4, high: 8}, output_tokens: {dist: uniform, low: 1, high: 4}"
    classes = "\n".join(f"  - {{name: c{p}, priority: {p}, tenant: a, arrival: {{process: poisson, rate_per_s: 1}}, "
                        f"{lengths}}}" for p in (0, 1, 2))
    workload = tmp_path / "three_priorities.yaml"
    workload.write_text(f"name: three_priorities\nseed: 1\nduration_s: 1\nclasses:\n{classes}\n")
    r = _verify(FIXED / "priority_thrash_fixed.yaml", "bounded_preemptions:times=1", 3, 4, tmp_path, workload=workload,
                cancellations=False)
    assert r.verdict is Verdict.VIOLATED and (r.requests, r.violation_step) == (3, 3), r.line()
    assert not r.notes
    assert sorted(s.priority for s in r.specs) == [0, 0, 2]
