"""Property tests on the engine: conservation, budgets, KV safety, determinism."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings

from checker.engine import simulate
from checker.profile import load_profile
from checker.semantics.state import TERMINAL
from checker.strategies import small_scenarios
from checker.traces import RequestSet
from checker.frames import TraceContext, frame_from_engine, params_from_engine
from checker.smt.ops import IntOps
from invariants import CATALOGUE
from tests.helpers import drive

SETTINGS = dict(deadline=None, derandomize=True, database=None, suppress_health_check=[HealthCheck.too_slow])
PROFILE = load_profile(None)


@settings(max_examples=300, **SETTINGS)
@given(sc=small_scenarios(max_requests=6))
def test_conservation_and_budgets_hold_after_every_step(sc):
    frames, ctx = [], None
    for k, (_, s, d) in enumerate(drive(sc, max_steps=60)):
        frames.append(frame_from_engine(s, d))
        ctx = TraceContext(sc.policy, params_from_engine(s), frames)
        for name in ("request_conservation", "token_budget", "seq_cap", "prompt_fully_computed"):
            assert CATALOGUE[name].holds(IntOps, ctx, k), f"{name} broken at step {k}"
        if sc.policy.kv.check_allocation:
            assert CATALOGUE["kv_never_overcommitted"].holds(IntOps, ctx, k), f"KV over-committed at step {k}"


@settings(max_examples=150, **SETTINGS)
@given(sc=small_scenarios(max_requests=6))
def test_every_request_ends_finished_rejected_cancelled_or_reported_stuck(sc):
    result = simulate(sc.policy, RequestSet(sc.specs, ["c"], ["a", "b"], "generated"), PROFILE)
    ended = sum(r.status in TERMINAL for r in result.state.requests)
    assert ended + len(result.stuck) == len(sc.specs)
    summary = result.summary()["overall"]
    assert summary["finished"] + summary["rejected"] + summary["cancelled"] + summary["unfinished"] == len(sc.specs)


@settings(max_examples=60, **SETTINGS)
@given(sc=small_scenarios(max_requests=6))
def test_simulation_is_deterministic(sc):
    rs = RequestSet(sc.specs, ["c"], ["a", "b"], "generated")
    a = simulate(sc.policy, rs, PROFILE, record=True)
    b = simulate(sc.policy, rs, PROFILE, record=True)
    assert a.decisions == b.decisions
    assert a.state.snapshot() == b.state.snapshot()
