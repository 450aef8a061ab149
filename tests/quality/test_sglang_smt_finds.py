"""SGLang's planted-bug policies found by z3 (`verify --cache-method z3`: bounded model checking over the SGLang
encoding, checker/smt/sglang.py, radix cache off) with minimal counterexamples replayed on the engine; what the
encoding does not cover refused by name. The slower finds and the fixes' verdicts are measured by
bench/sglang_smt_finds.py (docs/benchmarks.md, section smt18)."""

from __future__ import annotations

import pytest

from checker.api import run_verify
from checker.errors import InputError
from checker.verify.replay import replay_counterexample
from checker.verify.run import Verdict
from tests.helpers import POLICIES

BROKEN = POLICIES / "broken"


def _z3(policy, invariant: str, requests: int, depth: int, out_dir, **kw):
    _, (result,) = run_verify(policy, [invariant], requests=requests, depth=depth, timeout_s=120, out_dir=out_dir,
                              cache_method="z3", **kw)
    return result


def _assert_found(result, requests: int, iteration: int) -> None:
    assert result.verdict is Verdict.VIOLATED, result.line()
    assert (result.requests, result.violation_step) == (requests, iteration), result.line()
    assert not result.notes, result.notes  # fewer requests were excluded: minimal
    assert "SGLang" in result.method
    report = replay_counterexample(result.counterexample)
    assert report.violation == report.recorded_violation == iteration


def test_z3_finds_decode_starved_behind_a_chunked_prompt(tmp_path):
    """--chunked-prefill-size 8, no mixed chunk: the decode waits while a long prompt's chunks run: decode_progress
    (gap=2) fails with two requests at iteration 2, as the explicit-state search finds it."""
    r = _z3(BROKEN / "sglang_prefill_starves_decode.yaml", "decode_progress:gap=2", 2, 8, tmp_path,
            prompt=(4, 24), output=(1, 16))
    _assert_found(r, 2, 2)
    decoding, chunked = r.specs
    assert chunked.prompt_len > 8 and decoding.arrival_us <= chunked.arrival_us


def test_mixed_chunk_holds_up_to_past_the_starvation_with_every_path_exact():
    """--enable-mixed-chunk: the running request decodes inside each chunk's batch: HOLDS_UP_TO 2 requests, 4
    iterations (past the broken policy's iteration 2), decided because no reachable step's budget comparison is
    within the float bound of the ratio."""
    r = _z3(POLICIES / "sglang" / "prefill_starves_decode_fixed.yaml", "decode_progress:gap=2", 2, 4, None,
            prompt=(4, 24), output=(1, 16))
    assert r.verdict is Verdict.HOLDS_UP_TO, r.line()
    assert any("every path within the bounds exact" in note for note in r.notes), r.notes


def test_z3_finds_the_unclipped_estimate_blocking_the_queue_head(tmp_path):
    """The default clip (4096) reserves a queued request's whole max_new_tokens: bounded_starvation(steps=4) fails with
    two requests at iteration 4."""
    r = _z3(BROKEN / "sglang_head_of_line.yaml", "bounded_starvation:steps=4", 2, 8, tmp_path, cancellations=False,
            prompt=(4, 16))
    _assert_found(r, 2, 4)


def test_clipping_the_estimate_holds_up_to_past_the_block_decided_by_arithmetic():
    """SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION=4 (with cancellations): bounded_starvation(steps=4) HOLDS_UP_TO 2 requests,
    6 iterations; no retraction fits in 6 iterations, so the ratio only decays and no budget comparison is near its
    float bound (statically_exact): decided without the inexact query."""
    r = _z3(POLICIES / "sglang" / "head_of_line_fixed.yaml", "bounded_starvation:steps=4", 2, 6, None, prompt=(4, 16))
    assert r.verdict is Verdict.HOLDS_UP_TO, r.line()


@pytest.mark.parametrize("policy, field", [
    ("broken/sglang_priority_thrash.yaml", "preemption.triggers"),  # priority preemption
])
def test_what_the_sglang_encoding_does_not_cover_is_refused_by_name(policy, field, tmp_path):
    with pytest.raises(InputError) as e:
        _z3(POLICIES / policy, "bounded_preemptions:times=1", 2, 4, tmp_path)
    assert field in str(e.value)


def test_no_proof_method_covers_sglang_yet(tmp_path):
    with pytest.raises(InputError) as e:
        run_verify(BROKEN / "sglang_head_of_line.yaml", ["no_deadlock"], requests=2, depth=2, cache_method="z3",
                   unbounded=True, out_dir=tmp_path)
    assert "--unbounded" in str(e.value)
