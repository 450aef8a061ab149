"""Issue 19: ``report`` and ``simulate --plot`` exited 101 (ModuleNotFoundError: matplotlib) after the README's own
install. matplotlib is a runtime dependency of the package, not only of the test extra."""

from __future__ import annotations

import re
import tomllib

from tests.helpers import ROOT


def test_matplotlib_is_a_runtime_dependency():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = {re.split(r"[<>=!~\[; ]", dep, maxsplit=1)[0].lower() for dep in project["dependencies"]}
    assert "matplotlib" in names
