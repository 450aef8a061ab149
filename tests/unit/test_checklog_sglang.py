"""check-log on SGLang's step records (docs/check-log.md, "SGLang's step records as check-log input"): the record
read as a log line, a malformed one refused with the key and line, and SGLang's memory identity checked on every
step of a kept real-scheduler log (and failing, with its note, where the counts were tampered with)."""

from __future__ import annotations

import json

import pytest

from checker import checklog as cl
from checker.errors import InputError
from checker.verify.run import parse_invariant
from tests import sglang_logs as L

NAME = "priority_low_first_p4"  # page 4, aborts (scheduled and aborted in one step), priority preemption


def _case(tmp_path):
    trace, log = L.kept(NAME, tmp_path)
    return trace, log, L.policy_for(L.CASE[NAME].driver_flags(), NAME)


def test_a_record_reads_as_a_log_line(tmp_path):
    trace, log, policy = _case(tmp_path)
    arrivals = cl.load_arrivals(trace)
    records = [json.loads(x) for x in log.read_text().splitlines()]
    steps = cl.load_log(log, arrivals, page=policy.kv.block_size)
    for rec, entry in zip(records, steps):
        assert entry.free_blocks * policy.kv.block_size == rec["available_tokens"] + rec["evictable_tokens"]
        assert sorted(entry.preempted) == sorted(arrivals.index[i] for i in rec["retracted"] + rec["preempted"])


def test_the_memory_identity_holds_on_a_kept_log_and_fails_where_tampered(tmp_path):
    trace, log, policy = _case(tmp_path)
    assert cl.sglang_identity_notes(log, policy) == ([], 0)
    records = [json.loads(x) for x in log.read_text().splitlines()]
    records[7]["held_tokens"] += policy.kv.block_size
    log.write_text("".join(json.dumps(r) + "\n" for r in records))
    total = policy.kv.num_blocks * policy.kv.block_size
    r = records[7]
    parts = [r["available_tokens"], r["evictable_tokens"], r["protected_tokens"], r["held_tokens"]]
    assert cl.sglang_identity_notes(log, policy) == ([
        f"step 7: SGLang's memory identity fails: available {parts[0]} + evictable {parts[1]} + protected "
        f"{parts[2]} + held {parts[3]} = {sum(parts)} tokens, the pool is {total} (kv.num_blocks x kv.block_size)"], 1)
    result = cl.run_check_log(policy, log, trace, None, True)
    assert result.notes[0].startswith("step 7: SGLang's memory identity fails") and result.violation is None


@pytest.mark.parametrize("change,message", [
    (lambda r: r.pop("retracted"), "retracted=<missing> (expected the keys of an SGLang step record: step, scheduled, "
     "retracted, preempted, finished, aborted, running, waiting, available_tokens, evictable_tokens)"),
    (lambda r: r.update(available_tokens=-4), "available_tokens=-4 (expected a whole number of tokens >= 0)"),
    (lambda r: r.update(retracted="r1"), "retracted='r1' (expected a list of request ids)"),
])
def test_a_malformed_record_is_refused_with_its_key_and_line(tmp_path, change, message):
    trace, log, policy = _case(tmp_path)
    records = [json.loads(x) for x in log.read_text().splitlines()]
    change(records[3])
    log.write_text("".join(json.dumps(r) + "\n" for r in records))
    with pytest.raises(InputError) as err:
        cl.load_log(log, cl.load_arrivals(trace), page=policy.kv.block_size)
    assert str(err.value) == f"{log}:4: {message}"


TRUNCATED = "ignore_eos_mixed_priority_p4"  # the real scheduler's truncation at step 569


def test_check_log_sees_the_truncation_on_the_real_log_in_both_paths(tmp_path):
    """The record names its one chunked request: r126, given 248 tokens of its 367-token prompt beside the chunked
    r127, is taken as prefilled (a token sampled after it); check-log flags prompt_fully_computed there by default
    under SGLang's rules, on the streaming and the reference path, and the engine still agrees on every step."""
    trace, log = L.kept(TRUNCATED, tmp_path)
    policy = L.policy_for(L.CASE[TRUNCATED].driver_flags(), TRUNCATED)
    assert "prompt_fully_computed" in cl.default_invariants(policy)
    result = cl.run_check_log(policy, log, trace, None, True)
    v = result.violation
    assert (v.invariant, v.step, v.line) == ("prompt_fully_computed", 569, 570)
    assert v.context[-1] == ("request r126: 1 output token(s) after 248 computed tokens of a 367-token prompt "
                             "(taken as prefilled: the record's chunked request is r127)")
    assert result.conformance.share == 1.0
    arrivals = cl.load_arrivals(trace)
    ref = cl.check_log(policy, arrivals, cl.load_log(log, arrivals, page=policy.kv.block_size),
                       [parse_invariant("prompt_fully_computed")])
    assert (ref[0].invariant, ref[0].step) == ("prompt_fully_computed", 569)


def test_a_record_that_names_no_chunked_request_or_an_unknown_one(tmp_path):
    trace, log = L.kept(TRUNCATED, tmp_path)
    arrivals = cl.load_arrivals(trace)
    policy = L.policy_for(L.CASE[TRUNCATED].driver_flags(), TRUNCATED)
    records = [json.loads(x) for x in log.read_text().splitlines()]
    steps = cl.load_log(log, arrivals, page=policy.kv.block_size)
    assert steps[569].chunked == (arrivals.index["r127"],) and steps[570].chunked == ()
    records[3]["chunked"] = "nobody"
    log.write_text("".join(json.dumps(r) + "\n" for r in records))
    with pytest.raises(InputError) as e:
        cl.load_log(log, arrivals, page=policy.kv.block_size)
    assert str(e.value) == f"{log}:4: chunked='nobody' (expected null or the id of a request of the arrivals)"
