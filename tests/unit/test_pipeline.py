"""Async scheduling (policy.pipeline; checker/semantics/inflight.py): hand-traced steps, the policy's consistency
checks and default, the importer's mapping, and the z3 encoding's and the liveness explorer's refusals by name."""

from __future__ import annotations

import json

import pytest

from checker.cli import main
from checker.engine import simulate
from checker.errors import InputError
from checker.importers import import_policy
from checker.policy import Policy
from checker.profile import load_profile
from checker.requests import RequestSpec
from checker.semantics.state import SchedulerState, Status
from checker.semantics.step import step
from checker.traces import RequestSet
from checker.verify.counterexample import policy_hash
from tests.helpers import ROOT

BASE = {"max_model_len": 1000, "kv": {"num_blocks": 20, "block_size": 16},
        "batch": {"max_num_batched_tokens": 64, "max_num_seqs": 4}}


def policy(in_flight: int = 1, **extra) -> Policy:
    return Policy(**{**BASE, **extra, "pipeline": {"in_flight": in_flight}})


def run(p: Policy, specs: list[RequestSpec], steps: int) -> list[tuple]:
    s = SchedulerState(p, specs)
    out = []
    for j in range(steps):
        d = step(s, [r for r in s.requests if r.arrival_us == j * 1000], [], j * 1000)
        out.append((dict(d.scheduled), list(d.finished), d.kv_blocks_used, len(s.running)))
    return out


def test_one_request_hand_traced():
    """A 30-token prompt, 3 output tokens: the decodes follow as in synchronous scheduling, the finish (and the free
    of its 2 blocks) comes one step later, and no step is scheduled after the last token (its max output)."""
    spec = RequestSpec(rid=0, arrival_us=0, prompt_len=30, output_len=3, max_output=3)
    assert run(policy(), [spec], 5) == [({0: 30}, [], 2, 1), ({0: 1}, [], 2, 1), ({0: 1}, [], 2, 1),
                                        ({}, [0], 0, 0), ({}, [], 0, 0)]
    assert run(Policy(**BASE), [spec], 4) == [({0: 30}, [], 2, 1), ({0: 1}, [], 2, 1), ({0: 1}, [0], 0, 0),
                                              ({}, [], 0, 0)]


def test_a_stop_before_the_max_output_costs_one_dropped_step():
    """A request that stops before its max output (a stop token): the scheduler cannot foresee it, schedules it
    once more, and that step's output is dropped."""
    spec = RequestSpec(rid=0, arrival_us=0, prompt_len=32, output_len=2, max_output=10)
    steps = run(policy(), [spec], 4)
    assert [d[0] for d in steps] == [{0: 32}, {0: 1}, {0: 1}, {}]
    assert [d[1] for d in steps] == [[], [], [0], []]
    s = SchedulerState(policy(), [spec])
    for j in range(4):
        step(s, [r for r in s.requests if r.arrival_us == j * 1000], [], j * 1000)
    assert (s.requests[0].status, s.requests[0].num_generated) == (Status.FINISHED, 2)


def test_the_seat_and_blocks_of_a_finishing_request_are_freed_a_step_later():
    """max_num_seqs 1: the second request is admitted only once the first one's finish is resolved."""
    a = RequestSpec(rid=0, arrival_us=0, prompt_len=16, output_len=2, max_output=2)
    b = RequestSpec(rid=1, arrival_us=0, prompt_len=16, output_len=1, max_output=1)
    one = {"batch": {"max_num_batched_tokens": 64, "max_num_seqs": 1}}
    assert [d[0] for d in run(policy(**one), [a, b], 4)] == [{0: 16}, {0: 1}, {}, {1: 16}]
    assert [d[0] for d in run(Policy(**{**BASE, **one}), [a, b], 3)] == [{0: 16}, {0: 1}, {1: 16}]


def test_a_victim_whose_last_step_is_in_flight_finishes_from_the_queue():
    """5 usable blocks: b (one output token) takes the last 3 in step 1; in step 2 a's decode needs a third block and
    preempts b, whose only step is in flight: b's blocks are freed at once, and its token, delivered when step 1 is
    resolved, finishes it from the waiting queue in the same step."""
    a = RequestSpec(rid=0, arrival_us=0, prompt_len=31, output_len=50, max_output=50)
    b = RequestSpec(rid=1, arrival_us=1000, prompt_len=48, output_len=1, max_output=1)
    p = policy(kv={"num_blocks": 5, "block_size": 16})
    s = SchedulerState(p, [a, b])
    decisions = [step(s, [r for r in s.requests if r.arrival_us == j * 1000], [], j * 1000) for j in range(3)]
    assert dict(decisions[1].scheduled) == {0: 1, 1: 48} and decisions[1].kv_blocks_used == 5
    d = decisions[2]
    assert (dict(d.scheduled), list(d.preempted), list(d.finished), d.kv_blocks_used) == ({0: 1}, [1], [1], 3)
    assert (s.requests[1].status, s.requests[1].num_generated, s.waiting) == (Status.FINISHED, 1, [])


def test_speculative_decoding_hand_traced():
    """eagle k=2, a 30-token prompt, 8 output tokens, the verifier accepting 2 then none: every draft counts (vLLM's
    placeholders) until its batch is resolved a step later, when the rejected ones are rolled back; the running pass
    stops once the in-flight step reaches the 8th token even with every draft rejected, and the finish comes with
    that step's resolution."""
    spec = RequestSpec(rid=0, arrival_us=0, prompt_len=30, output_len=8, max_output=8, accepted=(2, 0))
    p = policy(speculative={"method": "eagle", "num_tokens": 2})
    s = SchedulerState(p, [spec])
    seen = []
    for j in range(8):
        d = step(s, [r for r in s.requests if r.arrival_us == j * 1000], [], j * 1000)
        seen.append((dict(d.scheduled), list(d.finished), s.requests[0].num_computed, s.requests[0].num_generated))
    assert seen[:3] == [({0: 30}, [], 30, 1), ({0: 3}, [], 33, 4), ({0: 3}, [], 36, 7)]
    # step 3: batch 2 (accepted 0) resolved: 2 drafts rolled back (39 - 2, 10 - 2)
    assert seen[3] == ({0: 3}, [], 37, 8)
    assert [x[0] for x in seen[4:7]] == [{0: 3}, {0: 3}, {}] and seen[6][1] == [0]
    assert (s.requests[0].status, s.requests[0].num_generated) == (Status.FINISHED, 8)


def test_default_section_leaves_the_hash_and_the_step_unchanged():
    plain = Policy(**BASE)
    explicit = Policy(**BASE, pipeline={"in_flight": 0})
    assert policy_hash(plain) == policy_hash(explicit)
    assert SchedulerState(explicit, []).pipe is None
    assert policy_hash(policy()) != policy_hash(plain)


@pytest.mark.parametrize("extra, field, fragment", [
    ({"pipeline": {"in_flight": 2}}, "pipeline.in_flight", "pipeline parallelism"),
    ({"pipeline": {"in_flight": -1}}, "in_flight", "greater than or equal to 0"),
    ({"pipeline": {"in_flight": 1}, "connector": {"kind": "decode_node"}}, "connector.kind", "fences"),
    ({"pipeline": {"in_flight": 1}, "batch": {"max_num_batched_tokens": 64, "max_num_seqs": 4,
                                              "phase_mode": "mixed"}}, "batch.phase_mode", "decode_first"),
])
def test_contradictory_settings_are_located(extra, field, fragment):
    with pytest.raises(Exception) as info:
        Policy(**{**BASE, **extra})
    text = str(info.value)
    assert field.split(".")[-1] in text and fragment in text


def _imported(*flags: str, version: str | None = None):
    return import_policy("vllm", ["--max-model-len", "8192", "--num-gpu-blocks-override", "90",
                                  "--no-enable-prefix-caching", *flags], name="x", vllm_version=version)


def test_import_vllm_async_scheduling():
    assert _imported("--async-scheduling").policy.pipeline.in_flight == 1
    off = _imported("--no-async-scheduling")
    assert off.policy.pipeline.in_flight == 0 and not any("async" in a for a in off.approximated)
    default = _imported()  # vLLM 0.33 defaults to async: the import stays synchronous and says so
    assert default.policy.pipeline.in_flight == 0
    assert any(a.startswith("--async-scheduling=not given") for a in default.approximated)
    old = _imported(version="0.11")
    assert not any("async" in a for a in old.approximated)
    spec = _imported("--async-scheduling", "--speculative-config", '{"method": "eagle", "num_speculative_tokens": 2}')
    assert spec.policy.pipeline.in_flight == 1 and spec.policy.speculative.num_tokens == 2
    kv = json.dumps({"kv_connector": "NixlConnector", "kv_role": "kv_consumer"})
    connector = _imported("--async-scheduling", "--kv-transfer-config", kv)
    assert connector.policy.pipeline.in_flight == 0 and any("a KV connector" in a for a in connector.approximated)


def test_import_vllm_refuses_pipeline_parallelism_by_name():
    with pytest.raises(InputError) as info:
        _imported("--async-scheduling", "--pipeline-parallel-size", "2")
    assert "--pipeline-parallel-size=2" in str(info.value)


def _policy_file(tmp_path) -> str:
    path = tmp_path / "async.yaml"
    path.write_text(json.dumps({**BASE, "pipeline": {"in_flight": 1}}))
    return str(path)


@pytest.mark.parametrize("args, fragment", [(["verify", "--depth", "2", "--requests", "1"], "not encoded in z3 yet")])
def test_z3_and_the_explorer_refuse_by_name(tmp_path, capsys, args, fragment):
    code = main([args[0], _policy_file(tmp_path), *args[1:]])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "pipeline.in_flight=1" in err and fragment in err


def test_simulate_finishes_every_request_with_preemptions():
    """Under KV pressure (preemptions) the engine with a batch in flight finishes every request and frees every
    block; the copy of a state steps as the state does."""
    specs = [RequestSpec(rid=i, arrival_us=i * 500, prompt_len=40 + 7 * i, output_len=30 + i, max_output=30 + i)
             for i in range(8)]
    p = policy(kv={"num_blocks": 14, "block_size": 16})
    result = simulate(p, RequestSet(specs, ["default"], ["default"], "test"),
                      load_profile(ROOT / "spec" / "profiles" / "default_linear.json"), record=True)
    assert all(r.status is Status.FINISHED for r in result.state.requests)
    assert result.state.kv_used == 0 and any(d.preempted for d in result.decisions)
    s = SchedulerState(p, specs)
    for j in range(40):
        c = s.copy()
        arrivals = [r for r in s.requests if r.arrival_us // 1000 == j]
        step(s, arrivals, [], j * 1000)
        step(c, [c.requests[r.rid] for r in arrivals], [], j * 1000)
        assert c.snapshot() == s.snapshot()


def test_a_request_is_done_when_its_last_token_is_out():
    """The finish is processed a step later, but the client has the last token at the end of the step computing it:
    the done time (end-to-end latency) is that step's end, as without the pipeline."""
    specs = [RequestSpec(rid=0, arrival_us=0, prompt_len=40, output_len=5, max_output=5)]
    profile = load_profile(ROOT / "spec" / "profiles" / "default_linear.json")
    rs = RequestSet(specs, ["default"], ["default"], "test")
    on, off = simulate(policy(), rs, profile), simulate(Policy(**BASE), rs, profile)
    assert on.times.done[0] == on.times.last_token[0] == off.times.done[0]
    assert on.steps == off.steps + 1  # the step that resolves the finish
