"""diff's side verdicts on worker processes give the rows and exit code of a serial run; a row whose breaking side
timed out asks no product query (it cannot be easier than the search that timed out) and says "undecided", never
"ok"; a counterexample of one side is replayed on an undecided other side before any product query (issue 19: the
default diff of a one-knob change in <= 2 min)."""

from __future__ import annotations

import pytest
import yaml

from checker.api import run_diff
from checker.cli import main
from checker.diff.compare import Change, Pair, compare_invariant, diff_invariant, proof_first
from checker.diff.sides import units
from checker.exitcodes import ExitCode
from checker.inputfiles import load_policy
from checker.policy import Policy
from checker.verify.env import default_environment
from checker.verify.run import Verdict, check_one, parse_invariant
from tests.helpers import POLICIES

V1, SMALL_POOL = POLICIES / "vllm_v1.yaml", POLICIES / "broken" / "vllm_v1_small_pool.yaml"
SMALL = dict(requests=2, depth=3, prompt=(1, 4096), output=(1, 8))


def _halved() -> Policy:
    """vllm_v1 with a cap that 2 or 3 request slots reach (a cap they cannot reach is decided on OLD alone:
    tests/unit/test_limits.py)."""
    doc = yaml.safe_load(V1.read_text())
    doc["batch"]["max_num_seqs"] = 2
    return Policy.model_validate(doc)


def _rows(report) -> list[dict]:
    rows = report.as_dict()["properties"]
    for row in rows:
        for side in ("new_worse_witness", "old_worse_witness"):
            if row[side] is not None:
                row[side] = {k: v for k, v in row[side].items() if k != "file"}
    return rows


def test_parallel_and_serial_give_the_same_rows_and_exit_code(tmp_path):
    invariants = ["seq_cap", "no_deadlock", "decode_progress"]
    serial = run_diff(V1, SMALL_POOL, invariants=invariants, timeout_s=120, out_dir=tmp_path / "serial",
                      audit=False, jobs=1, **SMALL)
    parallel = run_diff(V1, SMALL_POOL, invariants=invariants, timeout_s=120, out_dir=tmp_path / "parallel",
                        audit=False, jobs=2, **SMALL)
    assert _rows(parallel) == _rows(serial)
    assert parallel.exit_code is serial.exit_code is ExitCode.VIOLATED
    assert [p.summary_line() for p in parallel.properties] == [p.summary_line() for p in serial.properties]
    # a witness each, saved by a worker (z3 may pick another trace of the same size in a fresh process)
    assert [p.name.rsplit("__", 1)[0] for p in (tmp_path / "parallel").iterdir()] == \
        [p.name.rsplit("__", 1)[0] for p in (tmp_path / "serial").iterdir()] == ["vllm_v1_small_pool__no_deadlock"]


def test_the_cli_prints_the_same_summary_with_one_job_or_two(capsys, tmp_path):
    argv = ["diff", str(V1), str(SMALL_POOL), "--invariant", "no_deadlock", "--invariant", "token_budget",
            "--requests", "2", "--depth", "3", "--prompt-range", "1:4096", "--output-range", "1:8", "--no-audit"]
    outs = []
    for jobs in ("1", "2"):
        code = main([*argv, "--jobs", jobs, "--out", str(tmp_path / jobs)])
        out = capsys.readouterr().out
        outs.append((code, [line for line in out.splitlines() if "replay:" not in line and "witness:" not in line
                            and not line.strip().startswith("[")]))
    assert outs[0] == outs[1] and outs[0][0] == 1


def test_jobs_must_be_a_positive_count(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["diff", str(V1), str(V1), "--jobs", "0"])
    assert stop.value.code == 2
    assert "argument --jobs: '0' (expected a whole number of processes >= 1" in capsys.readouterr().err


def test_the_proof_covered_invariants_of_a_side_share_one_worker():
    old, new = load_policy(V1), _halved()
    pair = Pair(old, new, str(V1), None)
    chosen = [parse_invariant(name) for name in ("kv_never_overcommitted", "seq_cap", "no_deadlock")]
    env = default_environment(old, 2, 3, None, None, None)
    plan = units(pair, chosen, env, 60, None, None)
    assert [(u.side, [name for _, name, _ in u.checks]) for u in plan] == [
        ("old", ["kv_never_overcommitted", "seq_cap"]), ("new", ["kv_never_overcommitted", "seq_cap"]),
        ("old", ["no_deadlock"]), ("new", ["no_deadlock"])]
    same = Pair(old, old.model_copy(update={"name": "copy"}), None, None)
    assert [u.side for u in units(same, chosen, env, 60, None, None)] == ["old", "old"]  # identical rules: OLD only


def test_both_sides_undecided_is_an_undecided_row_without_a_product_query():
    old, new = load_policy(V1), _halved()
    pair = Pair(old, new.model_copy(update={"name": "halved"}), str(V1), None)
    inv, params = parse_invariant("no_deadlock")
    env = default_environment(old, 3, 5, None, None, None)
    row = diff_invariant(pair, inv, params, env, 0.001, None, unbounded=False)  # no search gets time
    assert (row.old_verdict, row.new_verdict, row.change) == ("UNKNOWN", "UNKNOWN", Change.UNKNOWN)
    assert row.summary_line().startswith("undecided ") and not row.regression
    assert row.notes and all(note.startswith("no product query: ") and "undecided" in note for note in row.notes)


def test_an_undecided_row_makes_the_report_inconclusive_and_says_why():
    report = run_diff(V1, _halved(), invariants=["no_deadlock"], requests=3, depth=5, timeout_s=0.001,
                      out_dir=None, audit=False, unbounded=False)
    assert report.exit_code is ExitCode.INCONCLUSIVE
    text = report.text()
    assert "undecided: no_deadlock (a search timed out" in text
    assert "    note: no product query: vllm_v1 (new)'s own search timed out and vllm_v1 was undecided too" in text


def test_a_counterexample_that_holds_on_the_undecided_side_is_a_witness_without_a_product_query(tmp_path):
    old, new = load_policy(V1), load_policy(SMALL_POOL)
    pair = Pair(old, new, str(V1), str(SMALL_POOL))
    inv, params = parse_invariant("no_deadlock")
    env = default_environment(old, 2, 3, None, (1, 4096), (1, 8))
    undecided = check_one(old, str(V1), inv, params, env, 0.001, None, proof_first(old, inv, False))
    violated = check_one(new, str(SMALL_POOL), inv, params, env, 120, tmp_path, proof_first(new, inv, False))
    assert (undecided.verdict, violated.verdict) == (Verdict.UNKNOWN, Verdict.VIOLATED)
    row = compare_invariant(pair, undecided, violated, env, 0.001, tmp_path)
    assert row.regression and row.new_worse.path == violated.counterexample  # replayed on OLD, which holds on it
    assert row.change is Change.UNKNOWN and row.summary_line().startswith("REGRESSION ")
