"""Documentation that is generated or quoted must match the code."""

from __future__ import annotations

import re

from checker.docgen import render
from tests.helpers import ROOT


def test_spec_reference_is_current():
    committed = (ROOT / "docs" / "spec-reference.md").read_text()
    assert committed == render(), "regenerate: python -m checker.docgen > docs/spec-reference.md"


def test_readme_opens_with_exactly_two_setup_commands_and_ci_runs_the_second():
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"```bash\n(.*?)```", readme, re.S).group(1).strip().splitlines()
    assert len(block) == 2
    ci = (ROOT / ".ci" / "run").read_text()
    assert block[1] in ci


def test_every_policy_names_its_system_and_weakness():
    for path in sorted((ROOT / "spec" / "policies").glob("*.yaml")):
        header = path.read_text().split("\nname:")[0]
        assert header.startswith("# "), path.name
        assert "weakness" in header.lower(), path.name


def test_every_invariant_is_documented():
    from invariants import CATALOGUE

    text = (ROOT / "docs" / "invariants.md").read_text()
    for name, inv in CATALOGUE.items():
        assert f"| `{name}` |" in text and inv.statement in text, name


def test_the_api_page_documents_every_verb_entry_point():
    # issue 19: the Python API has a docs page; every run_* entry point of checker.api is on it
    import inspect

    import checker.api as api

    names = {n for n, v in vars(api).items() if inspect.isfunction(v) and v.__module__ == "checker.api"
             and n.startswith("run_")} | {n for n in api._ON_FIRST_USE if n.startswith("run_")}
    page = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    assert len(names) >= 10
    assert [n for n in sorted(names) if not re.search(rf"`{n}\(", page)] == []
