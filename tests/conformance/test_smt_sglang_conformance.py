"""The SGLang encoding (checker/smt/sglang.py) equals the engine's step under SGLang's rules (radix cache off), field by
field: on ints over many generated states, and through z3 (every input pinned, a real solver query, the model read
back). Generated policies reach chunked continuation, mixed chunk, lof and priority order, retraction and its
re-queue, aborts of running requests, the ratio's decay, re-estimate and reset; the ratio is compared within the
encoding's float bound, and a step whose adder meets an ambiguous comparison is counted, not compared."""

from __future__ import annotations

import random
from collections import Counter
from fractions import Fraction

import pytest

from checker.errors import InputError
from checker.policy import Policy
from checker.smt.sglang_conformance import (Z3SGLangStep, differences, drive, int_outputs, random_policy,
                                            random_specs)

STEP_US = 1000


def _run(seed: int, scenarios: int, evaluate, max_steps: int = 30, most: int | None = None) -> Counter:
    rng = random.Random(seed)
    seen: Counter = Counter()
    for case in range(scenarios):
        policy = random_policy(rng)
        specs = random_specs(rng, policy, rng.randint(2, 5 if most is None else 3), STEP_US)
        ev = evaluate(policy, specs)
        for k, (before, after, scheduled) in enumerate(drive(policy, specs, STEP_US, max_steps)):
            got = ev(before)
            seen["steps"] += 1
            if got["inexact"]:
                seen["inexact"] += 1
                continue
            diff = differences(after, got, scheduled)
            assert not diff, f"scenario {case} ({policy.model_dump(exclude_defaults=True)}, {specs}) step {k}: {diff[:6]}"
            seen["retractions"] += sum(int(after[f"slot{i}.num_preemptions"]) > before.slots[i][8]
                                       for i in range(len(specs)))
            seen["chunked"] += after["chunked"] >= 0
            seen["aborting"] += sum(after[f"slot{i}.aborting"] for i in range(len(specs)))
            seen["decayed"] += after["ratio"] < policy.sglang.init_ratio
            seen["mixed"] += policy.sglang.mixed_chunk and sum(scheduled.values()) > max(scheduled.values(), default=0)
    return seen


def test_int_evaluation_of_the_sglang_encoding_equals_the_engine_step():
    seen = _run(3, 220, lambda policy, specs: lambda c: int_outputs(policy, c))
    assert seen["steps"] >= 3000, seen
    assert seen["inexact"] <= seen["steps"] // 100, seen  # the bound rarely makes a comparison ambiguous
    for rule in ("retractions", "chunked", "aborting", "decayed", "mixed"):
        assert seen[rule] > 0, f"no state reached {rule}: {seen}"


def test_z3_evaluation_of_the_sglang_encoding_equals_the_engine_step():
    most = 28  # random_specs: max_output <= 24 + 4

    def z3(policy, specs):
        return Z3SGLangStep(policy, len(specs), 1, most).evaluate

    seen = _run(5, 14, z3, max_steps=12, most=most)
    assert seen["steps"] >= 120, seen


def _policy(**over) -> Policy:
    data = {"scheduler": "sglang", "max_model_len": 64, "kv": {"block_size": 4, "num_blocks": 12},
            "batch": {"max_num_seqs": 2, "max_num_batched_tokens": 8, "phase_mode": "prefill_first"},
            "chunking": {"enabled": True}, "preemption": {"victim": "fewest_generated"}}
    for key, value in over.items():
        data[key] = {**data.get(key, {}), **value}
    return Policy.model_validate(data)


@pytest.mark.parametrize("over, field", [
    ({"sglang": {"radix_cache": True}}, "sglang.radix_cache"),
    ({"queue": {"order": "priority"}, "preemption": {"triggers": ["kv_growth_fails", "priority_inversion"]}},
     "preemption.triggers"),
])
def test_what_the_encoding_does_not_cover_is_refused_by_name(over, field):
    with pytest.raises(InputError) as e:
        Z3SGLangStep(_policy(**over), 2, 1, 8)
    assert field in str(e.value)


@pytest.mark.parametrize("ratio, age, pages, inexact", [(Fraction(1, 2), 1, 10, True), (Fraction(1), 0, 11, False),
                                                        (Fraction(1), 1, 11, True), (Fraction(1, 2), 1, 11, False)])
def test_a_budget_comparison_on_its_boundary_is_inexact_unless_the_ratio_is_exactly_one(ratio, age, pages, inexact):
    """A running request reserves 2 tokens x the ratio; a waiting one needs 4 + 1 + a page of the free tokens less
    that: exactly on the boundary at ratio 1/2 with 7 free (or 1 with 8), which the engine's float may cross either way
    (after a re-estimate the float is within a rounding of the exact value): inexact. A ratio of exactly 1 (age 0)
    makes every float an integer, and a comparison a token away is decided."""
    from checker.semantics.state import Status
    from checker.smt.sglang_conformance import SGLangCaptured

    policy = _policy(kv={"block_size": 1, "num_blocks": pages}, sglang={"max_prefill_tokens": 16})
    running = (int(Status.RUNNING), 0, 3, 1, 3, 0, 1, 0, 0, -1, 1, 0, 0)
    waiting = (int(Status.WAITING), 0, 0, 0, 0, 0, 0, 0, 0, -1, 2, 0, 0)
    c = SGLangCaptured(params=((0, 2, 3, 3, 0, 0), (0, 4, 1, 1, 0, 0)), slots=(running, waiting),
                       globals=(-1, False, False, True, ratio, age, 2), next_seq=2, step=3, counters=(0,), now_us=0,
                       cancels=(False, False))
    got = int_outputs(policy, c)
    assert bool(got["inexact"]) is inexact
    assert int(got["slot1.scheduled"]) == (4 if (ratio, pages) == (Fraction(1, 2), 11) else 0)  # 6 < 6 is false


def test_no_inexact_step_within_the_bounds_by_arithmetic_exactly_where_no_retraction_fits():
    """statically_exact: two 16-token prompts growing a token an iteration fit 12 pages of 4 for 6 iterations (no
    retraction, so the ratio only decays from 0.7, never near an integer multiple): exact; for 9 iterations they may
    not; at a ratio of 1/2 reserved totals are integers: never exact by arithmetic."""
    from checker.smt.sglang import statically_exact

    policy = _policy(sglang={"clip_max_new_tokens": 4})
    assert statically_exact(policy, 2, 6, 16, 16)
    assert not statically_exact(policy, 2, 9, 16, 16)
    assert not statically_exact(_policy(sglang={"init_new_token_ratio": 0.5, "min_new_token_ratio_factor": 1.0}),
                                2, 3, 4, 16)
