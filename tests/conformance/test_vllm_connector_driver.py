"""Facts of the real vLLM 0.33 scheduler's KV-connector states, observed through tests/vllm_connector_driver.py.

Every case of tests/vllm_connector_harness.FACT_CASES (and the no-connector identity traces) runs in ONE driver
process (the vLLM import takes ~30 s); the tests then read the logs. They skip, with the reason, when the vLLM venv
is absent (BATCHCHECK_VLLM_VENV, default ~/.cache/vllm-scheduler/venv). docs/connector-harness.md states the
rules these facts pin, with the lines of scheduler.py behind each.

Pool arithmetic used below: block size 16, `--num-blocks B` gives B - 1 usable blocks (63 for the default 64,
40 for 41, 10 for 11).
"""

from __future__ import annotations

import json

import pytest

from tests.vllm_connector_harness import (
    BLOCKED_CASES,
    BLOCKED_FIXTURES,
    FACT_CASES,
    FIXTURES,
    SHAPES,
    absent_reason,
    flags,
    pressure_with_loads,
    read_log,
    recorded,
    run_jobs,
    venv_python,
)

REASON = absent_reason()
live = pytest.mark.skipif(REASON is not None, reason=REASON or "")


def _identity_jobs() -> dict:
    rows, _ = pressure_with_loads(n=30, num_blocks=60, seed=3)
    for i, row in enumerate(rows):
        row["prefix_group"] = i % 3
        row["priority"] = i % 4
        if i % 7 == 3:
            row["abort_step"] = row["arrival_step"] + 2 + i % 5
    base = flags(role=None, num_blocks=60, max_num_seqs=6, max_num_batched_tokens=192)
    return {"ident_fcfs_cache": (rows, base + ["--enable-prefix-caching"]),
            "ident_priority": (rows, base + ["--policy", "priority", "--long-prefill-token-threshold", "64"])}


IDENTITY = _identity_jobs()


SHAPE_JOBS = {f"shape_{name}": shape() for name, shape in SHAPES.items()}


@pytest.fixture(scope="module")
def logs() -> dict[str, list[dict]]:
    jobs = {**FACT_CASES, **IDENTITY, **{f"shared_{k}": v for k, v in IDENTITY.items()}, **SHAPE_JOBS,
            **{f"blocked_{k}": v for k, v in BLOCKED_CASES.items()}}
    return run_jobs(jobs, shared=frozenset(f"shared_{k}" for k in IDENTITY))


def at(log: list[dict], step: int) -> dict:
    (row,) = [r for r in log if r["step"] == step]
    return row


def column(log: list[dict], key: str) -> list:
    return [r[key] for r in log]


def steps_with(log: list[dict], key: str, rid: str) -> list[int]:
    return [r["step"] for r in log if rid in r[key]]


# ---- no connector: the shared driver's log ----

@live
@pytest.mark.parametrize("name", sorted(IDENTITY))
def test_without_a_role_the_log_is_the_shared_drivers_line_for_line(logs, name):
    mine, theirs = logs[name], logs[f"shared_{name}"]
    assert len(mine) > 50
    assert any(r["preempted"] for r in mine) and any(r["aborted"] for r in mine)
    assert mine == theirs
    assert set(mine[0]) == {"step", "scheduled", "preempted", "finished", "aborted", "running", "waiting",
                            "free_blocks"}


# ---- async loads: timing, what they hold, what the promotion computes ----

@live
def test_a_load_is_loading_for_load_steps_steps_and_its_promotion_computes_the_rest(logs):
    log = logs["latency"]
    # a: 64 of 64 tokens, 2 steps; b: 50 of 100, 1 step; c: 64 of 100, 3 steps; all start at step 0
    assert steps_with(log, "loading", "a") == [0, 1] and steps_with(log, "recv_done", "a") == [1]
    assert steps_with(log, "loading", "b") == [0] and steps_with(log, "recv_done", "b") == [0]
    assert steps_with(log, "loading", "c") == [0, 1, 2] and steps_with(log, "recv_done", "c") == [2]
    # a load takes cdiv(external tokens, 16) blocks at once (4 + 4 + 4), none for the rest of its prompt
    assert at(log, 0)["free_blocks"] == 63 - 12 and at(log, 0)["scheduled"] == {}
    assert at(log, 0)["running"] == 0 and at(log, 0)["waiting"] == 3  # loading requests count as waiting
    # promoted in schedule() of start + load_steps: b computes 100 - 50, a full-prompt load computes the last
    # prompt token again (num_computed_tokens = num_tokens - 1), c computes 100 - 64
    assert at(log, 1)["scheduled"] == {"b": 50}
    assert at(log, 2)["scheduled"] == {"b": 1, "a": 1}
    assert at(log, 3)["scheduled"] == {"b": 1, "a": 1, "c": 36}
    assert column(log, "finished")[-1] == ["c"] and log[-1]["free_blocks"] == 63


@live
def test_a_hung_load_keeps_its_blocks_for_good_and_the_run_stops_when_nothing_else_can_change(logs):
    log = logs["hung"]
    assert all(r["loading"] == ["h"] for r in log)
    assert column(log, "free_blocks") == [56, 56, 56, 59]  # h's 4 blocks (64 tokens) never come back
    assert [r["step"] for r in log if r["finished"]] == [3] and log[-1]["finished"] == ["p"]


@live
def test_a_hung_load_is_never_preempted_and_can_deadlock_the_pool(logs):
    log = logs["hung_deadlock"]
    assert at(log, 0)["free_blocks"] == 0  # r (6 blocks) and h's load (4 blocks) fill the 10
    assert at(log, 7)["preempted"] == ["r"]  # r's 97th token needs a 7th block: r preempts itself, not h
    assert all(r["free_blocks"] == 6 and r["scheduled"] == {} and r["loading"] == ["h"] for r in log[8:])
    assert len(log) == 12  # --max-steps: r (97 tokens, 7 blocks) never fits the 6 free again


@live
def test_an_abort_frees_a_loads_blocks_only_once_its_recv_is_reported(logs):
    log = logs["abort_during_load"]
    assert at(log, 0)["loading"] == ["a", "b", "c"] and at(log, 0)["free_blocks"] == 63 - 12
    assert at(log, 0)["recv_done"] == ["b"]
    # step 1: a (recv due at step 3) is aborted: its blocks stay; b (recv reported at step 0, not yet promoted)
    # is aborted: its 4 blocks come back at once
    assert at(log, 1)["aborted"] == ["a", "b"] and at(log, 1)["pinned_load"] == ["a"]
    assert at(log, 1)["free_blocks"] == 55 and at(log, 1)["waiting"] == 1
    # step 2: the hung c is aborted: held for good
    assert at(log, 2)["aborted"] == ["c"] and at(log, 2)["pinned_load"] == ["a", "c"]
    # step 3: a's recv is reported (the worker finishes the transfer anyway): freed in that update_from_output
    assert at(log, 3)["recv_done"] == ["a"] and at(log, 3)["free_blocks"] == 59
    assert at(log, 3)["pinned_load"] == ["c"] and len(log) == 4


# ---- the waiting pass: holders first, and a holder that does not fit stops it ----

@live
def test_kv_holding_requests_are_scanned_before_waiting_ones_whatever_their_priority(logs):
    log = logs["holder_first"]  # max_num_seqs 1; a (priority 1) loaded at step 0, b (priority 0) arrives at 1
    assert at(log, 0)["loading"] == ["a"] and at(log, 0)["recv_done"] == ["a"]
    assert at(log, 1)["scheduled"] == {"a": 1} and at(log, 1)["waiting"] == 1
    assert min(steps_with_key(log, "b")) == 4  # b runs only once a is done


def steps_with_key(log: list[dict], rid: str) -> list[int]:
    return [r["step"] for r in log if rid in r["scheduled"]]


@live
def test_a_promoted_holder_that_does_not_fit_blocks_the_whole_waiting_pass(logs):
    log = logs["holder_blocks"]
    assert at(log, 0)["free_blocks"] == 36  # A's load: 4 blocks of its 25
    assert at(log, 1)["scheduled"] == {"C": 320} and at(log, 1)["free_blocks"] == 16  # plain: no reservation
    assert at(log, 2)["recv_done"] == ["A"]
    # from step 3 A is promoted (no longer loading) but needs 21 more blocks > 15 free: break, so D (1 block,
    # arrived at step 3) is never reached
    for step in range(3, 10):
        assert at(log, step)["loading"] == [] and at(log, step)["scheduled"] == {"C": 1}
        assert at(log, step)["waiting"] == 2 and at(log, step)["free_blocks"] == 15
    assert at(log, 10)["finished"] == ["C"]
    assert at(log, 11)["scheduled"] == {"A": 336, "D": 16}


@live
def test_aborting_a_promoted_holder_frees_its_blocks_at_once(logs):
    log = logs["holder_aborted"]
    assert at(log, 5)["aborted"] == ["A"] and at(log, 5)["pinned_load"] == []
    assert at(log, 5)["scheduled"] == {"C": 1, "D": 16} and at(log, 5)["free_blocks"] == 15 + 4 - 1


# ---- admission of a load ----

@live
def test_a_load_must_fit_the_free_blocks_minus_the_other_in_flight_reservations(logs):
    log = logs["reserved"]
    # L1 holds 4, reserves 21; L2's 16 blocks > 36 - 21: refused, and P behind it is not reached
    for step in range(1, 5):
        assert at(log, step)["loading"] == ["L1"] and at(log, step)["scheduled"] == {}
        assert at(log, step)["waiting"] == 3 and at(log, step)["free_blocks"] == 36
    assert at(log, 5)["scheduled"] == {"L1": 336}
    assert at(log, 7)["scheduled"] == {"P": 16} and at(log, 7)["loading"] == ["L2"]
    edge = logs["reserved_edge"]  # 15 blocks = 36 - 21: admitted
    assert at(edge, 1)["loading"] == ["L1", "L2"] and at(edge, 1)["free_blocks"] == 21


@live
def test_plain_admissions_ignore_load_reservations(logs):
    log = logs["reserved_plain"]
    assert at(log, 1)["scheduled"] == {"L2": 256} and at(log, 1)["free_blocks"] == 20


@live
def test_a_running_chunked_prefill_reserves_its_remaining_blocks_against_loads(logs):
    log = logs["reserved_by_chunk"]  # R: 600 tokens in 128-token chunks (38 blocks); L: a 16-block load
    assert at(log, 1)["free_blocks"] == 34 and at(log, 1)["loading"] == []  # 16 > 34 - (38 - 16)
    assert steps_with(log, "loading", "L") == [6]


@live
def test_answering_only_the_first_query_turns_a_refused_load_into_a_local_prefill(logs):
    log = logs["reserved_first_query"]
    assert at(log, 1)["loading"] == ["L1"]
    assert at(log, 2)["scheduled"] == {"L2": 256, "P": 16}  # the second query got (0, False)
    assert steps_with(log, "loading", "L2") == []


@live
def test_a_load_must_first_fit_its_whole_prompt_unless_reserve_full_isl_is_off(logs):
    on, off = logs["load_full_fit"], logs["load_full_fit_off"]  # L: 400 tokens (25 blocks), 64 loaded (4)
    assert at(on, 1)["free_blocks"] == 19 and steps_with(on, "loading", "L") == [12]  # 25 > 19: after R
    assert at(off, 1)["loading"] == ["L"] and at(off, 1)["free_blocks"] == 15  # 4 <= 19
    # promoted at step 2, its 336-token chunk (21 blocks) does not fit 15: it holds its 4 blocks until R is done
    assert all(at(off, s)["loading"] == [] and at(off, s)["scheduled"] == {"R": 1} for s in range(2, 12))
    assert at(off, 12)["scheduled"] == {"L": 336}


@live
def test_loads_start_beyond_max_num_seqs_but_promotions_respect_it(logs):
    log = logs["seqs"]  # max_num_seqs 2, four loads
    assert at(log, 0)["loading"] == ["l0", "l1", "l2", "l3"] and at(log, 1)["recv_done"] == ["l0", "l1", "l2", "l3"]
    # l2, l3 are not reached while two run: they stay WAITING_FOR_REMOTE_KVS though their recv is done
    assert at(log, 2)["scheduled"] == {"l0": 1, "l1": 1} and at(log, 2)["loading"] == ["l2", "l3"]
    assert at(log, 5)["scheduled"] == {"l2": 1, "l3": 1}


@live
def test_no_load_starts_while_the_running_requests_fill_max_num_seqs(logs):
    log = logs["seqs_full"]  # max_num_seqs 1: r runs steps 0-5, l arrives at 1
    assert steps_with(log, "loading", "l") == [6]


@live
def test_no_load_starts_in_a_step_whose_token_budget_is_spent(logs):
    log = logs["budget"]  # budget 64: r's prefill takes it all at step 0
    assert at(log, 0)["scheduled"] == {"r": 64} and at(log, 0)["loading"] == []
    assert at(log, 1)["loading"] == ["l"] and at(log, 1)["scheduled"] == {"r": 1}


@live
def test_the_watermark_applies_to_loads_while_something_runs(logs):
    on, off = logs["watermark"], logs["no_watermark"]  # l: 17 blocks; free 19 while r runs; watermark 4 blocks
    assert at(off, 1)["loading"] == ["l"] and at(off, 1)["free_blocks"] == 2
    assert steps_with(on, "loading", "l") == [30]  # only once r is done (nothing running: no watermark)


@live
def test_a_request_preempted_after_its_load_recomputes_everything_locally(logs):
    log = logs["preempted_after_load"]
    assert at(log, 0)["loading"] == ["l"] and at(log, 0)["free_blocks"] == 0
    assert at(log, 1)["scheduled"] == {"r": 1, "l": 1}
    assert at(log, 2)["preempted"] == ["l"] and at(log, 2)["free_blocks"] == 4  # l needs a 5th block
    assert at(log, 8)["scheduled"] == {"l": 65}  # 64 prompt + 1 output token, no second load
    assert steps_with(log, "loading", "l") == [0]


@live
def test_the_long_prefill_threshold_cuts_a_promoted_prefill_only_with_another_request_around(logs):
    assert [at(logs["threshold"], s)["scheduled"].get("a") for s in (1, 2, 3)] == [50, 50, 36]
    assert at(logs["threshold_alone"], 1)["scheduled"] == {"a": 136}  # a loading request counts as one


@live
def test_the_connector_is_asked_beyond_the_local_prefix_hit(logs):
    log = logs["prefix_cache"]  # b shares a's 128 tokens: a local hit of 112 (7 blocks), 16 loaded
    assert at(log, 4)["loading"] == ["b"] and at(log, 4)["free_blocks"] == 63 - 8
    assert at(log, 5)["scheduled"] == {"b": 1}


# ---- the producer: blocks pinned after finish until the send ----

@live
def test_a_producer_pins_a_finished_requests_blocks_until_its_send_is_reported(logs):
    log = logs["producer"]  # s0..s3 finish at steps 1..4 with send_steps 0, 1, 3, None
    assert [steps_with(log, "finished", f"s{i}") for i in range(4)] == [[1], [2], [3], [4]]
    assert steps_with(log, "pinned", "s0") == [1] and steps_with(log, "sent_done", "s0") == [2]
    assert steps_with(log, "pinned", "s1") == [2, 3] and steps_with(log, "sent_done", "s1") == [4]
    assert steps_with(log, "pinned", "s2") == [3, 4, 5, 6] and steps_with(log, "sent_done", "s2") == [7]
    assert steps_with(log, "pinned", "s3") == list(range(4, len(log)))  # never sent
    assert column(log, "free_blocks") == [60, 56, 56, 52, 55, 55, 55, 59]  # s3's 4 blocks never come back


@live
def test_pinned_blocks_stay_in_the_prefix_cache_for_later_requests(logs):
    log = logs["pinned_shared"]  # a: 64 tokens, never sent; b: the same 64 and 32 more
    assert at(log, 3)["pinned"] == ["a"] and at(log, 3)["free_blocks"] == 58
    assert at(log, 4)["scheduled"] == {"b": 32} and at(log, 4)["free_blocks"] == 56  # 2 new blocks only
    assert at(log, 6)["sent_done"] == ["b"] and at(log, 6)["free_blocks"] == 58  # the shared 4 stay with a


@live
def test_a_producer_ignores_external_tokens_and_role_both_does_both(logs):
    assert all(r["loading"] == [] for r in logs["producer_ignores_loads"])
    log = logs["both"]
    assert steps_with(log, "loading", "a") == [0, 1] and steps_with(log, "pinned", "a") == [3, 4]
    assert steps_with(log, "sent_done", "a") == [5] and log[-1]["free_blocks"] == 63
    assert at(log, 1)["aborted"] == ["b"] and steps_with(log, "pinned", "b") == []  # an abort is not sent


# ---- the generated shapes: the driver keeps its own timing on every request ----

@live
@pytest.mark.parametrize("name", sorted(SHAPE_JOBS))
def test_a_generated_shape_keeps_the_load_and_send_timing_of_its_trace(logs, name):
    rows, _ = SHAPE_JOBS[name]
    log = logs[name]
    for r in log:
        assert not set(r["loading"]) & set(r["scheduled"]) and r["free_blocks"] >= 0
    for row in rows:
        rid = row["id"]
        loading = steps_with(log, "loading", rid)
        if "external_tokens" in row and "--kv-role producer" not in " ".join(SHAPE_JOBS[name][1]):
            assert loading, rid  # every load starts (the pool fits each prompt)
            load_steps = row.get("load_steps", 1)
            expected = [] if load_steps is None else [loading[0] + load_steps - 1]
            assert steps_with(log, "recv_done", rid) == expected, rid
        else:
            assert not loading, rid
        finished = steps_with(log, "finished", rid)
        if "send_steps" in row:
            (t,) = finished
            sent = steps_with(log, "sent_done", rid)
            assert sent == ([] if row["send_steps"] is None else [t + 1 + row["send_steps"]]), rid
            assert steps_with(log, "pinned", rid) == list(range(t, sent[0] if sent else len(log))), rid
        elif row.get("load_steps", 1) is not None and "abort_step" not in row:
            assert len(finished) == 1, rid
    if name == "shape_pressure":
        assert sum(len(r["preempted"]) for r in log) > 0 and sum(len(r["loading"]) > 0 for r in log) > 10


# ---- the recorded logs ----

@live
def test_the_recorded_logs_are_what_the_driver_writes_today(logs):
    stale = [name for name in FACT_CASES if recorded(name) != logs[name]]
    assert not stale, f"re-record with tests.vllm_connector_harness.record(): {stale}"


def test_every_fact_case_has_a_recorded_log():
    for name in FACT_CASES:
        log = recorded(name)
        assert log and [r["step"] for r in log] == list(range(len(log)))
        assert {"loading", "recv_done", "sent_done", "pinned", "pinned_load"} <= set(log[0])
    assert sorted(p.name.removesuffix(".log.jsonl") for p in FIXTURES.glob("*.log.jsonl")) == sorted(FACT_CASES)


def test_the_venv_is_none_when_absent(monkeypatch, tmp_path):
    monkeypatch.setenv("BATCHCHECK_VLLM_VENV", str(tmp_path / "nowhere"))
    assert venv_python() is None
    assert "BATCHCHECK_VLLM_VENV" in (absent_reason() or "")


def test_the_generated_shapes_are_traces_the_driver_reads(tmp_path):
    for name, shape in SHAPES.items():
        rows, driver_flags = shape()
        assert rows and len({r["id"] for r in rows}) == len(rows), name
        assert all(r.get("load_steps", 1) is None or r.get("load_steps", 1) >= 1 for r in rows), name
        assert "--kv-role" in driver_flags, name
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(rows))
        assert json.loads(path.read_text()) == rows
    assert read_log(FIXTURES / "hung.log.jsonl")[-1]["loading"] == ["h"]


@live
def test_grammar_futures_and_failed_loads_reproduce_the_kept_logs(logs):
    """The blocked waiting and failed-load cases (tests/data/vllm_blocked/, which test_blocked_conformance.py compares
    with the engine) come out of a fresh run byte for byte; the facts they show: a request whose grammar is not
    ready is skipped and keeps its place; a failed load under fail ends its request at its report."""
    for name in BLOCKED_CASES:
        text = "".join(json.dumps(row) + "\n" for row in logs[f"blocked_{name}"])
        assert text == (BLOCKED_FIXTURES / f"{name}.log.jsonl").read_text(), name
    skip = logs["blocked_grammar_skip"]
    assert [sorted(at(skip, k)["scheduled"]) for k in range(4)] == [["P"], ["P", "Q"], ["P", "Q"], ["G"]]
    fail = logs["blocked_load_fail"]
    assert at(fail, 1)["finished"] == ["F"] and at(fail, 1)["loading"] == ["F", "L"]
