"""batchcheck liveness on prefix-caching policies: --identities, the prefix-cache counts on the graph line, the
VACUOUS verdict of an instance in which no admission finds a cached prefix, lasso files and replay, errors."""

from __future__ import annotations

import json

import pytest

from checker.cli import main
from tests.helpers import POLICIES

CACHING = str(POLICIES / "prefix_caching" / "vllm_v1.yaml")
STRICT = str(POLICIES / "strict_priority.yaml")
SMALL = ["--set", "kv.num_blocks=6", "--set", "batch.max_num_seqs=1"]


def run(capsys, *argv: str) -> tuple[int, str, str]:
    try:
        code = main(list(argv))
    except SystemExit as stop:  # argparse's own errors (a malformed option value)
        code = stop.code
    out, err = capsys.readouterr()
    return code, out, err


def test_proves_the_shipped_caching_policy_and_counts_its_hits(capsys, tmp_path):
    code, out, err = run(capsys, "liveness", CACHING, *SMALL, "--prompts", "20,40", "--identities", "g0,g1",
                         "--out", str(tmp_path))
    assert code == 0, err
    lines = out.splitlines()
    assert lines[2] == ("  - prompt tokens in {20, 40}, output tokens in {1, 2} (declared max output = output), "
                        "priorities in {0}, 1 tenant(s), prompt identities {prefix group 0, prefix group 1}")
    assert lines[4].startswith("graph: 379 states, ")
    assert lines[4].endswith("; prefix cache: an admission finds a cached prefix in 2,304 of 3,091 transitions, "
                             "adopts one in 2,304")
    assert [line.split()[0] for line in lines[5:8]] == ["PROVED"] * 3


def test_the_default_identities_share_a_prefix_and_json_reports_the_counts(capsys, tmp_path):
    code, out, _ = run(capsys, "liveness", CACHING, *SMALL, "--json", "--out", str(tmp_path))
    doc = json.loads(out)
    assert doc["environment"]["prompt_identities"] == ["g0"] and doc["environment"]["prompt_tokens"] == [32]
    graph = doc["graph"]
    assert graph["complete"] and graph["cache_found_transitions"] >= graph["cache_hit_transitions"] > 0
    assert "prompt identities {prefix group 0}" in doc["assumptions"][1]
    assert code == doc["exit_code"]


def test_an_instance_without_a_single_cached_prefix_found_is_vacuous(capsys, tmp_path):
    # own tokens only: a request never meets another's prefix, and one-block prompts never hit their own
    code, out, _ = run(capsys, "liveness", CACHING, *SMALL, "--prompts", "16", "--identities", "own",
                       "--out", str(tmp_path))
    assert code == 3
    lines = out.splitlines()
    assert lines[4].endswith("; no admission finds a cached prefix in any transition (the cache is never exercised)")
    for line in lines[5:8]:
        assert line.startswith("VACUOUS")
        assert "no admission of this instance finds a cached prefix (0 of " in line
        assert "the cache never changes a decision" in line and "--prompts 32" in line
    assert "PROVED" not in out


def test_a_caching_lasso_is_saved_with_its_prompts_and_replays(capsys, tmp_path):
    code, out, err = run(capsys, "liveness", STRICT, "--set", "kv.prefix_caching.enabled=true", "--set",
                         "batch.max_num_seqs=1", "--set", "kv.num_blocks=4", "--property", "eventually_served",
                         "--out", str(tmp_path))
    assert code == 1, err
    (path,) = tmp_path.glob("strict_priority__eventually_served_lasso__*.json")
    assert f"replayed on the engine (prefix + two turns): {path}" in out
    doc = json.loads(path.read_text())
    assert all(r["prompt_runs"] == [[0, 32]] for r in doc["requests"])
    code, out, _ = run(capsys, "replay", str(path))
    assert code == 1
    last = doc["violation"]["iteration"]
    assert out.splitlines()[-1] == f"eventually_served VIOLATED at iteration {last} (recorded: iteration {last})"


def test_verify_liveness_takes_identities_and_verify_alone_refuses_them(capsys, tmp_path):
    argv = [CACHING, *SMALL, "--prompts", "20,40", "--identities", "g0,g1", "--property", "no_deadlock"]
    code, out, _ = run(capsys, "verify", *argv, "--liveness", "--out", str(tmp_path))
    assert code == 0 and "prompt identities {prefix group 0, prefix group 1}" in out
    code, out, err = run(capsys, "verify", CACHING, "--identities", "g0", "--out", str(tmp_path))
    assert code == 2 and out == ""
    assert err.startswith("batchcheck: error: --identities needs --liveness")


@pytest.mark.parametrize("policy,argv,message", [
    (str(POLICIES / "vllm_v1.yaml"), ["--identities", "g0,own"],
     "batchcheck: error: --identities='g0,own' (expected only with kv.prefix_caching.enabled: true (without the "
     "cache a prompt's tokens are never read))"),
    (CACHING, ["--identities", "g7"],
     "batchcheck liveness: error: argument --identities: 'g7' (expected prompt identities among own, g0, g1, g0+1: "
     "own tokens, prefix group 0, prefix group 1, group 0 from its second block)"),
])
def test_bad_identities_are_exit_2_with_what_is_allowed(capsys, tmp_path, policy, argv, message):
    code, out, err = run(capsys, "liveness", policy, *argv, "--out", str(tmp_path))
    assert code == 2 and out == ""
    assert err.splitlines()[-1] == message and "Traceback" not in err


def test_ci_runs_liveness_on_a_caching_policy_and_says_how_often_the_cache_was_hit(capsys, tmp_path, monkeypatch):
    import shutil

    from tests.unit.ci_sample import make_project

    monkeypatch.chdir(tmp_path)
    make_project(tmp_path, '[[liveness]]\npolicies = ["spec/policies/prefix_caching/vllm_v1.yaml"]\n'
                           'prompts = [20, 40]\nset = ["kv.num_blocks=6", "batch.max_num_seqs=1"]\n'
                           'properties = ["no_deadlock"]\n')
    (tmp_path / "spec" / "policies" / "prefix_caching").mkdir(parents=True, exist_ok=True)
    shutil.copy(CACHING, tmp_path / "spec" / "policies" / "prefix_caching" / "vllm_v1.yaml")
    code, out, err = run(capsys, "ci", "--jobs", "1")
    assert code == 0, out + err
    line = out.splitlines()[0]
    assert line.startswith("spec/policies/prefix_caching/vllm_v1.yaml: PROVED             no_deadlock")
    assert "(complete); prefix cache: an admission finds a cached prefix in " in line
    assert "instance: 2 request(s) in flight, prompts {20, 40}, prompt identities {g0}, outputs {1, 2}" in line
