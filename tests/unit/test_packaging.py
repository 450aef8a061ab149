"""Packaging: the wheel's package list is the packages on disk, the examples ship as batchcheck_examples and
resolve by name, and the changelog's first entry is the version (.ci/wheel_check.sh builds and installs the
wheel itself and runs every verb from it)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import checker
from checker import examples
from tests.helpers import ROOT

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_the_package_list_is_every_package_on_disk():
    on_disk = {".".join(d.relative_to(ROOT).parts) for top in ("checker", "invariants")
               for d in [ROOT / top, *(ROOT / top).rglob("*")]
               if d.is_dir() and d.name != "__pycache__" and any(d.glob("*.py"))}
    listed = set(PYPROJECT["tool"]["setuptools"]["packages"])
    assert listed - {"batchcheck_examples"} == on_disk


def test_the_examples_are_spec_and_ship_their_files():
    setuptools = PYPROJECT["tool"]["setuptools"]
    assert setuptools["package-dir"] == {"batchcheck_examples": "spec"}
    patterns = setuptools["package-data"]["batchcheck_examples"]
    shipped = {f.suffix for f in (ROOT / "spec").rglob("*") if f.is_file() and f.suffix != ".py"}
    assert {f"**/*{s}" for s in shipped} - {"**/*.png"} <= set(patterns)  # the residual plots stay out


def test_the_changelog_opens_with_this_version():
    first = re.search(r"^## (\S+) ", (ROOT / "CHANGELOG.md").read_text(), re.M)
    assert first and first.group(1) == checker.__version__


def test_a_bare_name_is_a_shipped_example_and_a_path_stays_a_path(tmp_path, monkeypatch):
    assert examples.resolve("vllm_v1", "policy") == ROOT / "spec" / "policies" / "vllm_v1.yaml"
    assert examples.resolve("prefix_caching/vllm_v1", "policy") == ROOT / "spec" / "policies" / "prefix_caching" / "vllm_v1.yaml"
    assert examples.resolve("chat_mixed", "workload") == ROOT / "spec" / "workloads" / "chat_mixed.yaml"
    assert examples.resolve("kv_safety", "slo") == ROOT / "spec" / "slo" / "kv_safety.slo.yaml"
    assert examples.resolve("a100-llama-2-70b-tp2", "profile").name == "a100-llama-2-70b-tp2.json"
    for given in ("nope", "vllm_v1.yaml", "./vllm_v1", "chat_mixed"):
        assert examples.resolve(given, "policy") == Path(given)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "vllm_v1").write_text("kv: {}\n")  # a file of that name here is the user's
    assert examples.resolve("vllm_v1", "policy") == tmp_path.joinpath("vllm_v1").relative_to(tmp_path)


def test_the_names_list_the_examples():
    assert {"vllm_v1", "prefix_caching/vllm_v1", "broken/unchecked_growth"} <= set(examples.names("policy"))
    assert "chat_mixed" in examples.names("workload") and "chat_mixed.slo" not in examples.names("workload")


def test_the_cli_takes_example_names_outside_a_checkout(tmp_path, monkeypatch, capsys):
    from checker.cli import main

    monkeypatch.chdir(tmp_path)  # no spec/ here
    assert main(["validate", "vllm_v1", "chat_mixed", "kv_safety"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == [f"{ROOT}/spec/policies/vllm_v1.yaml: valid policy", f"{ROOT}/spec/workloads/chat_mixed.yaml: "
                   "valid workload", f"{ROOT}/spec/slo/kv_safety.slo.yaml: valid slo"]
    assert main(["simulate", "vllm_v1", "--workload", "chat_mixed", "--limit", "5"]) == 0
    assert capsys.readouterr().out.startswith(f"policy vllm_v1  |  requests from {ROOT}/spec/workloads/chat_mixed.yaml")
    assert main(["simulate", "vllm_v11", "--workload", "chat_mixed"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("batchcheck: error: vllm_v11: (document)='vllm_v11' (expected an existing file, or the "
                          "name of a shipped policy example (broken/")
    assert "broken/thrash_recompute, " in err and " vllm_v1, " in err
    assert err.rstrip().endswith("; did you mean vllm_v1?)")
