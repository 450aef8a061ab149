"""check-log on SGLang's step records (docs/check-log.md, "SGLang's step records as check-log input"): the record
read as a log line, a malformed one refused with the key and line, and SGLang's memory identity checked on every
step of a kept real-scheduler log (and failing, with its note, where the counts were tampered with)."""

from __future__ import annotations

import json

import pytest

from checker import checklog as cl
from checker.errors import InputError
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
