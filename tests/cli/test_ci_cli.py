"""`batchcheck ci`: exit codes, what it prints, and bad configs (exit 2, located, nothing written)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from checker.cli import main
from invariants.catalogue import CATALOGUE
from tests.cli.test_cli import run
from tests.unit.ci_sample import make_project

OUTPUTS = ("--junit", "out/junit.xml", "--sarif", "out/ci.sarif", "--summary", "out/summary.md")


@pytest.fixture
def project(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)

    def make(config: str) -> Path:
        return make_project(tmp_path, config)
    return make


def _nothing_written(folder: Path) -> bool:
    return not (folder / "out").exists() and not (folder / "counterexamples").exists()


BAD = [
    ('policies = ["spec/policies/nope.yaml"]\n[[verify]]\ninvariants = ["token_budget"]\n',
     "batchcheck.toml:1: policies[0]='spec/policies/nope.yaml' (expected an existing policy file (relative to "
     "batchcheck.toml))"),
    ('policies = ["spec/policies/*.yml"]\n[[verify]]\ninvariants = ["token_budget"]\n',
     "batchcheck.toml:1: policies[0]='spec/policies/*.yml' (expected a glob that matches at least one policy file)"),
    ('policies = ["spec/policies/vllm_v1.yaml"]\n[[verify]]\ninvariants = [\n  "token_budget",\n'
     '  "kv_never_overcomitted",\n]\n',
     "batchcheck.toml:5: verify[0].invariants[1]='kv_never_overcomitted' (expected one of: {invariants})"),
    ('policies = ["spec/policies/vllm_v1.yaml"]\n[[verify]]\ninvariants = ["decode_progress:gap=x"]\n',
     "batchcheck.toml:3: verify[0].invariants[0]='decode_progress:gap=x' (expected gap=an integer)"),
    ('[[verify]]\ninvariants = ["token_budget"\n',
     "batchcheck.toml:3: (document)=<unparsable> (expected valid TOML: Unclosed array)"),
    ('[[verify]]\npolicies = ["spec/policies/vllm_v1.yaml"]\ninvariants = ["seq_cap"]\nrequests = 0\n'
     '[defaults]\ndeth = 3\n',
     "batchcheck.toml:6: defaults.deth=3 (expected a known key; did you mean depth? allowed here: depth, level, requests, "
     "temporal_induction, timeout_s, unbounded)\nbatchcheck.toml:4: verify[0].requests=0 (expected a number >= 1)"),
    ('[[verify]]\ninvariants = ["seq_cap"]\n',
     "batchcheck.toml:1: verify[0].policies=<missing> (expected a list of policy files or globs here or at the top "
     "level (policies = [...]))"),
    ('policies = ["spec/policies/vllm_v1.yaml"]\n[[verify]]\ninvariants = ["seq_cap"]\nlevel = "fatal"\n',
     "batchcheck.toml:4: verify[0].level='fatal' (expected one of: error or warning)"),
    ('policies = ["spec/policies/vllm_v1.yaml"]\n',
     "batchcheck.toml: verify=<missing> (expected at least one [[verify]], [[fuzz]], [[diff]] or [[liveness]] "
     "entry)"),
]


@pytest.mark.parametrize("config, message", BAD)
def test_bad_configs_exit_2_with_a_located_message_and_write_nothing(capsys, project, config, message):
    project(config)
    code, out, err = run(capsys, "ci", *OUTPUTS)
    assert (code, out) == (2, "")
    invariants = ", ".join(sorted(CATALOGUE))  # now: other tests may have registered user invariants
    assert err == f"batchcheck: error: {message.replace('{invariants}', invariants)}\n"
    assert _nothing_written(Path.cwd())


def test_two_policies_with_different_kv_units_cannot_be_compared(capsys, project):
    folder = project('[[diff]]\nold = "spec/policies/vllm_v1.yaml"\nnew = "spec/policies/vllm_v1_b32.yaml"\n')
    text = (folder.parent / "spec" / "policies" / "vllm_v1.yaml").read_text()
    (folder.parent / "spec" / "policies" / "vllm_v1_b32.yaml").write_text(
        text.replace("block_size: 16", "block_size: 32").replace("num_blocks: 2500", "num_blocks: 1250"))
    code, out, err = run(capsys, "ci", *OUTPUTS)
    assert code == 2
    assert err == ("batchcheck: error: batchcheck.toml:3: diff[0].new='spec/policies/vllm_v1_b32.yaml' (expected a "
                   "policy with the same KV block size as spec/policies/vllm_v1.yaml (16 tokens per block) to "
                   "compare their pools; it has 32)\n")
    assert _nothing_written(Path.cwd())


def test_a_bad_policy_file_is_reported_at_its_own_line(capsys, project):
    folder = project('policies = ["spec/policies/*.yaml"]\n[[verify]]\ninvariants = ["seq_cap"]\n')
    (folder.parent / "spec" / "policies" / "typo.yaml").write_text("name: typo\nmax_model_len: 1024\nkv:\n"
                                                                   "  num_blocks: 0\n")
    code, _, err = run(capsys, "ci", *OUTPUTS)
    assert code == 2
    assert err == "batchcheck: error: spec/policies/typo.yaml:4: kv.num_blocks=0 (expected a number >= 1)\n"
    assert _nothing_written(Path.cwd())


def test_a_missing_config_and_a_bad_jobs_flag(capsys, project):
    code, _, err = run(capsys, "ci", "--config", "nope.toml")
    assert (code, err) == (2, "batchcheck: error: nope.toml: (document)='nope.toml' (expected an existing file)\n")
    with pytest.raises(SystemExit) as exit_:
        main(["ci", "--jobs", "0"])
    assert exit_.value.code == 2
    assert "argument --jobs: '0' (expected a whole number of processes >= 1 and <= 1,024)" in capsys.readouterr().err


def test_a_gating_violation_exits_1_and_a_warning_does_not(capsys, project):
    project('policies = ["spec/policies/tgi_router.yaml", "spec/policies/unchecked_growth.yaml"]\n'
            '[defaults]\nrequests = 2\ndepth = 3\n'
            '[[verify]]\npolicies = ["spec/policies/tgi_router.yaml"]\ninvariants = ["cancellation_releases:0"]\n'
            'level = "warning"\n'
            '[[verify]]\npolicies = ["spec/policies/unchecked_growth.yaml"]\ninvariants = ["kv_never_overcommitted"]\n')
    code, out, _ = run(capsys, "ci", "--jobs", "1", *OUTPUTS, "--policy", "spec/policies/tgi_router.yaml")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].startswith("spec/policies/tgi_router.yaml: VIOLATED     cancellation_releases(steps=0) ")
    assert lines[0].endswith("(warning only)")
    assert "wrote out/sarif" not in out and "wrote out/ci.sarif" in lines
    assert lines[-1].startswith("1 checks, 0 gating violation(s); serial, ") and lines[-1].endswith("; exit 0")
    code, out, _ = run(capsys, "ci", "--jobs", "1", *OUTPUTS, "spec/policies/unchecked_growth.yaml")
    assert code == 1
    assert out.splitlines()[-1].startswith("1 checks, 1 gating violation(s); serial, ")


def test_policies_no_entry_covers_are_named_and_nothing_runs(capsys, project):
    project('policies = ["spec/policies/vllm_v1.yaml"]\n[[verify]]\ninvariants = ["seq_cap"]\n')
    code, out, _ = run(capsys, "ci", *OUTPUTS, "spec/policies/tgi_router.yaml")
    assert code == 0
    assert "note: not covered by any entry of the config (not checked): spec/policies/tgi_router.yaml" in out
    assert "note: no check selected" in out
    assert os.path.exists("out/ci.sarif")


def test_an_unreachable_scheduler_is_a_usage_error(capsys, project, monkeypatch):
    from checker import parallel

    monkeypatch.setattr(parallel, "SCHEDULER_CONNECT_S", 1)
    project('policies = ["spec/policies/vllm_v1.yaml"]\n[[verify]]\ninvariants = ["seq_cap"]\n')
    code, out, err = run(capsys, "ci", *OUTPUTS, "--scheduler", "nonsense://x")
    assert (code, out) == (2, "")
    assert err.startswith("batchcheck: error: --scheduler nonsense://x: no Dask scheduler answers there within 1 s "
                          "(ValueError: unknown address scheme 'nonsense'")
    assert _nothing_written(Path.cwd())


def test_a_diff_entry_gates_on_a_regression_located_at_the_new_policy(capsys, project):
    folder = project('[defaults]\nrequests = 2\ndepth = 3\n[[diff]]\nold = "spec/policies/tgi_eager.yaml"\n'
                     'new = "spec/policies/tgi_router.yaml"\ninvariants = ["cancellation_releases:0"]\n').parent
    policies = folder / "spec" / "policies"
    text = (policies / "tgi_router.yaml").read_text()
    assert "release_lag_steps: 1" in text
    (policies / "tgi_eager.yaml").write_text(text.replace("release_lag_steps: 1", "release_lag_steps: 0"))
    code, out, _ = run(capsys, "ci", "--jobs", "1", *OUTPUTS)
    assert code == 1
    first = out.splitlines()[0]
    assert first.startswith("spec/policies/tgi_router.yaml: VIOLATED     cancellation_releases(steps=0)           "
                            "spec/policies/tgi_eager.yaml -> spec/policies/tgi_router.yaml: strictly less safe (")
    assert first.endswith(" -> VIOLATED); NEW worse: 1 request(s), fails at iteration 1")
    sarif = json.loads((folder / "out" / "ci.sarif").read_text())["runs"][0]["results"]
    assert [(r["ruleId"], r["level"], r["locations"][0]["physicalLocation"]["region"]["startLine"]) for r in sarif] \
        == [("diff/cancellation_releases", "error",
             text.splitlines().index("  release_lag_steps: 1") + 1)]
    witness = json.loads((folder / sarif[0]["properties"]["counterexample"]).read_text())
    assert witness["policy"]["file"] == "spec/policies/tgi_router.yaml"


def test_ci_from_a_sub_folder_finds_the_project_config_above(capsys, project, monkeypatch):
    folder = project('policies = ["spec/policies/vllm_v1.yaml"]\n[[verify]]\ninvariants = ["seq_cap"]\n'
                     'requests = 2\ndepth = 1\n').parent
    sub = folder / "deploy" / "canary"
    sub.mkdir(parents=True)
    monkeypatch.chdir(sub)
    code, out, err = run(capsys, "ci", "--jobs", "1")
    assert code == 0, err
    assert out.splitlines()[0].startswith("spec/policies/vllm_v1.yaml: ")
    assert out.splitlines()[-1].startswith("1 checks, 0 gating violation(s)")
