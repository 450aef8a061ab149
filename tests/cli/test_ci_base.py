"""`batchcheck ci --base REF`: the checks of the policy files changed since REF, and [[diff]] entries without
old/new that compare each changed policy with its own version at REF, annotated at the changed line (a
no_deadlock regression caused by kv.num_blocks used to land on the unchanged reject_never_fits line, which
GitHub hides in a pull request)."""

from __future__ import annotations

import json
import shutil

import pytest

from tests.cli.test_action import git
from tests.cli.test_cli import run
from tests.helpers import POLICIES

CONFIG = """\
policies = ["policies/*.yaml"]
[defaults]
requests = 2
depth = 3
timeout_s = 60
[[verify]]
invariants = ["token_budget"]
[[diff]]
invariants = ["no_deadlock"]
"""

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="ci --base needs git")


@pytest.fixture
def repo(tmp_path, monkeypatch):
    """main: two policies and the config; the branch `change` shrinks prod's pool to 100 blocks."""
    (tmp_path / "policies").mkdir()
    shutil.copy(POLICIES / "vllm_v1.yaml", tmp_path / "policies" / "prod.yaml")
    shutil.copy(POLICIES / "sarathi_serve.yaml", tmp_path / "policies" / "other.yaml")
    (tmp_path / "batchcheck.toml").write_text(CONFIG)
    git(tmp_path, "init", "-q", "-b", "main")
    git(tmp_path, "add", ".")
    git(tmp_path, "commit", "-qm", "base")
    git(tmp_path, "checkout", "-qb", "change")
    prod = tmp_path / "policies" / "prod.yaml"
    assert prod.read_text().count("num_blocks: 2500") == 1
    prod.write_text(prod.read_text().replace("num_blocks: 2500", "num_blocks: 100"))
    git(tmp_path, "commit", "-qam", "smaller pool")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def line_of(path, text: str) -> int:
    return 1 + path.read_text().split(text)[0].count("\n")


def test_base_runs_the_changed_policy_and_annotates_the_changed_line(capsys, repo):
    code, out, _ = run(capsys, "ci", "--jobs", "1", "--base", "main", "--sarif", "out.sarif")
    assert code == 1
    lines = out.splitlines()
    assert [l.split(":")[0] for l in lines if l.startswith("policies/")] == ["policies/prod.yaml"] * 2
    assert any("no_deadlock(steps=2)" in l and "policies/prod.yaml@main -> policies/prod.yaml: strictly less safe "
               "(HOLDS_UP_TO -> VIOLATED)" in l for l in lines), out
    result = json.loads((repo / "out.sarif").read_text())["runs"][0]["results"]
    [diff] = [r for r in result if r["ruleId"] == "diff/no_deadlock"]
    region = diff["locations"][0]["physicalLocation"]["region"]
    prod = repo / "policies" / "prod.yaml"
    assert region["startLine"] == line_of(prod, "num_blocks: 100") != line_of(prod, "reject_never_fits:")


def test_without_base_a_base_diff_says_it_did_not_run(capsys, repo):
    code, out, _ = run(capsys, "ci", "--jobs", "1")
    assert code == 0
    assert "note: diff[0] compares each changed policy with its version at --base REF: no --base given, not run" \
        in out.splitlines()
    assert sum(l.startswith("policies/") for l in out.splitlines()) == 2  # token_budget on both policies


def test_a_changed_config_runs_every_check_and_a_new_policy_has_nothing_to_compare(capsys, repo):
    shutil.copy(POLICIES / "orca.yaml", repo / "policies" / "new.yaml")
    (repo / "batchcheck.toml").write_text(CONFIG.replace("depth = 3", "depth = 2"))
    code, out, _ = run(capsys, "ci", "--jobs", "1", "--base", "main")
    assert code == 1
    checked = {l.split(":")[0] for l in out.splitlines() if l.startswith("policies/")}
    assert checked == {"policies/prod.yaml", "policies/other.yaml", "policies/new.yaml"}
    assert "note: diff[0]: policies/new.yaml is new since main: nothing to compare" in out.splitlines()


def test_nothing_changed_is_nothing_to_check(capsys, repo):
    code, out, _ = run(capsys, "ci", "--jobs", "1", "--base", "change")
    assert code == 0
    assert "note: no policy file of the config changed since change: nothing to check" in out.splitlines()


@pytest.mark.parametrize("config, argv, message", [
    (CONFIG, ["--base", "nope"], "--base='nope' (expected a git ref of this repository (a branch, tag or commit; in "
                                 "a CI checkout fetch the base branch first, e.g. fetch-depth: 0))"),
    (CONFIG.replace("[[diff]]\n", '[[diff]]\nold = "policies/prod.yaml"\n'), ["--base", "main"],
     "batchcheck.toml:8: diff[0]=<no new> (expected both old and new, or neither (a base diff: each changed "
     "policy against its version at batchcheck ci --base REF))"),
])
def test_bad_base_input_exits_2(capsys, repo, config, argv, message):
    (repo / "batchcheck.toml").write_text(config)
    code, out, err = run(capsys, "ci", "--jobs", "1", *argv)
    assert (code, out) == (2, "")
    assert err == f"batchcheck: error: {message}\n"


def test_a_policy_that_was_invalid_at_base_is_a_located_error(capsys, repo):
    prod = repo / "policies" / "prod.yaml"
    text = prod.read_text()
    prod.write_text(text.replace("num_blocks: 100", "num_blocks: 0"))
    git(repo, "commit", "-qam", "broken pool")
    git(repo, "tag", "broken")
    prod.write_text(text)
    code, out, err = run(capsys, "ci", "--jobs", "1", "--base", "broken")
    assert (code, out) == (2, "")
    line = line_of(prod, "num_blocks: 100")
    assert err == f"batchcheck: error: policies/prod.yaml@broken:{line}: kv.num_blocks=0 (expected a number >= 1)\n"
