"""batchcheck verify / replay: verdict lines, exit codes, counterexample files (small, fast bounds)."""

from __future__ import annotations

import json
from pathlib import Path

from checker.cli import main
from tests.helpers import POLICIES

BROKEN = POLICIES / "broken" / "unchecked_growth.yaml"


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_verify_finds_the_minimal_overcommit_and_replay_reproduces_it(capsys, tmp_path):
    code, out, err = run(capsys, "verify", str(BROKEN), "--invariant", "kv_never_overcommitted",
                         "--requests", "3", "--depth", "6", "--out", str(tmp_path))
    assert code == 1, err
    line = next(line for line in out.splitlines() if line.startswith("VIOLATED"))
    assert line.startswith("VIOLATED     kv_never_overcommitted                   2 request(s), fails at iteration 1; "
                           "minimal: no violation with fewer requests up to depth 6, none shorter with 2; "
                           "replayed on the engine: ")
    files = list(tmp_path.glob("unchecked_growth__kv_never_overcommitted__*.json"))
    assert len(files) == 1
    doc = json.loads(files[0].read_text())
    assert doc["format"] == "batchcheck-counterexample" and doc["#meta"]["format"] == "ITF"
    assert doc["violation"] == {"iteration": 1} and len(doc["requests"]) == 2 and len(doc["states"]) == 2
    assert doc["states"][1]["kv_used"] > 64

    code, out, _ = run(capsys, "replay", str(files[0]))
    assert code == 1
    assert out.splitlines()[-1] == "kv_never_overcommitted VIOLATED at iteration 1 (recorded: iteration 1)"

    fixed = tmp_path / "fixed.yaml"
    fixed.write_text(BROKEN.read_text().replace("check_allocation: false", "check_allocation: true")
                     .replace("triggers: []", "triggers: [kv_growth_fails]"))
    code, out, _ = run(capsys, "replay", str(files[0]), "--policy", str(fixed))
    assert code == 0
    assert out.splitlines()[-1] == "kv_never_overcommitted holds on this trace: the policy no longer fails it"


def test_bounded_holds_is_never_called_safe(capsys, tmp_path):
    code, out, _ = run(capsys, "verify", str(BROKEN), "--invariant", "token_budget", "--invariant", "seq_cap",
                       "--requests", "2", "--depth", "3", "--prompt-range", "1:64", "--out", str(tmp_path))
    assert code == 0
    lines = [line for line in out.splitlines() if line.startswith("HOLDS_UP_TO")]
    assert [line.split()[1] for line in lines] == ["token_budget", "seq_cap"]
    assert all("2 requests, 3 iterations (bounded check, not a proof)" in line for line in lines)
    assert "safe" not in out.lower()


def test_vacuous_when_the_situation_cannot_occur(capsys, tmp_path):
    code, out, _ = run(capsys, "verify", str(BROKEN), "--invariant", "cancellation_releases:0", "--requests", "2",
                       "--depth", "3", "--prompt-range", "1:64", "--no-cancellations", "--out", str(tmp_path))
    assert code == 3
    assert "VACUOUS      cancellation_releases(steps=0)           its situation never occurs within 2 requests, " \
           "3 iterations, so nothing was checked" in out


def test_json_output(capsys, tmp_path):
    code, out, _ = run(capsys, "verify", str(BROKEN), "--invariant", "seq_cap", "--requests", "1", "--depth", "2",
                       "--prompt-range", "1:32", "--json", "--out", str(tmp_path))
    doc = json.loads(out)
    assert code == 0 and doc["exit_code"] == 0
    assert doc["results"][0]["verdict"] == "HOLDS_UP_TO" and doc["environment"]["depth"] == 2


def test_unknown_invariant_and_unbounded_are_usage_errors(capsys):
    code, _, err = run(capsys, "verify", str(BROKEN), "--invariant", "kv_safety")
    assert code == 2
    assert err.startswith("batchcheck: error: --invariant='kv_safety' (expected one of: bounded_preemptions, ")
    code, _, err = run(capsys, "verify", str(BROKEN), "--invariant", "decode_progress:speed=3")
    assert code == 2
    assert err == "batchcheck: error: --invariant='decode_progress:speed=3' (expected parameters of decode_progress: gap)\n"
    code, _, err = run(capsys, "verify", str(BROKEN), "--unbounded")
    assert code == 2 and "--unbounded (k-induction proofs) is not available in this version yet" in err


def test_replay_rejects_a_file_that_is_not_a_counterexample(capsys, tmp_path):
    path = tmp_path / "x.json"
    path.write_text('{"format": "batchcheck-trace", "requests": []}')
    code, _, err = run(capsys, "replay", str(path))
    assert code == 2
    assert err == (f"batchcheck: error: {path}: format='batchcheck-trace' (expected 'batchcheck-counterexample' "
                   "(a counterexample written by batchcheck))\n")


def test_counterexample_is_written_atomically(tmp_path, monkeypatch):
    from checker.verify import counterexample as cex

    target = tmp_path / "a.json"
    target.write_text("old")

    def boom(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(cex.os, "replace", boom)
    try:
        cex.write_atomic(target, "new")
    except OSError:
        pass
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["a.json"]
    assert isinstance(Path(target), Path)
