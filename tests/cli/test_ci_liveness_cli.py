"""`batchcheck ci` with [[liveness]] entries: a lasso gates (JUnit failure, SARIF result at the policy rule,
lasso file written and replayable), a proof passes, a cut graph is inconclusive, bad values exit 2 located."""

from __future__ import annotations

import json
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests.cli.test_cli import run
from tests.helpers import POLICIES
from tests.unit.ci_sample import line_of, make_project

OUTPUTS = ("--junit", "out/junit.xml", "--sarif", "out/ci.sarif", "--summary", "out/summary.md")
STARVES = '[[liveness]]\npolicies = ["spec/policies/strict_priority.yaml"]\nset = ["batch.max_num_seqs=1"]\n'
AGING = ('[[liveness]]\npolicies = ["spec/policies/priority_aging.yaml"]\nset = ["batch.max_num_seqs=1"]\n'
         'step_ms = 500\noutputs = [1]\nproperties = ["eventually_served"]\n')
CUT = ('[[liveness]]\npolicies = ["spec/policies/vllm_v1.yaml"]\nrequests = 3\nprompts = [16, 600]\n'
       'max_states = 5\n')


@pytest.fixture
def project(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)

    def make(config: str) -> Path:
        path = make_project(tmp_path, config)
        for name in ("strict_priority.yaml", "priority_aging.yaml"):
            shutil.copy(POLICIES / name, tmp_path / "spec" / "policies" / name)
        shutil.copy(POLICIES / "prefix_caching" / "vllm_v1.yaml", tmp_path / "spec" / "policies" / "cached.yaml")
        return path
    return make


def _cases(folder: Path) -> dict[str, ET.Element]:
    root = ET.parse(folder / "out" / "junit.xml").getroot()
    return {case.get("name"): case for case in root.iter("testcase")}


def test_a_liveness_lasso_gates_with_its_lasso_file_at_the_queue_rule(capsys, project):
    folder = project('[output]\ncounterexamples = "out/lassos"\n' + STARVES).parent
    code, out, _ = run(capsys, "ci", "--jobs", "1", *OUTPUTS)
    assert code == 1
    assert out.splitlines()[-1].startswith("3 checks, 1 gating violation(s); serial, ")
    cases = _cases(folder)
    label = "(requests=2, batch.max_num_seqs=1)"
    assert sorted(cases) == [f"liveness {p}{label}" for p in ("eventually_served", "no_deadlock", "no_livelock")]
    failure = cases[f"liveness eventually_served{label}"].find("failure")
    assert failure is not None and failure.get("type") == "VIOLATED"
    for prop in ("no_deadlock", "no_livelock"):
        text = cases[f"liveness {prop}{label}"].find("system-out").text
        assert text.startswith("PROVED") and "graph: 17 states, 58 edges (complete)" in text
    (result,) = json.loads((folder / "out" / "ci.sarif").read_text())["runs"][0]["results"]
    policy = folder / "spec" / "policies" / "strict_priority.yaml"
    assert (result["ruleId"], result["level"]) == ("liveness/eventually_served", "error")
    assert result["locations"][0]["physicalLocation"]["region"]["startLine"] == line_of(policy, "order:")
    assert result["properties"]["field"] == "queue.order"
    lasso = Path(result["properties"]["counterexample"])
    assert lasso.parent == Path("out/lassos") and lasso.name.startswith("strict_priority__eventually_served_lasso__")
    doc = json.loads(lasso.read_text())
    assert doc["policy"]["file"] == "spec/policies/strict_priority.yaml"
    assert doc["environment"]["policy_overrides"] == ["batch.max_num_seqs=1"]
    summary = (folder / "out" / "summary.md").read_text()
    assert f"batchcheck replay {lasso}" in summary and "safe" not in summary.lower()
    code, out, _ = run(capsys, "replay", str(lasso))
    assert code == 1 and "eventually_served VIOLATED at iteration" in out


def test_proved_liveness_passes_in_parallel_and_says_for_which_instance(capsys, project):
    folder = project(AGING + '[[liveness]]\npolicies = ["spec/policies/vllm_v1.yaml"]\nrequests = 2\n'
                             'set = ["batch.max_num_seqs=1"]\n').parent
    code, out, _ = run(capsys, "ci", "--jobs", "2", *OUTPUTS)
    assert code == 0, out
    assert out.splitlines()[-1].startswith("4 checks, 0 gating violation(s); 2 local process(es), ")
    aging = out.splitlines()[0]
    assert aging.startswith("spec/policies/priority_aging.yaml: PROVED             eventually_served  no lasso in the "
                            "complete graph: for this instance, any number of iterations; graph: 4 states, 12 edges "
                            "(complete); instance: 2 request(s) in flight, prompts {16}, outputs {1}, priorities "
                            "{0, 1}, 1 tenant(s), no cancellations, 500 ms per iteration, batch.max_num_seqs=1; "
                            "starvation bound: 2 iteration(s)")
    assert json.loads((folder / "out" / "ci.sarif").read_text())["runs"][0]["results"] == []
    assert not (folder / "counterexamples").exists()
    assert "safe" not in (folder / "out" / "summary.md").read_text().lower()


def test_a_cut_graph_is_inconclusive_and_gated_by_the_gate_setting(capsys, project):
    folder = project(CUT).parent
    code, out, _ = run(capsys, "ci", "--jobs", "1", *OUTPUTS)
    assert code == 3
    assert "NO_COUNTEREXAMPLE  no_deadlock        no lasso among the states explored, but the graph is not complete " \
           "(state limit (5) reached); graph: 1 states, 0 edges (cut)" in out  # the first state's 14 successors exceed it
    errors = [case.find("error") for case in _cases(folder).values()]
    assert [e.get("type") for e in errors] == ["NO_COUNTEREXAMPLE"] * 3
    results = json.loads((folder / "out" / "ci.sarif").read_text())["runs"][0]["results"]
    assert sorted((r["ruleId"], r["level"]) for r in results) == [
        ("liveness/eventually_served", "warning"), ("liveness/no_deadlock", "warning"),
        ("liveness/no_livelock", "warning")]
    project('[gate]\ninconclusive = "warning"\n' + CUT)
    code, _, _ = run(capsys, "ci", "--jobs", "1", *OUTPUTS)
    assert code == 0
    assert [case.find("skipped") is not None for case in _cases(folder).values()] == [True] * 3


BAD = [
    ('[[liveness]]\npolicies = ["spec/policies/vllm_v1.yaml"]\nproperties = ["eventually_served", "starvation"]\n',
     ("batchcheck.toml:3: liveness[0].properties[1]='starvation' (expected one of: eventually_served, no_livelock, "
      "no_deadlock or no_hold_and_wait)")),
    (('[[liveness]]\npolicies = ["spec/policies/vllm_v1.yaml"]\nset = [\n  "batch.max_num_seqs=1",\n'
      '  "batch.max_num_seqs=0",\n]\n'),
     ("batchcheck.toml:5: liveness[0].set[1]='batch.max_num_seqs=0' (expected batch.max_num_seqs: a number >= 1 in "
      "spec/policies/vllm_v1.yaml)")),
    ('[[liveness]]\npolicies = ["spec/policies/vllm_v1.yaml"]\nset = ["max_num_seqs"]\n',
     ("batchcheck.toml:3: liveness[0].set[0]='max_num_seqs' (expected FIELD.PATH=VALUE, e.g. batch.max_num_seqs=1 "
      "in spec/policies/vllm_v1.yaml)")),
    ('[[liveness]]\npolicies = ["spec/policies/vllm_v1.yaml"]\nidentities = ["g0"]\n',
     ("batchcheck.toml:3: liveness[0].identities=['g0'] (expected only with kv.prefix_caching.enabled: true (without "
      "the cache a prompt's tokens are never read) for spec/policies/vllm_v1.yaml)")),
    ('[[liveness]]\npolicies = ["spec/policies/cached.yaml"]\nidentities = ["g2"]\n',
     "batchcheck.toml:3: liveness[0].identities[0]='g2' (expected one of: own, g0, g1 or g0+1)"),
    ('[[liveness]]\npolicies = ["spec/policies/priority_aging.yaml"]\nstep_ms = 300\n',
     ("batchcheck.toml:3: liveness[0].step_ms=300 (expected a divisor of the aging interval (1000 ms), so that ages "
      "are whole iterations for spec/policies/priority_aging.yaml)")),
    ('[[liveness]]\npolicies = ["spec/policies/vllm_v1.yaml"]\nmax_states = 0\noutputs = [0]\nrequest = 2\n',
     ("batchcheck.toml:4: liveness[0].outputs[0]=0 (expected a number >= 1)\n"
      "batchcheck.toml:3: liveness[0].max_states=0 (expected a number >= 1)\n"
      "batchcheck.toml:5: liveness[0].request=2 (expected a known key; did you mean requests? allowed here: accepted, arrivals_per_step, "
      "cancellations, external, identities, level, max_states, outputs, policies, priorities, prompts, properties, requests, set, "
      "step_ms, tenants, timeout_s)")),
]


@pytest.mark.parametrize("config, message", BAD)
def test_bad_liveness_values_exit_2_located_with_nothing_written(capsys, project, config, message):
    folder = project(config).parent
    code, out, err = run(capsys, "ci", *OUTPUTS)
    assert (code, out) == (2, "")
    assert err == f"batchcheck: error: {message}\n"
    assert not (folder / "out").exists() and not (folder / "counterexamples").exists()


def test_an_instance_that_never_reaches_the_limits_is_vacuous_not_proved(capsys, project):
    # vLLM v1 with one request in flight: nobody ever waits, so the pool and slot limits decide nothing
    project('[[liveness]]\npolicies = ["spec/policies/vllm_v1.yaml"]\nrequests = 1\n')
    code, out, _ = run(capsys, "ci", "--jobs", "1", *OUTPUTS)
    assert code == 3
    assert "VACUOUS            eventually_served  no lasso in the complete graph, but no request ever waits in this " \
           "instance (1 request(s) in flight, every arrival admitted in its iteration, none rejected)" in out



def test_a_caching_policys_instance_takes_its_prompt_identities_from_the_entry(capsys, project):
    project('[[liveness]]\npolicies = ["spec/policies/cached.yaml"]\nset = ["kv.num_blocks=6", '
            '"batch.max_num_seqs=1"]\nprompts = [20, 40]\nidentities = ["g0", "g1"]\n'
            'properties = ["eventually_served"]\n')
    code, out, _ = run(capsys, "ci", "--jobs", "1", *OUTPUTS)
    assert code == 0, out
    assert "prompts {20, 40}, prompt identities {g0, g1}" in out


def test_a_connector_policy_gets_no_hold_and_wait_by_default_with_the_external_hits_chosen(capsys, project):
    folder = project('[[liveness]]\npolicies = ["spec/policies/scan_in_queue.yaml"]\nprompts = [32]\n'
                     'external = ["none", "all"]\nset = ["kv.num_blocks=3", "connector.transfers_may_hang=false"]\n').parent
    shutil.copy(POLICIES / "connector" / "decode_node_scan_in_queue.yaml",
                folder / "spec" / "policies" / "scan_in_queue.yaml")
    code, out, _ = run(capsys, "ci", "--jobs", "1", *OUTPUTS)
    assert code == 1, out
    label = "(requests=2, prompts=32, external=none,all, kv.num_blocks=3, connector.transfers_may_hang=false)"
    cases = _cases(folder)
    assert sorted(cases) == [f"liveness {p}{label}" for p in ("eventually_served", "no_deadlock", "no_hold_and_wait",
                                                               "no_livelock")]
    for prop in ("no_deadlock", "no_hold_and_wait"):
        assert cases[f"liveness {prop}{label}"].find("failure").get("type") == "VIOLATED", prop


def test_an_unknown_external_hit_is_refused_at_its_key(capsys, project):
    folder = project('[[liveness]]\npolicies = ["spec/policies/vllm_v1.yaml"]\nexternal = ["half"]\n').parent
    code, _, err = run(capsys, "ci", "--jobs", "1", *OUTPUTS)
    assert code == 2
    assert err == "batchcheck: error: batchcheck.toml:3: liveness[0].external[0]='half' (expected one of: none, block or all)\n"


def test_a_speculative_policys_instance_takes_the_accepted_counts_from_the_entry(capsys, project):
    """[[liveness]] accepted = [...] is liveness --accepted: the planted EAGLE deadlock gates with the verifier
    accepting nothing; the counts are in the check's label."""
    folder = project('[[liveness]]\npolicies = ["spec/policies/eagle.yaml"]\naccepted = [0]\n'
                     'prompts = [8]\noutputs = [2]\nproperties = ["no_deadlock"]\n').parent
    shutil.copy(POLICIES / "broken" / "eagle_lookahead_deadlock.yaml", folder / "spec" / "policies" / "eagle.yaml")
    code, out, _ = run(capsys, "ci", "--jobs", "1", *OUTPUTS)
    assert code == 1, out
    (name,) = _cases(folder)
    assert "accepted=0" in name and _cases(folder)[name].find("failure").get("type") == "VIOLATED"


def test_accepted_counts_beyond_the_drafts_are_refused_at_their_key(capsys, project):
    folder = project('[[liveness]]\npolicies = ["spec/policies/eagle.yaml"]\naccepted = [0, 9]\n').parent
    shutil.copy(POLICIES / "broken" / "eagle_lookahead_deadlock.yaml", folder / "spec" / "policies" / "eagle.yaml")
    code, out, err = run(capsys, "ci", "--jobs", "1", *OUTPUTS)
    assert (code, out) == (2, "")
    assert err.startswith("batchcheck: error: batchcheck.toml:3: liveness[0].accepted=[0, 9] (expected draft counts "
                          "in 0..4"), err
