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
