"""`batchcheck ci` reports: SARIF valid against the vendored 2.1.0 schema, located at the policy field
each finding judges, with stable fingerprints; JUnit XML that parses with the right counts; the markdown
summary; the exit code; local processes giving the serial verdicts."""

from __future__ import annotations

import json
import os
import xml.etree.ElementTree as ET
from pathlib import Path

import jsonschema
import pytest

from checker.api import run_ci
from checker.ci.findings import FINGERPRINT_KEY
from checker.ci.sarif import MAX_PER_RULE
from checker.exitcodes import ExitCode
from tests.helpers import POLICIES, ROOT
from tests.unit.ci_sample import line_of, make_project

SCHEMA = ROOT / "tests" / "data" / "sarif-schema-2.1.0.json"


@pytest.fixture(scope="module")
def sample(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ci")
    config = make_project(folder)
    cwd = os.getcwd()
    os.chdir(folder)
    try:
        outcome = run_ci(config, jobs=1, junit="out/junit.xml", sarif="out/ci.sarif", summary="out/summary.md")
    finally:
        os.chdir(cwd)
    return folder, outcome


def _verdicts(outcome) -> dict[tuple[str, str], str]:
    return {(f.check.policy.shown, f.check.label): f.result.verdict for f in outcome.findings}


def test_verdicts_and_exit_code(sample):
    _, outcome = sample
    assert _verdicts(outcome) == {
        ("spec/policies/unchecked_growth.yaml", "kv_never_overcommitted(headroom=0)"): "VIOLATED",
        ("spec/policies/tgi_router.yaml", "cancellation_releases(steps=0)"): "VIOLATED",
        ("spec/policies/vllm_v1.yaml", "token_budget"): "HOLDS_UP_TO",
        ("spec/policies/tgi_router.yaml", "token_budget"): "HOLDS_UP_TO",
        ("spec/policies/vllm_v1.yaml", "kv_never_overcommitted(headroom=0)"): "VACUOUS",
        ("spec/policies/vllm_v1.yaml", "kv_within_pool"): "NO_COUNTEREXAMPLE",
    }
    assert outcome.exit_code == ExitCode.VIOLATED  # the unchecked growth gates; the TGI finding only warns


def test_sarif_is_valid_against_the_2_1_0_schema(sample):
    folder, _ = sample
    log = json.loads((folder / "out" / "ci.sarif").read_text())
    jsonschema.Draft4Validator.check_schema(json.loads(SCHEMA.read_text()))
    jsonschema.Draft4Validator(json.loads(SCHEMA.read_text())).validate(log)
    assert log["version"] == "2.1.0"


def test_a_broken_sarif_log_fails_the_schema():
    """The validation can fail: a result without a message is not SARIF."""
    log = {"version": "2.1.0", "runs": [{"tool": {"driver": {"name": "batchcheck"}},
                                         "results": [{"ruleId": "invariant/seq_cap"}]}]}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft4Validator(json.loads(SCHEMA.read_text())).validate(log)


def test_sarif_results_sit_at_the_line_of_the_rule_implicated(sample):
    folder, _ = sample
    results = json.loads((folder / "out" / "ci.sarif").read_text())["runs"][0]["results"]
    where = {(r["ruleId"], r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"]):
             (r["level"], r["locations"][0]["physicalLocation"]["region"]["startLine"]) for r in results}
    policies = folder / "spec" / "policies"
    assert where == {
        ("invariant/kv_never_overcommitted", "spec/policies/unchecked_growth.yaml"):
            ("error", line_of(policies / "unchecked_growth.yaml", "check_allocation:")),
        ("invariant/cancellation_releases", "spec/policies/tgi_router.yaml"):
            ("warning", line_of(policies / "tgi_router.yaml", "release_lag_steps:")),
        ("invariant/kv_never_overcommitted", "spec/policies/vllm_v1.yaml"):  # VACUOUS: gating, inconclusive
            ("warning", line_of(policies / "vllm_v1.yaml", "num_blocks:")),
    }
    assert all(r["partialFingerprints"][FINGERPRINT_KEY] for r in results)


def test_fingerprints_are_stable_and_verdicts_equal_with_local_processes(sample, tmp_path):
    folder, serial = sample
    config = make_project(tmp_path)
    (tmp_path / "spec" / "policies" / "vllm_v1.yaml").write_text(  # moving lines must not move fingerprints
        "# an extra comment line\n" + (folder / "spec" / "policies" / "vllm_v1.yaml").read_text())
    parallel = run_ci(config, jobs=2, sarif=str(tmp_path / "ci.sarif"))
    assert _verdicts(parallel) == _verdicts(serial)

    def prints(path: Path) -> dict:
        return {(r["ruleId"], r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"]):
                r["partialFingerprints"][FINGERPRINT_KEY]
                for r in json.loads(path.read_text())["runs"][0]["results"]}
    first, second = prints(folder / "out" / "ci.sarif"), prints(tmp_path / "ci.sarif")
    assert first == second
    assert len(set(first.values())) == len(first)


def test_junit_xml_parses_and_counts(sample):
    folder, _ = sample
    root = ET.parse(folder / "out" / "junit.xml").getroot()
    cases = root.findall("./testsuite/testcase")
    assert (root.get("tests"), root.get("failures"), root.get("errors"), root.get("skipped")) == ("6", "1", "1", "0")
    assert len(cases) == 6
    failed = [c for c in cases if c.find("failure") is not None]
    assert [(c.get("classname"), c.get("name")) for c in failed] == [
        ("batchcheck.unchecked_growth", "verify kv_never_overcommitted(headroom=0)")]
    assert failed[0].find("failure").get("type") == "VIOLATED"
    errored = [c for c in cases if c.find("error") is not None]
    assert [c.get("name") for c in errored] == ["verify kv_never_overcommitted(headroom=0)"]
    assert {s.get("name"): s.get("tests") for s in root.findall("testsuite")} == {
        "spec/policies/unchecked_growth.yaml": "1", "spec/policies/tgi_router.yaml": "2",
        "spec/policies/vllm_v1.yaml": "3"}


def test_summary_and_counterexamples_written_after_the_run(sample):
    folder, outcome = sample
    text = (folder / "out" / "summary.md").read_text()
    assert text.startswith("## batchcheck ci: gating violation(s) found (exit 1)\n")
    assert "6 checks on 3 policies" in text and "2 violated (1 gating), 1 inconclusive, 3 hold" in text
    assert "safe" not in text.lower()
    replays = [line for line in text.splitlines() if line.startswith("batchcheck replay ")]
    assert len(replays) == 2
    for line in replays:
        doc = json.loads((folder / line.removeprefix("batchcheck replay ")).read_text())
        assert doc["policy"]["file"].startswith("spec/policies/")  # the project's file, not a worker's copy


def test_annotations_are_capped_per_rule_with_the_overflow_in_the_summary(tmp_path):
    extra = MAX_PER_RULE + 2
    folder = tmp_path / "many"
    (folder / "spec" / "policies").mkdir(parents=True)
    base = (POLICIES / "vllm_v1.yaml").read_text()
    for i in range(extra):
        (folder / "spec" / "policies" / f"copy{i:02d}.yaml").write_text(
            base.replace("name: vllm_v1", f"name: copy{i:02d}"))
    config = folder / "batchcheck.toml"
    config.write_text('policies = ["spec/policies/*.yaml"]\n[[verify]]\ninvariants = ["kv_never_overcommitted"]\n'
                      'requests = 1\ndepth = 1\nunbounded = false\n')  # bounded: VACUOUS (the proof: PROVED)
    outcome = run_ci(config, jobs=1, sarif=str(folder / "ci.sarif"), summary=str(folder / "summary.md"))
    assert outcome.exit_code == ExitCode.INCONCLUSIVE  # every check VACUOUS, gating
    results = json.loads((folder / "ci.sarif").read_text())["runs"][0]["results"]
    assert len(results) == MAX_PER_RULE
    summary = (folder / "summary.md").read_text()
    overflow = summary.split(f"### Not annotated on the pull request (over {MAX_PER_RULE} per rule)")[1]
    overflow = overflow.split("###")[0].split("<details>")[0]
    assert sum(1 for line in overflow.splitlines() if line.startswith("| VACUOUS")) == extra - MAX_PER_RULE
