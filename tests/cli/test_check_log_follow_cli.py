"""check-log --follow: a log followed while another process appends to it (like tail -f), and the arrivals
file's prefix-cache fields (prefix_group, hash_ids, hash_block_tokens) with their error messages."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from checker.checklog import engine_log, load_arrivals
from checker.inputfiles import load_policy
from checker.requests import content_from_hash_ids, content_from_prefix_group
from tests.cli.test_check_log_cli import ARRIVALS, POLICY, run

# Appends the lines of SOURCE to DEST, DELAY seconds apart; a line is written in two halves (the reader must
# wait for its newline); after line PAUSE_AT it sleeps PAUSE seconds. DEST does not exist until the first line.
WRITER = """
import sys, time
source, dest, delay, pause_at, pause = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
time.sleep(0.3)
with open(dest, "w") as out:
    for i, line in enumerate(open(source)):
        half = len(line) // 2
        out.write(line[:half]); out.flush(); time.sleep(delay / 2)
        out.write(line[half:]); out.flush(); time.sleep(delay / 2)
        if i + 1 == pause_at:
            time.sleep(pause)
"""


@pytest.fixture
def writer(tmp_path):
    """Start a process that writes the log slowly; yields a function (lines, delay, pause_at, pause) -> paths."""
    procs = []

    def start(lines, delay=0.02, pause_at=-1, pause=0.0):
        arrivals = tmp_path / "arrivals.json"
        arrivals.write_text(json.dumps(ARRIVALS))
        source = tmp_path / "source.jsonl"
        source.write_text("".join(json.dumps(line) + "\n" for line in lines))
        dest = tmp_path / "log.jsonl"
        procs.append(subprocess.Popen([sys.executable, "-c", WRITER, str(source), str(dest), str(delay),
                                       str(pause_at), str(pause)]))
        return str(dest), str(arrivals)

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def reference_lines(tmp_path, steps=120):
    arrivals = tmp_path / "ref_arrivals.json"
    arrivals.write_text(json.dumps(ARRIVALS))
    return engine_log(load_policy(POLICY), load_arrivals(arrivals), steps)


def test_follow_stops_when_every_request_is_done_and_prints_progress(capsys, tmp_path, writer):
    lines = reference_lines(tmp_path)  # every request is done at step 60; the rest are idle steps
    log, arrivals = writer(lines, delay=0.03)
    started = time.monotonic()
    code, out, _ = run(capsys, "check-log", str(POLICY), log, "--arrivals", arrivals, "--conformance", "--follow",
                       "--follow-idle-s", "5")
    assert code == 0, out
    assert time.monotonic() - started < 0.3 + 120 * 0.03  # it did not wait for the idle steps after 60
    text = out.splitlines()
    assert any(line.startswith(f"following {log}: ") and "requests done, no violation; conformance" in line
               for line in text)
    assert text[-3:] == [f"{log}: 61 steps, no violation of kv_never_overcommitted, token_budget, seq_cap, "
                         "request_conservation, scheduled_requests_run, cancellation_releases",
                         f"conformance with the engine under {POLICY}: 61/61 steps agree (100.0 %)",
                         f"stopped following {log}: all 4 requests finished or aborted"]


def test_follow_stops_at_a_violation_while_the_log_still_grows(capsys, tmp_path, writer):
    lines = reference_lines(tmp_path)
    lines[7]["scheduled"]["a"] = 9000
    log, arrivals = writer(lines, delay=0.02, pause_at=10, pause=30)  # then it waits 30 s before writing more
    started = time.monotonic()
    code, out, _ = run(capsys, "check-log", str(POLICY), log, "--arrivals", arrivals, "--follow")
    assert code == 1
    assert time.monotonic() - started < 10
    assert f"{log}: token_budget VIOLATED at step 7 (log line 8)" in out.splitlines()


def test_follow_gives_the_verdict_so_far_after_an_idle_timeout(capsys, tmp_path, writer):
    lines = reference_lines(tmp_path)[:25]
    log, arrivals = writer(lines, delay=0.01)
    code, out, _ = run(capsys, "check-log", str(POLICY), log, "--arrivals", arrivals, "--conformance", "--follow",
                       "--follow-idle-s", "0.8")
    assert code == 0, out
    assert out.splitlines()[-3:] == [
        f"{log}: 25 steps, no violation of kv_never_overcommitted, token_budget, seq_cap, request_conservation, "
        "scheduled_requests_run, cancellation_releases",
        f"conformance with the engine under {POLICY}: 25/25 steps agree (100.0 %)",
        f"stopped following {log}: no new line for 0.8 s (0/4 requests done)"]


def test_follow_a_log_that_never_appears_is_an_input_error(capsys, tmp_path):
    arrivals = tmp_path / "arrivals.json"
    arrivals.write_text(json.dumps(ARRIVALS))
    missing = tmp_path / "never.jsonl"
    code, _, err = run(capsys, "check-log", str(POLICY), str(missing), "--arrivals", str(arrivals), "--follow",
                       "--follow-idle-s", "0.3")
    assert code == 2
    assert err == f"batchcheck: error: {missing}: (document)='{missing}' (expected an existing file)\n"


def test_follow_idle_without_follow_is_a_usage_error(capsys, tmp_path):
    code, _, err = run(capsys, "check-log", str(POLICY), "log.jsonl", "--arrivals", "a.json", "--follow-idle-s", "3")
    assert code == 2 and "--follow-idle-s goes with --follow" in err


# ----------------------------------------------------------------------------------------- prefix-cache fields
def test_prefix_fields_give_each_request_its_token_identity(tmp_path):
    rows = [{"id": "late", "arrival_step": 9, "prompt_tokens": 1000, "output_tokens": 5, "hash_ids": [4, 7]},
            {"id": "grouped", "arrival_step": 0, "prompt_tokens": 300, "output_tokens": 5, "prefix_group": 3},
            {"id": "small_blocks", "arrival_step": 2, "prompt_tokens": 33, "output_tokens": 5,
             "hash_ids": [1, 0, 2], "hash_block_tokens": 16},
            {"id": "own", "arrival_step": 1, "prompt_tokens": 40, "output_tokens": 5}]
    path = tmp_path / "arrivals.json"
    path.write_text(json.dumps(rows))
    arr = load_arrivals(path)
    content = {arr.ids[s.rid]: s.content for s in arr.specs}
    # the row's position in the file is the index (how the harness numbers a request's own tokens), not its arrival
    assert content == {"late": content_from_hash_ids([4, 7], 512, 1000, 0),
                       "grouped": content_from_prefix_group(3, 300),
                       "small_blocks": content_from_hash_ids([1, 0, 2], 16, 33, 2),
                       "own": None}
    # the token ids the harness builds: (10 + h) * 10**6 + j for position j of hash id h's block
    assert content["late"] == ((14 * 10**6, 512), (17 * 10**6, 488))


@pytest.mark.parametrize("fields, message", [
    ({"hash_ids": [5]}, "[1].hash_ids='1 ids' (expected 2 ids: ceil(prompt 600 / hash_block_tokens 512), so that "
                        "the ids cover the prompt)"),
    ({"hash_ids": [5, 6, 7]}, "[1].hash_ids='3 ids' (expected 2 ids: ceil(prompt 600 / hash_block_tokens 512), so "
                              "that the ids cover the prompt)"),
    ({"hash_ids": [1, 2, 3], "hash_block_tokens": 256}, None),
    ({"hash_ids": [5, -1]}, "[1].hash_ids=-1 (expected ids >= 0)"),
    ({"hash_ids": [5, 5]}, "[1].hash_ids=5 (expected each id at most once in one request (a block's tokens appear "
                           "once in a prompt))"),
    ({"hash_ids": [5, 6], "prefix_group": 2}, "[1].prefix_group=2 (expected no prefix_group when hash_ids are given "
                                              "(one prompt identity))"),
    ({"hash_ids": [5, "6"]}, "[1].hash_ids[1]='6' (expected a whole number >= 0)"),
    ({"hash_ids": [5, 6.0]}, "[1].hash_ids[1]=6.0 (expected a whole number >= 0)"),
    ({"hash_ids": [True, 6]}, "[1].hash_ids[0]=True (expected a whole number >= 0)"),
    ({"hash_ids": "5,6"}, "[1].hash_ids='5,6' (expected a list of whole numbers >= 0, one per hash block of the "
                          "prompt)"),
    ({"hash_ids": [5, 6], "hash_block_tokens": 0}, "[1].hash_block_tokens=0 (expected a whole number >= 1 (prompt "
                                                   "tokens per hash id, default 512))"),
    ({"hash_ids": [5, 6], "hash_block_tokens": 512.0}, "[1].hash_block_tokens=512.0 (expected a whole number >= 1 "
                                                       "(prompt tokens per hash id, default 512))"),
    ({"prefix_group": -1}, "[1].prefix_group=-1 (expected a whole number >= 0 (requests of one group share their "
                           "prompt's first tokens))"),
    ({"prefix_group": "a"}, "[1].prefix_group='a' (expected a whole number >= 0 (requests of one group share their "
                            "prompt's first tokens))"),
    ({"prefix_group": None}, "[1].prefix_group=None (expected a whole number >= 0 (requests of one group share their "
                             "prompt's first tokens))"),
])
def test_bad_prefix_fields_are_input_errors_naming_row_field_value_and_what_is_allowed(capsys, tmp_path, fields,
                                                                                      message):
    rows = [{"id": "a", "arrival_step": 0, "prompt_tokens": 100, "output_tokens": 4},
            {"id": "b", "arrival_step": 1, "prompt_tokens": 600, "output_tokens": 4, **fields}]
    arrivals = tmp_path / "arrivals.json"
    arrivals.write_text(json.dumps(rows))
    log = tmp_path / "log.jsonl"
    log.write_text(json.dumps({"step": 0, "scheduled": {"a": 100}, "preempted": [], "finished": [], "aborted": [],
                               "running": 1, "waiting": 0, "free_blocks": 25}) + "\n")
    code, out, err = run(capsys, "check-log", str(POLICY), str(log), "--arrivals", str(arrivals))
    if message is None:
        assert code == 0, err
    else:
        assert code == 2
        assert err == f"batchcheck: error: {arrivals}: {message}\n"
