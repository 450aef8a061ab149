"""lookahead_fits on engine traces: where the lookahead slots are reserved (vLLM, the default) every request scheduled
in a step holds the blocks of its computed tokens and its lookahead slots, with speculative decoding alone and with
async scheduling, under preemption pressure, so the invariant's count is the blocks in use; left unreserved, requests
lack them. Without lookahead slots the invariant is kv_never_overcommitted."""

from __future__ import annotations

import random

import pytest

from checker.api import load_policy
from checker.requests import RequestSpec
from checker.smt.ops import IntOps
from checker.verify.replay import replay_fixed_clock
from invariants.catalogue import CATALOGUE, _kv_with_lookahead
from tests.helpers import POLICIES


def policy(method: str, k: int, blocks: int, in_flight: int, reserve: bool = True):
    base = load_policy(POLICIES / "vllm_v1.yaml")
    return base.model_validate({**base.model_dump(mode="json"), "max_model_len": 512,
                                "kv": {**base.kv.model_dump(mode="json"), "num_blocks": blocks},
                                "speculative": {"method": method, "num_tokens": k, "reserve_lookahead": reserve},
                                "pipeline": {"in_flight": in_flight}})


def trace(seed: int) -> list[RequestSpec]:
    rng = random.Random(seed)
    out = []
    for i in range(10):
        o = rng.randint(1, 60)
        out.append(RequestSpec(i, rng.randint(0, 8) * 10_000, rng.randint(1, 200), o, o,
                               accepted=tuple(rng.randint(0, 6) for _ in range(o))))
    out.sort(key=lambda s: s.arrival_us)
    return [RequestSpec(i, s.arrival_us, s.prompt_len, s.output_len, s.max_output, accepted=s.accepted)
            for i, s in enumerate(out)]


def lacking(p, seed: int) -> tuple[int, int]:
    """(frames where a scheduled request lacks lookahead blocks, preemptions) over the trace's run."""
    replay = replay_fixed_clock(p, trace(seed), 200, 10_000)
    short = sum(_kv_with_lookahead(IntOps, replay.ctx, t) != f.kv_used for t, f in enumerate(replay.frames))
    return short, sum(r.num_preemptions for r in replay.state.requests)


@pytest.mark.parametrize("in_flight", [0, 1])
@pytest.mark.parametrize("method", ["draft", "eagle", "mtp"])
def test_reserved_lookahead_slots_are_always_held(method, in_flight):
    preempted = 0
    for seed in range(8):
        for k in (1, 3, 5):
            short, pre = lacking(policy(method, k, 24 + 4 * (seed % 3), in_flight), seed)
            assert short == 0, (seed, k)
            preempted += pre
    assert preempted > 20  # under pressure


@pytest.mark.parametrize("in_flight", [0, 1])
def test_unreserved_lookahead_slots_are_lacking(in_flight):
    assert sum(lacking(policy("eagle", 4, 200, in_flight, reserve=False), seed)[0] for seed in range(4)) > 0


def test_without_lookahead_slots_it_is_kv_never_overcommitted():
    p = policy("ngram", 3, 24, 0)
    replay = replay_fixed_clock(p, trace(1), 200, 10_000)
    for t in range(len(replay.frames)):
        assert _kv_with_lookahead(IntOps, replay.ctx, t) is replay.frames[t].kv_used
        assert CATALOGUE["lookahead_fits"].holds(IntOps, replay.ctx, t) == \
            CATALOGUE["kv_never_overcommitted"].holds(IntOps, replay.ctx, t)
