"""SGLang's rules (checker/semantics/sglang.py), scenario by scenario, each traced by hand from SGLang 0.5.23's code
(docs/sglang-harness.md section 3 names the functions). The kept real-scheduler logs pin the same rules end to end
(tests/conformance/test_sglang_conformance.py); these run without the SGLang venv."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from checker.policy import Policy
from checker.requests import RequestSpec
from checker.semantics.sglang import Adder
from checker.semantics.state import Reason, SchedulerState, Status
from checker.semantics.step import step

STEP = 1000


def policy(**over) -> Policy:
    data = {"scheduler": "sglang", "max_model_len": 4096, "kv": {"block_size": 4, "num_blocks": 100},
            "batch": {"max_num_seqs": 8, "max_num_batched_tokens": 256, "phase_mode": "prefill_first"},
            "preemption": {"victim": "fewest_generated"}}
    for key, value in over.items():
        if isinstance(value, dict):
            data[key] = {**data.get(key, {}), **value}
        else:
            data[key] = value
    return Policy.model_validate(data)


def run(pol: Policy, specs: list[RequestSpec], steps: int, cancels: dict[int, list[int]] | None = None):
    s = SchedulerState(pol, specs)
    out = []
    for k in range(steps):
        arrived = [r for r in s.requests if r.spec.arrival_us == k * STEP]
        cancelled = [s.requests[i] for i in (cancels or {}).get(k, [])]
        out.append(step(s, arrived, cancelled, k * STEP))
    return s, out


def spec(rid: int, at: int, prompt: int, output: int, max_output: int | None = None, priority: int = 0) -> RequestSpec:
    return RequestSpec(rid, at * STEP, prompt, output, max_output or output, priority=priority)


def test_allocation_is_in_pages():
    s, d = run(policy(), [spec(0, 0, 10, 5)], 3)
    assert dict(d[0].scheduled) == {0: 10}
    assert s.requests[0].blocks == 3  # 11 tokens of KV after two decodes: ceil(11 / 4)
    assert d[0].kv_blocks_used == 3  # 10 tokens: ceil(10 / 4) pages


def test_prefill_runs_instead_of_decode():
    # request 0 decodes; request 1 arrives at step 2: step 2 is its prefill alone, request 0 skips that step
    _, d = run(policy(), [spec(0, 0, 8, 10), spec(1, 2, 8, 10)], 4)
    assert [dict(x.scheduled) for x in d] == [{0: 8}, {0: 1}, {1: 8}, {0: 1, 1: 1}]


def test_mixed_chunk_decodes_inside_the_prefill_batch():
    _, d = run(policy(sglang={"mixed_chunk": True}), [spec(0, 0, 8, 10), spec(1, 2, 8, 10)], 3)
    assert dict(d[2].scheduled) == {1: 8, 0: 1}


def test_admission_is_strict_against_the_ratio_estimate():
    # pool 100 pages = 400 tokens. Request 0 runs with 300 tokens left to generate: 300 * 0.7 = 210 reserved.
    # Request 1 (prompt 100, max 80) needs 100 + 80 + 4 = 184 < 400 - 12 * 4 - 210 + ... checked by the adder itself
    pol = policy()
    s = SchedulerState(pol, [spec(0, 0, 40, 300), spec(1, 0, 100, 80)])
    step(s, [s.requests[0]], [], 0)  # request 0 prefills alone (request 1 not arrived)
    adder = Adder(s, [s.requests[0]], 0)
    assert adder.available() == 400 - 40  # 10 pages held
    assert adder.total_offset == pytest.approx(min(300 - 1, 4096) * 0.7)
    assert adder.remaining_total() == pytest.approx(360 - 299 * 0.7)
    # 100 + 80 + 4 = 184 >= 360 - 209.3 = 150.7: no room, so request 1 waits and request 0 decodes
    d = step(s, [s.requests[1]], [], STEP)
    assert dict(d.scheduled) == {0: 1}
    assert s.requests[1].status is Status.WAITING


def test_a_long_prompt_is_cut_at_a_page_boundary_and_continues_first():
    _, d = run(policy(batch={"max_num_batched_tokens": 64}), [spec(0, 0, 150, 3), spec(1, 0, 10, 3)], 4)
    # 150 tokens: chunks of 64 (the chunk budget, a page multiple), 64, then the last 22 with request 1 after it
    assert [dict(x.scheduled) for x in d[:3]] == [{0: 64}, {0: 64}, {0: 22, 1: 10}]


def test_decode_out_of_pages_retracts_the_fewest_outputs_first():
    # 10 pages (40 tokens). Request 0 (prompt 8) is admitted at step 0; request 1 (prompt 12) does not fit beside
    # its full reservation then, but does at step 1, when request 0 only reserves 10 * ratio. Their growth needs
    # 5 + 6 pages: a decode runs out, and request 1, with fewer output tokens, is retracted.
    pol = policy(kv={"num_blocks": 10}, sglang={"init_new_token_ratio": 0.01})
    s = SchedulerState(pol, [spec(0, 0, 8, 10), spec(1, 0, 12, 10)])
    decisions = [step(s, s.requests if k == 0 else [], [], k * STEP) for k in range(12)]
    assert [dict(d.scheduled) for d in decisions[:2]] == [{0: 8}, {1: 12}]
    at = next(k for k, d in enumerate(decisions) if d.preempted)
    assert decisions[at].preempted == (1,)
    r0, r1 = s.requests
    assert r1.num_preemptions == 1 and r1.num_generated >= 1  # keeps its output and recomputes it later
    # the ratio re-estimated over the request left: (its output + 20) / (its max output + 1), capped at 1
    state = SchedulerState(pol, [spec(0, 0, 8, 10), spec(1, 0, 12, 10)])
    for k in range(at + 1):
        step(state, state.requests if k == 0 else [], [], k * STEP)
    assert state.sglang.ratio == min(1.0, (state.requests[0].num_generated - 1 + 20) / (10 + 1))


def test_arrival_caps_max_output_to_what_an_empty_pool_holds():
    s = SchedulerState(policy(kv={"num_blocks": 5}), [spec(0, 0, 8, 100)])
    step(s, [s.requests[0]], [], 0)
    r = s.requests[0]
    assert r.max_output == 20 - 8 - 4 - 1 == r.output_len  # min(max_req_len - prompt - 1, pool - ceil(prompt) - page - 1)
    for k in range(1, 20):
        step(s, [], [], k * STEP)
    assert r.status is Status.FINISHED and r.num_generated == 7


def test_retraction_aborts_the_last_request_when_even_it_does_not_fit():
    # a lone running request whose next decode needs a page when none is free (the pool: 4 pages, all its own)
    s = SchedulerState(policy(kv={"num_blocks": 4}), [spec(0, 0, 16, 50)])
    r = s.requests[0]
    r.status, r.num_computed, r.num_generated, r.blocks, r.admitted_seq = Status.RUNNING, 16, 1, 4, 1
    s.running, s.kv_used = [r], 4
    d = step(s, [], [], 0)
    assert r.status is Status.CANCELLED and r.reason is Reason.OUT_OF_MEMORY
    assert d.released == (0,) and not d.scheduled and s.kv_used == 0


def test_an_aborted_running_request_runs_one_more_row():
    _, d = run(policy(), [spec(0, 0, 8, 10)], 4, cancels={2: [0]})
    assert dict(d[2].scheduled) == {0: 1}  # still decodes in the step of its abort
    assert d[2].cancelled == (0,) and d[2].released == (0,) and d[2].kv_blocks_used == 0


def test_an_aborted_chunked_request_is_torn_down_at_once():
    _, d = run(policy(batch={"max_num_batched_tokens": 32}), [spec(0, 0, 100, 3)], 3, cancels={1: [0]})
    assert dict(d[0].scheduled) == {0: 32}
    assert not d[1].scheduled and d[1].released == (0,) and d[1].kv_blocks_used == 0


def test_lof_serves_the_longest_output_first():
    _, d = run(policy(sglang={"schedule_policy": "lof"}, batch={"max_num_seqs": 1}),
               [spec(0, 0, 8, 1), spec(1, 0, 8, 5), spec(2, 0, 8, 9)], 1)
    assert dict(d[0].scheduled) == {2: 8}


def test_priority_preemption_frees_a_lower_priority_request():
    pol = policy(batch={"max_num_seqs": 1}, queue={"order": "priority", "priority_polarity": "higher_first"},
                 preemption={"triggers": ["kv_growth_fails", "priority_inversion"],
                             "priority_inversion_threshold": 10})
    s, d = run(pol, [spec(0, 0, 8, 20, priority=0), spec(1, 2, 8, 20, priority=50)], 4)
    assert d[2].preempted == (0,) and dict(d[2].scheduled) == {1: 8}
    assert s.requests[0].status is Status.WAITING and s.requests[0].num_generated == 2


@pytest.mark.parametrize("field,value,message", [
    ("batch", {"phase_mode": "decode_first"},
     "batch.phase_mode=decode_first (expected prefill_first when scheduler is sglang (SGLang's rules do not have "
     "this knob; see docs/semantics.md, \"SGLang's rules\"))"),
    ("kv", {"watermark": 0.1},
     "kv.watermark=0.1 (expected 0.0 when scheduler is sglang (SGLang's rules do not have this knob; see "
     "docs/semantics.md, \"SGLang's rules\"))"),
    ("preemption", {"victim": "last_admitted"},
     "preemption.victim=last_admitted (expected fewest_generated when scheduler is sglang (--retraction-policy "
     "length or priority))"),
    ("sglang", {"schedule_policy": "lpm"},
     "schedule_policy=lpm (expected fcfs or lof when radix_cache is false (SGLang runs a cache-aware policy as fcfs "
     "when the radix cache is disabled: say fcfs))"),
])
def test_contradictions_are_refused_with_the_field(field, value, message):
    with pytest.raises(ValidationError) as err:
        policy(**{field: value})
    assert message in str(err.value)


def test_the_sglang_section_needs_the_sglang_scheduler():
    data = {"max_model_len": 64, "kv": {"num_blocks": 10}, "sglang": {"mixed_chunk": True}}
    with pytest.raises(ValidationError) as err:
        Policy.model_validate(data)
    assert ("sglang.mixed_chunk=true (expected its default unless scheduler is sglang (the vllm rules do not read "
            "the sglang section))") in str(err.value)


# ----------------------------------------------------------------------------------------- properties
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from checker.semantics.kv import blocks_for  # noqa: E402
from checker.strategies import small_sglang_policies  # noqa: E402


@st.composite
def sglang_runs(draw):
    pol = draw(small_sglang_policies())
    n = draw(st.integers(1, 8))
    specs = []
    for rid in range(n):
        out = draw(st.integers(1, 30))
        specs.append(RequestSpec(rid, draw(st.integers(0, 12)) * STEP, draw(st.integers(1, pol.max_model_len)), out,
                                 out + draw(st.integers(0, 20)), priority=draw(st.integers(0, 30))))
    cancels = {}
    for rid in draw(st.lists(st.integers(0, n - 1), max_size=3, unique=True)):
        cancels.setdefault(draw(st.integers(0, 40)), []).append(rid)
    return pol, specs, cancels


@settings(max_examples=300, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(case=sglang_runs())
def test_every_step_keeps_the_pages_and_budgets_consistent(case):
    """On any small SGLang policy and trace: the step never raises, each request holds exactly the pages of its
    computed tokens (page-granular), the pool counts are their sum, a step's tokens stay within the chunk budget
    (or the running count on decode steps), the running count within max_num_seqs, and the ratio in [0, 1]."""
    pol, specs, cancels = case
    s = SchedulerState(pol, specs)
    page = pol.kv.block_size
    rules = pol.sglang
    for k in range(60):
        arrived = [r for r in s.requests if r.spec.arrival_us == k * STEP]
        cancelled = [s.requests[i] for i in cancels.get(k, []) if i < len(s.requests)]
        d = step(s, arrived, cancelled, k * STEP)
        for r in s.requests:
            live = r.status in (Status.RUNNING,)
            assert r.blocks == (blocks_for(r.num_computed, page) if live else 0), (k, r)
        assert s.kv_used == sum(r.blocks for r in s.requests)
        assert d.num_scheduled_tokens <= max(pol.batch.max_num_batched_tokens, pol.batch.max_num_seqs)
        assert d.num_running <= pol.batch.max_num_seqs
        assert 0.0 <= s.sglang.ratio <= 1.0


def test_a_fixed_length_request_cut_after_another_cut_truncates_the_first():
    """SGLang 0.5.23, as its real scheduler does it (kept log ignore_eos_mixed_priority_p4, step 569): with one
    request decoding in a mixed batch the chunk budget is 64 - 1 = 63; A (40 tokens) fits whole, B (50) is cut at
    a page boundary to 20, and the ignore_eos request C is then cut at the raw 3 tokens left and becomes the chunked
    request in B's place. B is taken as prefilled: it samples a token after its 20 tokens, the rest of its prompt is
    never computed."""
    pol = policy(kv={"num_blocks": 200}, batch={"max_num_batched_tokens": 64}, sglang={"mixed_chunk": True})
    specs = [spec(0, 0, 8, 50), spec(1, 2, 40, 5), spec(2, 2, 50, 5),
             RequestSpec(3, 2 * STEP, 30, 5, 5, ignore_eos=True)]
    s, d = run(pol, specs, 3)
    assert dict(d[2].scheduled) == {1: 40, 2: 20, 3: 3, 0: 1}
    b = s.requests[2]
    assert (b.prompt_len, b.num_computed, b.num_generated) == (20, 20, 1)  # its first token after 20 of 50
    assert s.sglang.chunked == 3


def test_prompt_fully_computed_names_the_truncation_on_the_engine():
    """The invariant reads the request's own prompt (the slot's parameters), not the prompt as the scheduler took
    it: it fails at the step that samples B's token after 20 of its 50 prompt tokens, and holds before it."""
    from checker.verify.replay import first_violation, replay_fixed_clock
    from invariants import CATALOGUE
    pol = policy(kv={"num_blocks": 200}, batch={"max_num_batched_tokens": 64}, sglang={"mixed_chunk": True})
    specs = [spec(0, 0, 8, 50), spec(1, 2, 40, 5), spec(2, 2, 50, 5),
             RequestSpec(3, 2 * STEP, 30, 5, 5, ignore_eos=True)]
    rp = replay_fixed_clock(pol, specs, 3, STEP)
    assert first_violation(CATALOGUE["prompt_fully_computed"], {}, rp) == 2
    assert [p.prompt_len for p in rp.ctx.params] == [8, 40, 50, 30]
    without = [spec(0, 0, 8, 50), spec(1, 2, 40, 5), spec(2, 2, 50, 5)]  # no fixed-length cut: no truncation
    assert first_violation(CATALOGUE["prompt_fully_computed"], {}, replay_fixed_clock(pol, without, 6, STEP)) is None


def test_a_fixed_length_request_reserves_at_ratio_one():
    s = SchedulerState(policy(), [RequestSpec(0, 0, 8, 40, 40, ignore_eos=True), spec(1, 0, 8, 40)])
    step(s, list(s.requests), [], 0)
    adder = Adder(s, [s.requests[0], s.requests[1]], 0)
    assert adder.reservation(s.requests[0]) == 39 * 1.0 and adder.reservation(s.requests[1]) == 39 * 0.7
