"""``invariant_modules`` in batchcheck.toml is code that ci imports and runs (docs/ci.md, "Invariant modules run
code"): a module outside the config's folder is refused, naming the entry and where the module lies, unless
``ci --allow-outside-modules`` allows it (issue 23). Nothing is imported before the refusal."""

from __future__ import annotations

from pathlib import Path

from tests.cli.test_cli import run
from tests.helpers import POLICIES

CONFIG = ('policies = ["spec/vllm_v1.yaml"]\ninvariant_modules = ["{module}"]\n[defaults]\nrequests = 1\n'
          'depth = 1\ntimeout_s = 10\n[[verify]]\ninvariants = ["token_budget"]\n')
MARKER = "outside_marker_{name}"
MODULE = 'import pathlib\npathlib.Path({marker!r}).write_text("imported")\nINVARIANTS = []\n'


def _project(tmp_path: Path, module: str) -> Path:
    project = tmp_path / "project"
    (project / "spec").mkdir(parents=True)
    (project / "spec" / "vllm_v1.yaml").write_text((POLICIES / "vllm_v1.yaml").read_text())
    (project / "batchcheck.toml").write_text(CONFIG.format(module=module))
    return project


def test_a_py_file_outside_the_config_folder_is_refused_unless_allowed(capsys, tmp_path, monkeypatch):
    marker = tmp_path / "ran"
    (tmp_path / "evil.py").write_text(MODULE.format(marker=str(marker)))
    project = _project(tmp_path, "../evil.py")
    monkeypatch.chdir(project)
    code, out, err = run(capsys, "ci", "--jobs", "1")
    assert (code, out) == (2, "")
    assert err.startswith("batchcheck: error: batchcheck.toml:2: invariant_modules[0]='../evil.py' (expected a "
                          f"module inside {project} (it is code that ci runs: ../evil.py is {tmp_path / 'evil.py'}; "
                          "ci --allow-outside-modules allows it))"), err
    assert not marker.exists()  # refused before it was imported
    code, out, err = run(capsys, "ci", "--jobs", "1", "--allow-outside-modules")
    assert code == 0, err
    assert marker.read_text() == "imported"


def test_an_installed_or_builtin_module_is_outside(capsys, tmp_path, monkeypatch):
    for module, where in (("json", "json is "), ("sys", "sys is built into Python")):
        project = _project(tmp_path / module, module)
        monkeypatch.chdir(project)
        code, out, err = run(capsys, "ci", "--jobs", "1")
        assert (code, out) == (2, "")
        assert f"invariant_modules[0]='{module}' (expected a module inside {project}" in err, err
        assert where in err, err


def test_a_module_inside_the_config_folder_runs(capsys, tmp_path, monkeypatch):
    project = _project(tmp_path, "checks/mine.py")
    (project / "checks").mkdir()
    (project / "checks" / "mine.py").write_text(MODULE.format(marker=str(tmp_path / "ran")))
    monkeypatch.chdir(project)
    code, out, err = run(capsys, "ci", "--jobs", "1")
    assert code == 0, err
    assert (tmp_path / "ran").read_text() == "imported"
