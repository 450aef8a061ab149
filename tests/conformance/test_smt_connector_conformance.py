"""The symbolic step with a KV connector (checker/smt/encode.py, checker/semantics/transfer.py) equals the engine's
step, field by field.

Generated scenarios: small policies (every phase mode a connector allows) with a connector section (every kind,
both holders_first values, the three release rules, reserve_inflight on and off), requests with external hits
(none, a prefix, the whole prompt), load latencies and send delays (hung ones too), cancellations during loads and
tight pools. On every step, the encoding evaluated with IntOps equals the engine: every request's fields, its
transfer step, its place in the holders' queue and whether it was admitted as a load in this step, the loads in
flight, the globals; and on a smaller number of steps evaluated by z3 (every input pinned, a real solver query, the
model read back).
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from checker.errors import InputError
from checker.policy import PhaseMode, Policy
from checker.semantics.state import Status
from checker.smt.conformance import Z3Step, int_outputs
from checker.requests import RequestSpec
from checker.strategies import Scenario, small_policies
from tests.helpers import assert_section_off_builds_the_same_queries, compare_steps

SETTINGS = dict(deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
KINDS = ("offload", "decode_node", "prefill_node", "both")
LOADING_MODES = [PhaseMode.DECODE_FIRST, PhaseMode.PREFILL_FIRST, PhaseMode.STATIC]  # no loads in the mixed pass


@st.composite
def connector_policies(draw: st.DrawFn) -> Policy:
    kind = draw(st.sampled_from(KINDS))
    loads = kind != "prefill_node"
    data = draw(small_policies(LOADING_MODES if loads else None)).model_dump(mode="json")
    release = draw(st.sampled_from(["on_completion", "immediate", "deadline"]))
    data["connector"] = {"kind": kind, "holders_first": draw(st.booleans()), "reserve_inflight": draw(st.booleans()),
                         "release": release,
                         "release_deadline_steps": draw(st.integers(1, 4)) if release == "deadline" else None}
    if loads and data["queue"]["order"] == "tenant_fair":  # refused by the encoding with holders_first (see below)
        data["connector"]["holders_first"] = False
    if draw(st.sampled_from([True, True, False])):  # room for the requests to queue (the caps reject most)
        data["admission"].update(max_inflight=None, max_queue_len=None, max_queued_tokens=None)
    if draw(st.sampled_from([True, True, False])):  # KV pressure: a pool of a few blocks of a few tokens
        data["kv"].update(num_blocks=draw(st.integers(3, 12)), block_size=draw(st.sampled_from([1, 2, 4])))
        data["preemption"]["triggers"] = sorted(set(data["preemption"]["triggers"]) | {"kv_growth_fails"})
    return Policy.model_validate(data)


@st.composite
def connector_scenarios(draw: st.DrawFn, max_requests: int = 5) -> Scenario:
    """Requests that mostly load (a prefix or the whole prompt), with latencies of 1..4 steps or never, sends of
    0..3 steps or never, arriving close together, some cancelled a few steps later (during their loads)."""
    policy = draw(connector_policies())
    step_us = 1000
    n = draw(st.integers(1, max_requests))
    arrivals = sorted(draw(st.lists(st.integers(0, 4), min_size=n, max_size=n)))
    longest = max(1, min(policy.max_model_len - 1, 24))
    specs = []
    for rid, at in enumerate(arrivals):
        prompt = draw(st.integers(1, longest))
        output = draw(st.integers(1, 10))
        cancel = draw(st.none() | st.integers(1, 6))
        specs.append(RequestSpec(
            rid=rid, arrival_us=at * step_us, prompt_len=prompt, output_len=output,
            max_output=output + draw(st.integers(0, 3)), priority=draw(st.integers(0, 3)),
            tenant=draw(st.integers(0, 1)), cls=0, cancel_us=None if cancel is None else (at + cancel) * step_us,
            external_tokens=draw(st.sampled_from([0, 0, prompt, prompt]) | st.integers(0, prompt)),
            load_steps=draw(st.integers(1, 4) | st.sampled_from([None, 1])),
            send_steps=draw(st.integers(0, 3) | st.none())))
    return Scenario(policy, specs, 2, step_us)


# what the generated steps must have exercised (so that the suite is not vacuous)
SEEN: dict[str, int] = {}


def _note(sc: Scenario, before, after, d) -> None:
    loading = sum(r.status is Status.LOADING for r in after.requests)
    was_loading = {i for i, slot in enumerate(before.slots) if slot[0] == int(Status.LOADING)}
    for what, happened in (
            ("steps", True), ("load", bool(d.loads)), ("loading", loading > 0),
            ("holders' queue", bool(after.holders)), ("promoted", any(rid in was_loading for rid in d.admitted)),
            ("abort during load", any(rid in was_loading for rid in d.cancelled)),
            ("held", bool(after.holding)), ("pinned", any(r.status is Status.FINISHED for r in after.holding)),
            ("released", bool(d.released)), ("preemption", bool(d.preempted)),
            ("full pool", after.kv_used >= sc.policy.kv.num_blocks)):
        SEEN[what] = SEEN.get(what, 0) + int(happened)


def _compare(sc: Scenario, evaluate, max_steps: int) -> int:
    return compare_steps(sc, evaluate, max_steps, _note)


@settings(max_examples=300, **SETTINGS)
@given(sc=connector_scenarios())
def test_int_evaluation_of_the_connector_encoding_equals_the_engine_step(sc):
    SEEN["scenarios"] = SEEN.get("scenarios", 0) + 1
    _compare(sc, lambda before: int_outputs(sc.policy, before), 30)


def test_the_generated_steps_exercise_the_connector_states():
    """After the test above (same module, run in order): loads, holders, promotions, aborts during loads, held and
    pinned blocks and their release, preemption and a full pool all occurred on many steps."""
    if not SEEN:
        pytest.skip("run with the test above")
    assert SEEN["steps"] >= 2000, SEEN
    for what in ("load", "loading", "holders' queue", "promoted", "abort during load", "held", "pinned", "released",
                 "preemption", "full pool"):
        assert SEEN[what] >= 10, SEEN


def test_z3_evaluation_of_the_connector_encoding_equals_the_engine_step():
    checked: list[int] = []

    @settings(max_examples=24, **SETTINGS)
    @given(sc=connector_scenarios(max_requests=3))
    def one_scenario(sc):
        checked.append(_compare(sc, Z3Step(sc.policy, len(sc.specs), sc.num_tenants).evaluate, 10))

    one_scenario()
    assert sum(checked) >= 100, f"only {sum(checked)} steps checked against z3"


def _pinned(connector: dict, specs: list[RequestSpec], **policy) -> Scenario:
    data = {"name": "pinned", "max_model_len": 1024, "kv": {"num_blocks": 10, "block_size": 16},
            "batch": {"max_num_seqs": 4, "max_num_batched_tokens": 256}, **policy, "connector": connector}
    return Scenario(Policy.model_validate(data), specs, 1, 1000)


def _spec(rid: int, at: int, prompt: int, output: int, **kw) -> RequestSpec:
    return RequestSpec(rid, at * 1000, prompt, output, output, **kw)


# Hand-written scenarios for rules the generated ones reach rarely, each checked with IntOps and with z3.
PINNED = {
    # prefill_first: the decode of a running request is not yet scheduled when the waiting pass starts a load; it
    # needs a block, but it is no in-flight prefill: the load fits exactly (counting it as one would refuse it)
    "reservation excludes a pending decode": _pinned(
        {"kind": "offload", "reserve_inflight": True},
        [_spec(0, 0, 2, 4), _spec(1, 1, 6, 1, external_tokens=6, load_steps=1)], max_model_len=32,
        batch={"max_num_seqs": 4, "max_num_batched_tokens": 16, "phase_mode": "prefill_first"},
        admission={"reserve_full_prompt": False}, kv={"num_blocks": 4, "block_size": 2},
        preemption={"triggers": ["kv_growth_fails"]}),
    # test_connector_engine_finds.HOLD_AND_WAIT: the loaded request behind one that cannot fit (in the queue's
    # order), and the holders scanned first
    "hold and wait in the queue order": _pinned(
        {"kind": "decode_node", "holders_first": False},
        [_spec(0, 0, 96, 4, priority=1, external_tokens=64, load_steps=2), _spec(1, 1, 112, 4)],
        queue={"order": "priority"}),
    "holders scanned first": _pinned(
        {"kind": "decode_node", "holders_first": True},
        [_spec(0, 0, 96, 4, priority=1, external_tokens=64, load_steps=2), _spec(1, 1, 112, 4)],
        queue={"order": "priority"}),
    # priority inversion keeps the scan going with every seat taken: a load still needs a free seat, and preempts
    # nobody for one
    "a load needs a free seat": _pinned(
        {"kind": "offload"}, [_spec(0, 0, 32, 6, priority=1), _spec(1, 1, 32, 2, priority=0, external_tokens=32)],
        queue={"order": "priority"}, batch={"max_num_seqs": 1, "max_num_batched_tokens": 64},
        preemption={"triggers": ["kv_growth_fails", "priority_inversion"]}),
    # two holders under a priority order: the holders' queue in key order, not in load order
    "holders in key order": _pinned(
        {"kind": "offload"},
        [_spec(0, 0, 32, 2, priority=2, external_tokens=32, load_steps=3),
         _spec(1, 1, 32, 2, priority=0, external_tokens=16, load_steps=1), _spec(2, 1, 16, 2)],
        queue={"order": "priority"}, batch={"max_num_seqs": 2, "max_num_batched_tokens": 48}),
    # aborts during loads: a lost load under a deadline, a reported one (freed at once), one aborted before its
    # report under on_completion (freed by the report at the end of its step)
    "aborts during loads": _pinned(
        {"kind": "offload", "release": "deadline", "release_deadline_steps": 2},
        [_spec(0, 0, 48, 3, external_tokens=48, load_steps=None, cancel_us=2000),
         _spec(1, 0, 32, 3, external_tokens=16, load_steps=1, cancel_us=3000),
         _spec(2, 1, 32, 2, external_tokens=32, load_steps=3, cancel_us=2000)]),
    "an abort before the report": _pinned(
        {"kind": "decode_node"}, [_spec(0, 0, 48, 2, external_tokens=48, load_steps=3, cancel_us=1000)]),
    # a previously loaded request cancelled while running under a release lag: the lag frees it, not its old load
    "a past load under a release lag": _pinned(
        {"kind": "offload"}, [_spec(0, 0, 40, 6, external_tokens=32, load_steps=1, cancel_us=4000)],
        cancellation={"release_lag_steps": 2}),
    # both roles: a load, then pinned after the finish until its send is confirmed (one never is)
    "both roles": _pinned(
        {"kind": "both", "release": "on_completion"},
        [_spec(0, 0, 32, 2, external_tokens=32, load_steps=2, send_steps=1), _spec(1, 0, 16, 1, send_steps=None)]),
}


@pytest.mark.parametrize("name", sorted(PINNED))
def test_pinned_connector_scenarios_match_with_ints_and_z3(name):
    sc = PINNED[name]
    steps = _compare(sc, lambda before: int_outputs(sc.policy, before), 16)
    assert steps >= 3
    assert _compare(sc, Z3Step(sc.policy, len(sc.specs), sc.num_tenants).evaluate, 16) == steps


def test_connector_none_builds_the_same_queries():
    """Off means unchanged: with connector.kind none the encoding is the same z3 terms, term for term, and the
    comparison has the same names, as a policy without the section."""
    assert_section_off_builds_the_same_queries("connector", {"kind": "none"}, ("transfer", "load"),
                                               settings(max_examples=6, **SETTINGS))


def test_a_connector_with_prefix_caching_is_refused_by_the_encoding():
    from checker.smt.conformance import Z3CacheStep, cache_shape

    policy = Policy.model_validate({"name": "p", "max_model_len": 64, "connector": {"kind": "offload"},
                                    "kv": {"num_blocks": 8, "block_size": 4, "prefix_caching": {"enabled": True}}})
    spec = RequestSpec(rid=0, arrival_us=0, prompt_len=8, output_len=2, max_output=2)
    with pytest.raises(InputError, match="connector.kind"):
        Z3CacheStep(policy, cache_shape(policy, [spec]), 1)
