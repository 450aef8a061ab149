"""batchcheck report on liveness lasso files (batchcheck liveness): exit code, key markdown lines word for word,
the PNG; a tampered lasso whose cycle does not repeat is reported loudly as not reproducing."""

from __future__ import annotations

import json

import pytest

from checker.cli import main
from tests.helpers import ROOT

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _lasso(pattern: str):
    (path,) = (ROOT / "counterexamples").glob(pattern)
    return path


STARVED = _lasso("strict_priority__eventually_served_lasso__*.json")
THRASH = _lasso("thrash_recompute__no_livelock_lasso__*.json")
STUCK = _lasso("vllm_v1_small_pool__no_deadlock_lasso__*.json")


def _report(capsys, path, out) -> tuple[int, str, list[str]]:
    code = main(["report", str(path), "--out", str(out)])
    stdout, err = capsys.readouterr()
    assert code == 0, err
    md, png = out / f"{path.stem}.md", out / f"{path.stem}.png"
    assert png.read_bytes().startswith(PNG_SIGNATURE) and len(png.read_bytes()) > 10_000
    assert sorted(p.name for p in out.iterdir()) == sorted([md.name, png.name])
    return code, stdout, md.read_text().splitlines()


def _has(lines: list[str], expected: list[str]) -> None:
    for line in expected:
        assert line in lines, line


def test_eventually_served_lasso(capsys, tmp_path):
    _, stdout, lines = _report(capsys, STARVED, tmp_path)
    assert stdout.splitlines()[0] == (f"{tmp_path / STARVED.stem}.md: bug report (eventually_served VIOLATED: the cycle "
                                      "repeats, closing at iteration 2 (recorded: iteration 2))")
    assert lines[0] == "# strict_priority violates eventually_served"
    _has(lines, [
        "| verdict | **VIOLATED by a lasso: 1 iteration(s) to a cycle of 1 that repeats forever (found by batchcheck "
        "liveness: explicit state graph (networkx), canonical states, lasso search)** |",
        "| replayed on the engine | eventually_served VIOLATED: the cycle repeats, closing at iteration 2 (recorded: "
        "iteration 2) |",
        "- prefix: iteration 0 (1 iteration), from the empty system",
        "- cycle: 1 iteration, replayed twice: turn 1 is iteration 1, turn 2 is iteration 2",
        "- on the replay, the canonical state (docs/liveness.md) after iteration 0, after iteration 1 and after "
        "iteration 2 is the same, so the cycle can repeat forever",
        "- req 1 is live when the cycle starts and stays live through both turns, never served (turn 1, per "
        "iteration: 1: waiting)",
        "- meanwhile finished: req 2 in turn 1, req 3 in turn 2 (each arrival in a turn is a new request)",
        "- policy overrides it was found with: `batch.max_num_seqs=1`",
        "- state graph: 17 states, 58 edges, 0.005 s; complete: every state reachable in this environment was explored",
        "| 1 | 10 | 2 | 2 | 2:16 | - | 2 | - | 0/2500 | 0 | 1 | cycle, turn 1 | holds |",
        "| 2 | 20 | 3 | 3 | 3:16 | - | 3 | - | 0/2500 | 0 | 1 | cycle, turn 2 | **VIOLATED** |",
        f"batchcheck replay {STARVED}",
    ])
    # the file was found with --set batch.max_num_seqs=1: the excerpt is the file's, the overridden line marked
    assert ("Rules that decide this property: `queue.order`, `queue.aging_interval_ms`, `queue.head_of_line`, "
            "`preemption.triggers`, `batch.max_num_seqs`. From `spec/policies/strict_priority.yaml`, line numbers on "
            "the left (it holds the policy the counterexample was found with once `batch.max_num_seqs=1` is applied: "
            "same hash):") in lines
    assert "15    max_num_seqs: 256  # overridden: batch.max_num_seqs=1" in lines


def test_no_livelock_lasso(capsys, tmp_path):
    _, _, lines = _report(capsys, THRASH, tmp_path)
    assert lines[0] == "# thrash_recompute violates no_livelock"
    _has(lines, [
        "- prefix: iterations 0-2 (3 iterations), from the empty system",
        "- cycle: 3 iterations, replayed twice: turn 1 is iterations 3-5, turn 2 is iterations 6-8",
        "- tokens scheduled: 128 in turn 1, 128 in turn 2; finished: none; cancelled: none; preempted: req 0 in turn 1, "
        "req 0 in turn 2: work is done and thrown away, no completion",
        "| 3-4 | 30-40 | - | 0 | 0:64 | - | - | - | 2->4/4 | 1 | 0 | cycle, turn 1 | holds |",
        "| 8 | 80 | - | - | - | 0 | - | - | 0/4 | 0 | 1 | cycle, turn 2 | **VIOLATED** |",
        "13    reject_never_fits: false",
        "33    mode: recompute",
    ])


def test_no_deadlock_lasso(capsys, tmp_path):
    _, _, lines = _report(capsys, STUCK, tmp_path)
    assert lines[0] == "# vllm_v1_small_pool violates no_deadlock"
    _has(lines, [
        "**`no_deadlock`** (liveness, violated by a lasso: a prefix, then a cycle the system can repeat forever): No "
        "cycle the system can repeat leaves live requests without any token scheduled while no client cancels (the "
        "unbounded form of no_deadlock(steps) for every steps).",
        "- live when the cycle starts: req 0, req 1; tokens scheduled: 0 in turn 1, 0 in turn 2; cancelled: none",
        "- nothing can progress: every iteration of both turns starts with live requests, schedules no token, and no "
        "client cancels",
        "    # admission.reject_never_fits: false  (not in the file: the default)",
    ])


@pytest.mark.parametrize("kind", ["output", "params"])
def test_a_tampered_lasso_does_not_reproduce(capsys, tmp_path, kind):
    doc = json.loads(STARVED.read_text())
    if kind == "output":  # the turn-2 arrival stays running: the state after two turns is not the one after one
        doc["requests"][3]["output_tokens"] = doc["requests"][3]["max_output_tokens"] = 2
        tampered = tmp_path / "tampered.json"
        tampered.write_text(json.dumps(doc, indent=1))
        _, stdout, lines = _report(capsys, tampered, tmp_path / "out")
        assert stdout.splitlines()[0].endswith("bug report (eventually_served holds on the replay: the lasso does not "
                                               "reproduce, the engine no longer fails it (recorded: the cycle closes at "
                                               "iteration 2))")
        _has(lines, [
            "| replayed on the engine | **eventually_served holds on the replay: the lasso does not reproduce, the "
            "engine no longer fails it (recorded: the cycle closes at iteration 2)** |",
            "**The engine no longer fails this property on the trace**: the semantics changed since the "
            "counterexample was found, or it was edited. The tables below show what the engine does now.",
            "- **on the replay the cycle does not repeat**: the canonical state (docs/liveness.md) after iteration 0, "
            "after iteration 1 and after iteration 2 is not the same",
            "| 2 | 20 | 3 | 3 | 3:16 | - | - | - | 1/2500 | 1 | 1 | cycle, turn 2 | holds |",
        ])
        return
    doc["property"]["params"]["cycle"] = 2  # a lasso that does not end where the file says: bad input, exit 2
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc, indent=1))
    code = main(["report", str(bad), "--out", str(tmp_path / "out")])
    _, err = capsys.readouterr()
    assert code == 2 and not (tmp_path / "out").exists()
    assert err.endswith(": violation.iteration=2 (expected 4: the last iteration of the second turn (prefix + 2 x "
                        "cycle - 1))\n")
