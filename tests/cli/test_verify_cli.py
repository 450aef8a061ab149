"""batchcheck verify / replay: verdict lines, exit codes, counterexample files (small, fast bounds)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

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
                       "--requests", "2", "--depth", "3", "--prompt-range", "1:64", "--bounded-only",
                       "--out", str(tmp_path))
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
    assert code == 0 and doc["exit_code"] == 0  # the default tries the proof first (issue 19): PROVED for 1 slot
    assert doc["results"][0]["verdict"] == "PROVED" and doc["environment"]["depth"] == 2


def test_unknown_invariant_and_unbounded_are_usage_errors(capsys):
    code, _, err = run(capsys, "verify", str(BROKEN), "--invariant", "kv_safety")
    assert code == 2
    assert err.startswith("batchcheck: error: --invariant='kv_safety' (expected one of: block_pool_conservation, bounded_preemptions, ")
    code, _, err = run(capsys, "verify", str(BROKEN), "--invariant", "decode_progress:speed=3")
    assert code == 2
    assert err == "batchcheck: error: --invariant='decode_progress:speed=3' (expected parameters of decode_progress: gap)\n"


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

    from checker import fileio
    from checker.errors import InputError
    monkeypatch.setattr(fileio.os, "replace", boom)
    with pytest.raises(InputError):
        cex.write_atomic(target, "new")
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["a.json"]
    assert isinstance(Path(target), Path)


def test_unbounded_proves_state_invariants_action_wise_with_a_certificate_that_rechecks(capsys, tmp_path):
    code, out, err = run(capsys, "verify", str(POLICIES / "vllm_v1.yaml"), "--invariant", "token_budget",
                         "--invariant", "request_conservation", "--requests", "2", "--depth", "2",
                         "--prompt-range", "1:2048", "--unbounded", "--out", str(tmp_path / "cex"),
                         "--proof-dir", str(tmp_path / "proofs"))
    assert code == 0, err
    proved = [line for line in out.splitlines() if line.startswith("PROVED")]
    assert [line.split()[1] for line in proved] == ["token_budget", "request_conservation"]
    assert all("for 2 request slots and any number of iterations (action-wise induction: core candidates; 6 "
               "step-boundary lemmas, 64 mid-step lemmas over 5 actions); its situation occurs at iteration 0 of an "
               "engine run (2 requests arriving at once, prompts of 2048-2048 tokens); certificate: " in line
               for line in proved)
    cert = tmp_path / "proofs" / "vllm_v1__request_conservation__N2.smt2"
    code, out, _ = run(capsys, "recheck", str(cert), "--policy", str(POLICIES / "vllm_v1.yaml"), "--invariant",
                       "request_conservation", "--requests", "2")
    assert code == 0
    assert out.splitlines()[0] == (f"{cert}: certificate holds (each of its 5 queries (one per scheduler action) is "
                                   "unsat with a fresh solver)")
    assert out.splitlines()[-1] == ("  checked: its 5 action queries, rebuilt from the policy and the candidates that "
                                    "survived, are unsat")
    tampered = tmp_path / "tampered.smt2"
    text = cert.read_text()
    last_query = text.rindex("(assert\n broken_")  # the completion's final query literal, asserted
    tampered.write_text(text[:last_query] + "(check-sat)\n")
    code, out, err = run(capsys, "recheck", str(tampered))
    assert (code, out) == (2, "")  # tests/cli/test_recheck_binding.py: every way a certificate is refused
    assert err.startswith(f"batchcheck: error: {tampered}:4: binding.query_sha256=")


def test_unbounded_proves_a_one_step_invariant_by_whole_step_induction(capsys, tmp_path):
    code, out, err = run(capsys, "verify", str(POLICIES / "vllm_v1.yaml"), "--invariant", "cancellation_releases:1",
                         "--requests", "2", "--depth", "2", "--prompt-range", "1:2048", "--unbounded",
                         "--out", str(tmp_path / "cex"), "--proof-dir", str(tmp_path / "proofs"))
    assert code == 0, err
    assert ("PROVED       cancellation_releases(steps=1)           for 2 request slots and any number of iterations "
            "(induction with 31 structural lemmas; no violation up to depth 2); certificate: ") in out
    cert = tmp_path / "proofs" / "vllm_v1__cancellation_releases__N2.smt2"
    code, out, _ = run(capsys, "recheck", str(cert), "--policy", str(POLICIES / "vllm_v1.yaml"))
    assert code == 0
    assert out.splitlines()[0] == f"{cert}: certificate holds (the step query is unsat with a fresh solver)"
    assert out.splitlines()[-1] == "  checked: its query is the one rebuilt from the policy"
    tampered = tmp_path / "tampered.smt2"
    tampered.write_text(cert.read_text().replace("(assert\n goal_broken)", "(assert\n (not goal_broken))"))
    code, out, err = run(capsys, "recheck", str(tampered))
    assert (code, out) == (2, "")
    assert err.startswith(f"batchcheck: error: {tampered}:4: binding.query_sha256=")


def test_unbounded_still_reports_the_violation_first(capsys, tmp_path):
    code, out, _ = run(capsys, "verify", str(BROKEN), "--invariant", "kv_never_overcommitted", "--requests", "2",
                       "--depth", "3", "--unbounded", "--out", str(tmp_path), "--proof-dir", str(tmp_path))
    assert code == 1 and out.splitlines()[-1].startswith("VIOLATED     kv_never_overcommitted")


def test_unbounded_says_why_a_temporal_invariant_stays_bounded(capsys, tmp_path):
    code, out, _ = run(capsys, "verify", str(BROKEN), "--invariant", "decode_progress:gap=2", "--requests", "1",
                       "--depth", "3", "--prompt-range", "1:16", "--unbounded", "--out", str(tmp_path),
                       "--proof-dir", str(tmp_path))
    assert code == 0
    assert "HOLDS_UP_TO  decode_progress(gap=2)   " in out
    assert ("unbounded proofs of decode_progress(gap=2) need --temporal-induction (k-induction; it looks back more "
            "than one iteration)") in out


def test_temporal_induction_is_refused_by_name_with_bounded_only(capsys, tmp_path):
    code, _, err = run(capsys, "verify", str(BROKEN), "--invariant", "bounded_starvation:3", "--temporal-induction",
                       "--bounded-only", "--out", str(tmp_path))
    assert code == 2
    assert "--temporal-induction=True (expected without --bounded-only (k-induction is a proof))" in err


@pytest.fixture
def restore_catalogue():
    from invariants import CATALOGUE

    before = dict(CATALOGUE)
    yield
    CATALOGUE.clear()
    CATALOGUE.update(before)


def test_user_invariant_from_a_module_without_editing_the_package(capsys, tmp_path, restore_catalogue):
    plugin = tmp_path / "my_invariants.py"
    plugin.write_text('''
from invariants import invariant
from checker.semantics.state import Status


def at_most_one_running(o, ctx, t):
    """At most one request runs at a time."""
    frame = ctx.frames[t]
    return sum(o.b2i(s["status"] == int(Status.RUNNING)) for s in frame.slots) <= 1


def two_arrived(o, ctx, t):
    return sum(o.b2i(s["status"] != int(Status.PENDING)) for s in ctx.frames[t].slots) >= 2


INVARIANTS = [invariant(at_most_one_running, two_arrived)]
''')
    code, out, err = run(capsys, "verify", str(BROKEN), "--invariant-module", str(plugin), "--invariant",
                         "at_most_one_running", "--requests", "2", "--depth", "3", "--prompt-range", "1:32",
                         "--out", str(tmp_path))
    assert code == 1, err
    assert out.splitlines()[-1].startswith("VIOLATED     at_most_one_running                      2 request(s)")


def test_broken_user_module_is_an_input_error(capsys, tmp_path):
    plugin = tmp_path / "bad.py"
    plugin.write_text("INVARIANTS = 3\n")
    code, _, err = run(capsys, "verify", str(BROKEN), "--invariant-module", str(plugin))
    assert code == 2
    assert err == f"batchcheck: error: {plugin}.INVARIANTS='int' (expected a list of invariants.Invariant (see docs/invariants.md))\n"


def test_verify_runs_the_audit_first_and_stops_on_an_impossible_plan(capsys, tmp_path):
    policy, workload = str(POLICIES / "vllm_v1.yaml"), str(POLICIES.parent / "workloads" / "weakness_vllm_v1.yaml")
    code, out, err = run(capsys, "verify", policy, "--workload", workload, "--out", str(tmp_path))
    assert (code, err) == (1, "")
    assert out == ("AUDIT        decision=KV_BUDGET_EXCEEDED;class=longgen;tenant=default;value=10229514240;"
                   "limit=5242880000\n"
                   f"the plan is impossible under {workload}'s declared load (batchcheck audit --policy {policy} "
                   f"--workload {workload}); invariants not checked (--no-audit checks them anyway: the solver uses "
                   "only the workload's length ranges, priorities and tenants)\n")
    code, out, _ = run(capsys, "verify", policy, "--workload", workload, "--no-audit", "--invariant", "seq_cap",
                       "--requests", "1", "--depth", "2", "--out", str(tmp_path))
    assert code == 0 and "PROVED       seq_cap" in out  # the proof first, by default


def test_the_default_tries_the_proof_first_and_bounded_only_does_not(capsys, tmp_path):
    """Issue 19: `verify POLICY` with no flags tries the cheapest decisive method first (the action-wise proof:
    PROVED for N slots and any depth), then the bounded search; --bounded-only is the bounded search alone (as the
    default was before); --unbounded is still accepted (it is the default) and contradicts --bounded-only."""
    common = ["verify", str(POLICIES / "vllm_v1.yaml"), "--invariant", "seq_cap", "--requests", "2", "--depth", "2",
              "--out", str(tmp_path)]
    code, out, _ = run(capsys, *common)
    assert code == 0 and "PROVED       seq_cap" in out and "action-wise induction" in out
    code, out, _ = run(capsys, *common, "--unbounded")
    assert code == 0 and "PROVED       seq_cap" in out
    code, out, _ = run(capsys, *common, "--bounded-only")
    assert code == 0 and "HOLDS_UP_TO  seq_cap" in out and "(bounded check, not a proof)" in out
    code, _, err = run(capsys, *common, "--bounded-only", "--unbounded")
    assert code == 2 and "--unbounded and --bounded-only contradict each other" in err
