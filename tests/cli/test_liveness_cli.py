"""batchcheck liveness: verdict lines, the starvation bound, exit codes, lasso files and replay, errors."""

from __future__ import annotations

import json
import re

import pytest

from checker.cli import main
from tests.helpers import POLICIES

STRICT = str(POLICIES / "strict_priority.yaml")
AGING = str(POLICIES / "priority_aging.yaml")


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_finds_the_starvation_lasso_and_replay_runs_two_turns(capsys, tmp_path):
    code, out, err = run(capsys, "liveness", STRICT, "--set", "batch.max_num_seqs=1", "--property",
                         "eventually_served", "--out", str(tmp_path))
    assert code == 1, err
    lines = out.splitlines()
    assert lines[0] == f"policy {STRICT} with batch.max_num_seqs=1; assumptions:"
    assert lines[2] == ("  - prompt tokens in {16}, output tokens in {1, 2} (declared max output = output), "
                        "priorities in {0, 1}, 1 tenant(s)")
    assert lines[4].startswith("graph: 17 states, 58 edges, ")
    assert lines[4].endswith(" s (complete); 65 successor states generated")
    (path,) = tmp_path.glob("strict_priority__eventually_served_lasso__*.json")
    assert lines[5] == ("VIOLATED           eventually_served  lasso: 1 iteration(s) to a cycle of 1 that repeats "
                        "forever (a request stays live on it); replayed on the engine (prefix + two turns): "
                        f"{path}")
    assert lines[6] == ("starvation bound: none (the eventually_served lasso keeps a request waiting forever, "
                        "after a preemption or before its first admission)")
    doc = json.loads(path.read_text())
    assert doc["property"]["kind"] == "liveness" and doc["lasso"]["replayed_iterations"] == 3
    assert doc["environment"]["policy_overrides"] == ["batch.max_num_seqs=1"] and doc["graph"]["complete"]

    code, out, _ = run(capsys, "replay", str(path))
    assert code == 1
    assert out.splitlines()[-1] == "eventually_served VIOLATED at iteration 2 (recorded: iteration 2)"
    assert len(out.splitlines()) == 1 + 1 + 3 + 1  # head, table header, prefix + two turns, verdict

    # the policy file has 256 running slots, but the lasso was found with --set batch.max_num_seqs=1: the
    # replay re-applies the recorded override (it used to drop it and call the starvation fixed)
    code, out, _ = run(capsys, "replay", str(path), "--policy", STRICT)
    assert code == 1
    assert out.splitlines()[0].endswith("with the overrides it was found with (batch.max_num_seqs=1)")
    assert out.splitlines()[-1] == "eventually_served VIOLATED at iteration 2 (recorded: iteration 2)"


def test_proves_aging_and_prints_the_starvation_bound(capsys, tmp_path):
    code, out, err = run(capsys, "liveness", AGING, "--set", "batch.max_num_seqs=1", "--step-ms", "500",
                         "--outputs", "1", "--out", str(tmp_path))
    assert code == 0, err
    lines = out.splitlines()
    assert [line.split()[:2] for line in lines[5:8]] == [["PROVED", "eventually_served"], ["PROVED", "no_livelock"],
                                                         ["PROVED", "no_deadlock"]]
    assert lines[5].endswith("no lasso in the complete graph: for this instance, any number of iterations")
    assert lines[8] == ("starvation bound: 2 iteration(s): bounded_starvation(2) holds for this instance and "
                        "bounded_starvation(1) does not (witness: 3 request(s), a request arriving at iteration 0 "
                        "still waits after iteration 1; replayed on the engine: violated at iteration 1)")
    assert "safe" not in out.lower() and not list(tmp_path.iterdir())


def test_json_and_a_cut_off_graph_is_inconclusive(capsys, tmp_path):
    code, out, _ = run(capsys, "liveness", str(POLICIES / "vllm_v1.yaml"), "--set", "kv.num_blocks=8",
                       "--requests", "3", "--prompts", "16,48", "--outputs", "1:3", "--max-states", "50",
                       "--json", "--out", str(tmp_path))
    assert code == 3
    doc = json.loads(out)
    assert doc["graph"]["complete"] is False and doc["graph"]["stop_reason"] == "state limit (50) reached"
    assert {r["verdict"] for r in doc["results"]} == {"NO_COUNTEREXAMPLE"} and doc["exit_code"] == 3
    assert doc["environment"]["prompt_tokens"] == [16, 48] and doc["environment"]["output_tokens"] == [1, 2, 3]


@pytest.mark.parametrize("argv,message", [
    (["--set", "batch.max_num_sqs=1"], "batchcheck: error: --set: batch.max_num_sqs=1 (expected a known key; "
                                       "did you mean max_num_seqs? allowed here: max_num_batched_tokens, max_num_seqs, phase_mode, prefill_share)"),
    (["--set", "batch"], "batchcheck: error: --set='batch' (expected FIELD.PATH=VALUE, e.g. batch.max_num_seqs=1)"),
    (["--prompts", "0"], "batchcheck: error: --prompts=0 (expected token counts >= 1)"),
    (["--step-ms", "300"], "batchcheck: error: --step-ms=300.0 (expected a divisor of the aging interval (1000 ms), "
                           "so that ages are whole iterations)"),
])
def test_bad_input_is_one_line_and_exit_2(capsys, tmp_path, argv, message):
    code, out, err = run(capsys, "liveness", AGING, *argv, "--out", str(tmp_path))
    assert code == 2 and out == ""
    assert err.splitlines() == [message]


def _masked(out: str) -> list[str]:
    """Output lines with the exploration time (the only part that differs between two runs) masked."""
    return [re.sub(r"edges, [0-9.]+ s \(", "edges, T s (", line) for line in out.splitlines()]


def test_verify_liveness_is_the_liveness_verb(capsys, tmp_path):
    argv = [STRICT, "--set", "batch.max_num_seqs=1", "--property", "eventually_served", "--property", "no_deadlock"]
    code, out, err = run(capsys, "liveness", *argv, "--out", str(tmp_path / "verb"))
    code_v, out_v, err_v = run(capsys, "verify", *argv, "--liveness", "--out", str(tmp_path / "verify"))
    assert (code, code_v) == (1, 1), err + err_v
    assert _masked(out_v.replace(str(tmp_path / "verify"), str(tmp_path / "verb"))) == _masked(out)
    lines = _masked(out_v)
    assert lines[1].startswith("  - at most 2 request(s) in the system at once")  # the liveness default, not verify's 3
    assert lines[4] == "graph: 17 states, 58 edges, T s (complete); 65 successor states generated"
    assert lines[5].startswith("VIOLATED           eventually_served  lasso: 1 iteration(s) to a cycle of 1")
    assert lines[6].startswith("PROVED             no_deadlock")
    (verb_file,) = (tmp_path / "verb").glob("strict_priority__eventually_served_lasso__*.json")
    (verify_file,) = (tmp_path / "verify").glob("strict_priority__eventually_served_lasso__*.json")
    assert verify_file.name == verb_file.name and lines[5].endswith(str(verify_file))
    assert json.loads(verify_file.read_text())["lasso"] == json.loads(verb_file.read_text())["lasso"]

    code, out, _ = run(capsys, "verify", AGING, "--liveness", "--set", "batch.max_num_seqs=1", "--step-ms", "500",
                       "--outputs", "1", "--requests", "2", "--json", "--out", str(tmp_path / "verify"))
    doc = json.loads(out)
    assert code == 0 and doc["exit_code"] == 0 and doc["starvation_bound"]["iterations"] == 2
    assert [r["verdict"] for r in doc["results"]] == ["PROVED", "PROVED", "PROVED"]


@pytest.mark.parametrize("argv,message", [
    (["--liveness", "--depth", "3"], "batchcheck: error: --depth is not an option of verify --liveness"),
    (["--liveness", "--invariant", "kv_never_overcommitted"],
     "batchcheck: error: --invariant is not an option of verify --liveness"),
    (["--prompts", "16"], "batchcheck: error: --prompts needs --liveness (it describes a liveness instance)"),
    (["--property", "no_livelock"], "batchcheck: error: --property needs --liveness (it describes a liveness instance)"),
])
def test_verify_keeps_bounded_and_liveness_options_apart(capsys, tmp_path, argv, message):
    code, out, err = run(capsys, "verify", STRICT, *argv, "--out", str(tmp_path))
    assert code == 2 and out == ""
    assert len(err.splitlines()) == 1 and err.startswith(message)
    assert not tmp_path.exists() or not list(tmp_path.iterdir())


def test_the_default_instance_of_a_priority_policy_is_vacuous_not_proved(capsys):
    """Issue 19 item 2: the default liveness run of strict_priority (2 requests, 256 slots) once said PROVED on a
    7-state graph; the instance never reaches the limits, so it is VACUOUS (exit 3) and says what to change."""
    code, out, _ = run(capsys, "liveness", STRICT, "--property", "eventually_served")
    assert code == 3, out
    verdict = next(line for line in out.splitlines() if line.startswith(("PROVED", "VACUOUS")))
    assert verdict == (
        "VACUOUS            eventually_served  no lasso in the complete graph, but no request ever waits in this "
        "instance (2 request(s) in flight, every arrival admitted in its iteration, none rejected): the policy's "
        "limits (batch.max_num_seqs=256, batch.max_num_batched_tokens=8192, kv.num_blocks=2500) are never reached, "
        "so the property holds trivially; give more --requests, or smaller limits with --set (e.g. --set "
        "batch.max_num_seqs=1)")


def test_a_request_preempted_then_waiting_forever_has_no_starvation_bound(capsys, tmp_path):
    """Issue 19 item 6: on a 2-block pool every arrival of strict_priority is admitted in its iteration (a bound on
    first admission alone would be 0), but request 0 is preempted at iteration 1 by a more urgent arrival and waits
    forever behind the next ones: the bound must cover re-admission, so there is none."""
    code, out, _ = run(capsys, "liveness", STRICT, "--set", "kv.num_blocks=2", "--property", "eventually_served",
                       "--out", str(tmp_path))
    assert code == 1, out
    lines = out.splitlines()
    assert lines[-1] == ("starvation bound: none (the eventually_served lasso keeps a request waiting forever, "
                         "after a preemption or before its first admission)")
    (path,) = tmp_path.glob("strict_priority__eventually_served_lasso__*.json")
    code, out, _ = run(capsys, "replay", str(path))
    rows = [line.split() for line in out.splitlines()[2:-1]]
    assert code == 1 and rows[0][3] == "0:16" and rows[1][4] == "0"  # request 0 admitted, then preempted
    assert all(row[3] != "0:16" for row in rows[1:])  # and never scheduled again
