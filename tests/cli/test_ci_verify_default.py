"""ci's [[verify]] checks follow verify's default (issue 19: the cheapest decisive method first): without
``unbounded`` in the config, the proof where a proof method covers the policy, then the bounded search; the bounded
search alone with ``unbounded = false``; a policy no proof covers (prefix caching) is checked, not refused."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from tests.cli.test_cli import run
from tests.helpers import POLICIES

CONFIG = '''policies = ["spec/*.yaml"]
[defaults]
requests = 2
depth = 2
timeout_s = 60
{unbounded}
[[verify]]
invariants = ["seq_cap"]
'''


def _verdicts(capsys, tmp_path: Path, monkeypatch, unbounded: str, **policies: Path) -> dict[str, str]:
    (tmp_path / "spec").mkdir()
    for name, policy in policies.items():
        shutil.copy(policy, tmp_path / "spec" / f"{name}.yaml")
    (tmp_path / "batchcheck.toml").write_text(CONFIG.format(unbounded=unbounded))
    monkeypatch.chdir(tmp_path)
    code, out, err = run(capsys, "ci", "--jobs", "1", "--json")
    assert code == 0, out + err
    return {Path(f["policy"]).stem: f["verdict"] for f in json.loads(out)["findings"]}


def test_without_unbounded_ci_verify_runs_the_proof_first(capsys, tmp_path, monkeypatch):
    # before: a config without the key ran the bounded search alone (HOLDS_UP_TO)
    verdicts = _verdicts(capsys, tmp_path, monkeypatch, "", plain=POLICIES / "vllm_v1.yaml",
                         caching=POLICIES / "prefix_caching" / "vllm_v1.yaml")
    assert verdicts == {"plain": "PROVED", "caching": "HOLDS_UP_TO"}  # no proof covers the cache: bounded


def test_unbounded_false_is_the_bounded_search_alone(capsys, tmp_path, monkeypatch):
    verdicts = _verdicts(capsys, tmp_path, monkeypatch, "unbounded = false", plain=POLICIES / "vllm_v1.yaml")
    assert verdicts == {"plain": "HOLDS_UP_TO"}


TEMPORAL = '''policies = ["spec/*.yaml"]
[defaults]
requests = 2
depth = 2
timeout_s = 120
{defaults}
[[verify]]
invariants = ["cancellation_releases:2"]
{entry}
'''


def test_temporal_induction_in_a_verify_entry_proves_a_windowed_invariant(capsys, tmp_path, monkeypatch):
    """[[verify]] temporal_induction = true is verify --temporal-induction: PROVED by k-induction (without it the
    bounded search alone: HOLDS_UP_TO)."""
    (tmp_path / "spec").mkdir()
    shutil.copy(POLICIES / "vllm_v1.yaml", tmp_path / "spec" / "plain.yaml")
    monkeypatch.chdir(tmp_path)
    found = {}
    for entry in ("", "temporal_induction = true"):
        (tmp_path / "batchcheck.toml").write_text(TEMPORAL.format(defaults="", entry=entry))
        code, out, err = run(capsys, "ci", "--jobs", "1", "--json")
        assert code == 0, out + err
        (finding,) = json.loads(out)["findings"]
        found[entry] = finding["verdict"]
    assert found == {"": "HOLDS_UP_TO", "temporal_induction = true": "PROVED"}


def test_temporal_induction_with_the_bounded_search_alone_is_a_located_config_error(capsys, tmp_path, monkeypatch):
    (tmp_path / "spec").mkdir()
    shutil.copy(POLICIES / "vllm_v1.yaml", tmp_path / "spec" / "plain.yaml")
    (tmp_path / "batchcheck.toml").write_text(TEMPORAL.format(defaults="unbounded = false",
                                                              entry="temporal_induction = true"))
    monkeypatch.chdir(tmp_path)
    code, out, err = run(capsys, "ci", "--jobs", "1")
    assert (code, out) == (2, "")
    assert err == ("batchcheck: error: batchcheck.toml:9: verify[0].temporal_induction=True (expected false with "
                   "unbounded = false (k-induction is a proof; the bounded search alone cannot use it))\n")
