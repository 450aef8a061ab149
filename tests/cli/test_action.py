"""The reusable GitHub Action (action.yml): its main step, action/run.sh, run as the action runs it, in a
fresh clone of a sample serving team's repository that the test makes (no GitHub runner or `act` here:
neither installs from the package registries). The install step and the upload steps are GitHub's own
actions; their wiring (fork condition, category, skipped uploads) is checked on action.yml itself."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.helpers import POLICIES, ROOT

RUN = ROOT / "action" / "run.sh"
CONFIG = """\
policies = ["serving/scheduler/*.yaml"]

[defaults]
requests = 2
depth = 2
timeout_s = 60
unbounded = false

[output]
counterexamples = "out/counterexamples"

[[verify]]
invariants = ["token_budget"]

[[verify]]
policies = ["serving/scheduler/unchecked_growth.yaml"]
invariants = ["kv_never_overcommitted"]
"""

pytestmark = pytest.mark.skipif(shutil.which("git") is None or shutil.which("bash") is None,
                                reason="the action test needs git and bash")


def git(cwd: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@e", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@e"}
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout


def team_repo(tmp_path: Path) -> Path:
    """A serving team's repository: its scheduler policies under serving/scheduler/, a workload beside them,
    a batchcheck.toml; main, then a branch that changes one policy's sequence cap."""
    origin = tmp_path / "team"
    (origin / "serving" / "scheduler").mkdir(parents=True)
    shutil.copy(POLICIES / "vllm_v1.yaml", origin / "serving" / "scheduler" / "prod.yaml")
    shutil.copy(POLICIES / "broken" / "unchecked_growth.yaml", origin / "serving" / "scheduler" / "unchecked_growth.yaml")
    shutil.copy(ROOT / "spec" / "workloads" / "chat_mixed.yaml", origin / "serving" / "chat.yaml")
    (origin / "batchcheck.toml").write_text(CONFIG)
    git(origin, "init", "-q", "-b", "main")
    git(origin, "add", ".")
    git(origin, "commit", "-qm", "base")
    git(origin, "checkout", "-qb", "change")
    prod = origin / "serving" / "scheduler" / "prod.yaml"
    prod.write_text(prod.read_text().replace("max_num_seqs: 256", "max_num_seqs: 128"))
    (origin / "serving" / "chat.yaml").write_text((origin / "serving" / "chat.yaml").read_text() + "\n")
    git(origin, "commit", "-qam", "fewer sequences")
    clone = tmp_path / "clone"
    git(tmp_path, "clone", "-q", "-b", "change", str(origin), str(clone))
    return clone


def run_action(repo: Path, **inputs: str) -> tuple[dict[str, str], str]:
    """run.sh as the action's step runs it (inputs as INPUT_* variables, GitHub's output and summary files);
    returns the step's outputs and the job summary."""
    gh_output, gh_summary = repo / "gh_output", repo / "gh_summary"
    env = {**os.environ, "GITHUB_OUTPUT": str(gh_output), "GITHUB_STEP_SUMMARY": str(gh_summary),
           "INPUT_JOBS": "1", **{f"INPUT_{k.upper()}": v for k, v in inputs.items()}}
    proc = subprocess.run(["bash", str(RUN)], cwd=repo, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr  # the step never fails: the gate step exits with the code
    outputs = dict(line.split("=", 1) for line in gh_output.read_text().splitlines())
    return outputs, gh_summary.read_text()


def test_changed_policies_are_checked_and_reported(tmp_path):
    repo = team_repo(tmp_path)
    outputs, summary = run_action(repo, changed_since="origin/main")
    assert outputs["exit-code"] == "0", summary  # only prod.yaml changed (chat.yaml is a workload): it holds
    sarif = json.loads((repo / outputs["sarif"]).read_text())
    assert sarif["version"] == "2.1.0"
    assert "serving/scheduler/prod.yaml" in summary and "unchecked_growth" not in summary
    assert outputs["counterexamples"] == ""


def test_a_violation_gates_and_its_counterexample_is_handed_to_the_upload(tmp_path):
    repo = team_repo(tmp_path)
    outputs, summary = run_action(repo)  # every check: unchecked_growth over-commits its pool
    assert outputs["exit-code"] == "1", summary
    cex = Path(outputs["counterexamples"])
    assert cex == repo / "out" / "counterexamples" and any(cex.glob("unchecked_growth*.json"))
    assert json.loads((repo / outputs["sarif"]).read_text())["runs"][0]["results"]


def test_a_bad_config_shows_the_error_and_no_sarif_is_uploaded(tmp_path):
    repo = team_repo(tmp_path)
    (repo / "batchcheck.toml").write_text(CONFIG.replace("depth = 2", "dept = 2"))
    outputs, summary = run_action(repo)
    assert outputs["exit-code"] == "2" and outputs["sarif"] == ""
    assert summary.startswith("## batchcheck: exit 2\n")
    assert "batchcheck: error: batchcheck.toml:" in summary and "dept" in summary


def test_a_base_ref_the_checkout_lacks_is_a_clear_error(tmp_path):
    repo = team_repo(tmp_path)
    outputs, summary = run_action(repo, changed_since="origin/nope")
    assert outputs["exit-code"] == "2"
    assert "--base='origin/nope' (expected a git ref of this repository" in summary


def test_action_yml_wires_the_steps():
    action = yaml.safe_load((ROOT / "action.yml").read_text())
    assert action["runs"]["using"] == "composite"
    steps = {s.get("name") or s.get("uses"): s for s in action["runs"]["steps"]}
    assert 'action/run.sh"' in steps["batchcheck ci"]["run"]
    upload = steps["upload SARIF"]
    assert upload["uses"].startswith("github/codeql-action/upload-sarif@")
    assert upload["with"]["category"] == "${{ inputs.sarif-category }}"
    # a fork's pull request gets no write token: the upload is skipped there instead of failing the job
    assert "github.event.pull_request.head.repo.full_name == github.repository" in upload["if"]
    assert "steps.run.outputs.sarif != ''" in upload["if"]  # nothing to upload after exit 2
    assert steps["upload counterexamples"]["uses"].startswith("actions/upload-artifact@")
    assert steps["gate"]["if"] == "always()" and "steps.run.outputs.exit-code" in steps["gate"]["run"]
    for name in ("config", "policies", "changed-since", "jobs", "output-dir"):
        assert f"INPUT_{name.upper().replace('-', '_')}" in steps["batchcheck ci"]["env"]
