"""The symbolic step with speculative decoding (checker/smt/encode.py, checker/semantics/speculative.py) equals the
engine's step, field by field.

Generated scenarios: small vLLM policies (every phase mode, swap and recompute, chunking on and off, tight pools)
with a speculative section (ngram, draft, eagle, mtp; 1..4 drafts; the lookahead reserved or not), requests with
accepted lists (the verifier's choices, entries past k and negative ones too: the engine clamps them), prompts of
one token (padded to a uniform decode). On every step the encoding, given each request's next accepted entry as
the environment's choice, equals the engine: every request's fields, the drafts it holds and how many verifying
rows it has had (the counterexample's accepted lists are read from the same flags), the globals; with IntOps on
many steps, and with z3 (every input pinned, a real solver query, the model read back) on fewer.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from checker.errors import InputError
from checker.policy import Policy
from checker.requests import RequestSpec
from checker.smt.conformance import Z3Step, int_outputs
from checker.strategies import Scenario, small_policies
from tests.helpers import assert_section_off_builds_the_same_queries, compare_steps

SETTINGS = dict(deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
METHODS = ("ngram", "draft", "eagle", "mtp")


@st.composite
def spec_policies(draw: st.DrawFn) -> Policy:
    data = draw(small_policies()).model_dump(mode="json")
    method = draw(st.sampled_from(METHODS))
    k = draw(st.integers(1, min(4, data["max_model_len"] - 2)))
    data["kv"]["allocation"] = "on_demand"  # speculative decoding is refused under full reservation
    data["batch"]["max_num_batched_tokens"] = max(data["batch"]["max_num_batched_tokens"], k + 1)
    if draw(st.sampled_from([True, True, False])):  # KV pressure: a pool of a few blocks of a few tokens
        data["kv"].update(num_blocks=draw(st.integers(3, 12)), block_size=draw(st.sampled_from([1, 2, 4])))
        data["preemption"]["triggers"] = sorted(set(data["preemption"]["triggers"]) | {"kv_growth_fails"})
        data["kv"]["check_allocation"] = True
    data["speculative"] = {"method": method, "num_tokens": k,
                           "reserve_lookahead": method == "ngram" or draw(st.sampled_from([True, True, False]))}
    return Policy.model_validate(data)


@st.composite
def spec_scenarios(draw: st.DrawFn, max_requests: int = 5) -> Scenario:
    """Requests arriving close together, some of one token (uniform-decode padding), with accepted lists."""
    policy = draw(spec_policies())
    step_us = 1000
    n = draw(st.integers(1, max_requests))
    arrivals = sorted(draw(st.lists(st.integers(0, 4), min_size=n, max_size=n)))
    k = policy.speculative.num_tokens
    longest = max(1, min(policy.max_model_len - 1, 24))
    specs = []
    for rid, at in enumerate(arrivals):
        output = draw(st.integers(1, 12))
        cancel = draw(st.none() | st.integers(1, 8))
        specs.append(RequestSpec(
            rid=rid, arrival_us=at * step_us, prompt_len=draw(st.sampled_from([1, 1]) | st.integers(1, longest)),
            output_len=output, max_output=output + draw(st.integers(0, 3)), priority=draw(st.integers(0, 3)),
            tenant=draw(st.integers(0, 1)), cls=0, cancel_us=None if cancel is None else (at + cancel) * step_us,
            accepted=tuple(draw(st.lists(st.integers(-1, k + 1), max_size=8)))))
    return Scenario(policy, specs, 2, step_us)


SEEN: dict[str, int] = {}


def _note(sc: Scenario, before, after, d) -> None:
    scheduled = dict(d.scheduled)
    verifying = [rid for rid, n in scheduled.items() if before.drafts[rid] and n > 1]
    accepted = [rid for rid in verifying if after.requests[rid].num_generated
                - before.slots[rid][3] > 1]
    for what, happened in (
            ("steps", True), ("verifying", bool(verifying)), ("accepted", bool(accepted)),
            ("rejected", any(rid not in accepted for rid in verifying)),
            ("padded", any(n > 1 and rid in d.admitted and before.slots[rid][2] + 1 == before.params[rid][1]
                           + before.slots[rid][3] for rid, n in scheduled.items())),
            ("drafts capped", any(before.drafts[rid] and n < 1 + before.drafts[rid] for rid, n in scheduled.items())),
            ("preemption", bool(d.preempted)), ("full pool", after.kv_used >= sc.policy.kv.num_blocks)):
        SEEN[what] = SEEN.get(what, 0) + int(happened)


def _compare(sc: Scenario, evaluate, max_steps: int) -> int:
    return compare_steps(sc, evaluate, max_steps, _note)


@settings(max_examples=200, **SETTINGS)
@given(sc=spec_scenarios())
def test_int_evaluation_of_the_speculative_encoding_equals_the_engine_step(sc):
    _compare(sc, lambda before: int_outputs(sc.policy, before), 30)


def test_the_generated_steps_exercise_speculative_decoding():
    """After the test above (same module, run in order): verifying rows that accept and reject drafts, padded
    decodes, drafts capped by the budget or max_model_len, preemptions and a full pool, on many steps."""
    if not SEEN:
        pytest.skip("run with the test above")
    assert SEEN["steps"] >= 1500, SEEN
    for what in ("verifying", "accepted", "rejected", "padded", "drafts capped", "preemption", "full pool"):
        assert SEEN[what] >= 10, (what, SEEN)


def test_z3_evaluation_of_the_speculative_encoding_equals_the_engine_step():
    checked: list[int] = []

    @settings(max_examples=16, **SETTINGS)
    @given(sc=spec_scenarios(max_requests=3))
    def one_scenario(sc):
        checked.append(_compare(sc, Z3Step(sc.policy, len(sc.specs), sc.num_tenants).evaluate, 10))

    one_scenario()
    assert sum(checked) >= 80, f"only {sum(checked)} steps checked against z3"


def _pinned(spec: dict, specs: list[RequestSpec], **policy) -> Scenario:
    data = {"name": "pinned", "max_model_len": 64, "kv": {"num_blocks": 10, "block_size": 4},
            "batch": {"max_num_seqs": 4, "max_num_batched_tokens": 8}, "chunking": {"enabled": True}, **policy,
            "speculative": spec}
    return Scenario(Policy.model_validate(data), specs, 1, 1000)


# Hand-written scenarios for rules the generated ones reach rarely, each checked with IntOps and with z3, and the
# engine's decisions that show the rule fired.
PINNED = {
    # a one-token prompt arrives beside a decode verifying 3 drafts: its uniform decode (1 + 3) does not fit the 2
    # tokens left, so the waiting pass ends (steps 1, 2); alone it is admitted unpadded (step 3), and then a decode
    # capped by the budget schedules 2 of its 3 drafts (step 4)
    "padding that does not fit the budget": (_pinned(
        {"method": "eagle", "num_tokens": 3},
        [RequestSpec(0, 0, 4, 6, 6, accepted=(3, 3, 3)), RequestSpec(1, 1000, 1, 3, 3), RequestSpec(2, 2000, 1, 3, 3)],
        batch={"max_num_seqs": 4, "max_num_batched_tokens": 6}),
        {1: ({0: 4}, ()), 2: ({0: 4}, ()), 3: ({1: 1, 2: 1}, ()), 4: ({1: 4, 2: 2}, ())}),
    # draft_model's budget slot: in step 2 the first request is scheduled (3 tokens and its slot), the second gets
    # the one token left, then preempts the first for its growth (lowest priority): the first's tokens and its slot
    # are refunded, and a waiting prompt is admitted with all 3 of them
    "a victim's budget slot refunded": (_pinned(
        {"method": "draft", "num_tokens": 2},
        [RequestSpec(0, 0, 1, 8, 8, priority=1, accepted=(2,) * 6), RequestSpec(1, 0, 1, 8, 8, accepted=(2,) * 6),
         RequestSpec(2, 1000, 4, 3, 3)],
        kv={"num_blocks": 7, "block_size": 2}, batch={"max_num_seqs": 4, "max_num_batched_tokens": 6},
        preemption={"triggers": ["kv_growth_fails"], "victim": "lowest_priority",
                    "block_admission_after_preempt": False}),
        {2: ({1: 1, 2: 3}, (0,))}),
}


@pytest.mark.parametrize("name", sorted(PINNED))
def test_pinned_speculative_scenarios_match_with_ints_and_z3(name):
    sc, expected = PINNED[name]
    seen = {}
    steps = compare_steps(sc, lambda before: int_outputs(sc.policy, before), 12,
                          lambda _sc, _b, _a, d: seen.__setitem__(d.step, (dict(d.scheduled), d.preempted)))
    assert {k: seen[k] for k in expected} == expected
    assert compare_steps(sc, Z3Step(sc.policy, len(sc.specs), sc.num_tenants).evaluate, 12) == steps


def test_speculative_none_builds_the_same_queries():
    """Off means unchanged: with speculative.method none the encoding is the same z3 terms, term for term."""
    assert_section_off_builds_the_same_queries("speculative", {"method": "none"}, ("drafts", "verifications"),
                                               settings(max_examples=6, **SETTINGS))


def test_a_step_without_the_verifiers_choices_is_refused_by_name():
    """The proofs' symbolic states and diff's product give no acceptance: refused (exit 2), not checked without
    the drafts."""
    from checker.smt.encode import SlotState, SymbolicStep
    from checker.smt.ops import IntOps

    policy = Policy.model_validate({"name": "p", "max_model_len": 64, "kv": {"num_blocks": 8, "block_size": 4},
                                    "speculative": {"method": "eagle", "num_tokens": 2}})
    with pytest.raises(InputError, match="speculative.method"):
        SymbolicStep(IntOps, policy, [], SlotState([], 1, 0, [0]), 0, [])
