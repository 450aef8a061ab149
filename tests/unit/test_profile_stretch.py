"""Profile.decode_steps_us is the closed form the engine's fast-forward uses: term for term
iteration_us(0, 0, seqs, context + seqs * j), cut at the first step starting at or after the horizon (for
every shipped profile, a profile with half-way ties, and one whose steps round to 0 and take 1 us)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from checker.profile import SPEC_DIR, Profile, load_profile

PROFILES = [*(load_profile(p) for p in sorted((SPEC_DIR / "profiles").glob("*.json"))),
            Profile.model_validate({"name": "ties", "device": "x", "pieces": [
                {"overhead_us": 0.5, "per_decode_seq_us": 0.0, "per_decode_kv_token_us": 0.5}]}),
            Profile.model_validate({"name": "zero", "device": "x", "pieces": [{"overhead_us": 0.0}]})]


def by_definition(p: Profile, seqs: int, context: int, max_steps: int, start: int, horizon: int | None) -> list[int]:
    out, t = [], start
    for j in range(1, max_steps + 1):
        if horizon is not None and t >= horizon:
            break
        out.append(p.iteration_us(0, 0, seqs, context + seqs * j))
        t += out[-1]
    return out


@settings(max_examples=300, deadline=None, database=None, derandomize=True)
@given(st.sampled_from(PROFILES), st.integers(1, 300), st.integers(0, 10**7), st.integers(0, 600),
       st.integers(0, 10**10), st.none() | st.integers(-100, 10**7))
def test_decode_steps_equal_iteration_times_step_by_step(p, seqs, context, max_steps, start, ahead):
    horizon = None if ahead is None else start + ahead
    assert p.decode_steps_us(seqs, context, max_steps, start, horizon) == by_definition(
        p, seqs, context, max_steps, start, horizon)


def old_step_us(p: Profile, prefill: int, attention: int, seqs: int, kv: int) -> int:
    """Profile.step_us as first written: piece_for, then the pydantic fields, term by term."""
    piece = p.piece_for(prefill + seqs)
    t = (piece.overhead_us + piece.per_prefill_token_us * prefill + piece.per_prefill_attention_us * attention
         + piece.per_decode_seq_us * seqs + piece.per_decode_kv_token_us * kv)
    return max(1, round(t))


@settings(max_examples=2000, deadline=None, database=None, derandomize=True)
@given(st.sampled_from(PROFILES), st.integers(0, 20_000), st.integers(0, 10**9), st.integers(0, 1024),
       st.integers(0, 10**8))
def test_step_us_equals_the_old_formula_on_many_batch_shapes(p, prefill, attention, seqs, kv):
    from checker.semantics.decision import StepDecision

    d = StepDecision(0, 0, (), (), (), (), (), (), (), (), (), prefill, seqs, attention, kv, 0, 0, 0, 0)
    assert p.step_us(d) == old_step_us(p, prefill, attention, seqs, kv) == p.iteration_us(prefill, attention, seqs, kv)


def test_step_us_equals_the_old_formula_on_the_decisions_of_a_run():
    """Every step of chat_mixed under vLLM v1, with each shipped profile (piece boundaries included)."""
    from checker.api import load_policy
    from checker.engine import simulate
    from checker.traces import load_requests

    root = SPEC_DIR
    result = simulate(load_policy(root / "policies" / "vllm_v1.yaml"),
                      load_requests(workload=root / "workloads" / "chat_mixed.yaml"), PROFILES[0], record=True)
    decisions = [d for d in result.decisions if d.scheduled]
    assert len(decisions) > 1000
    for p in PROFILES:
        for d in decisions:
            assert p.step_us(d) == old_step_us(p, d.num_prefill_tokens, d.prefill_attention, d.num_decode_seqs,
                                               d.decode_kv_tokens)
    shifted = PROFILES[0].model_copy(update={"pieces": PROFILES[-1].pieces})  # new pieces, new table
    assert shifted.step_us(decisions[0]) == old_step_us(shifted, decisions[0].num_prefill_tokens,
                                                         decisions[0].prefill_attention, decisions[0].num_decode_seqs,
                                                         decisions[0].decode_kv_tokens)
