"""A user invariant module that raises, on import or while an invariant is evaluated (SystemExit and other
BaseException subclasses included), is the user's error: exit 2 naming the module, the invariant and the
exception; never exit 0 with no output, never "internal error" (exit 101), never a traceback (issue 23)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.cli.test_cli import run
from tests.helpers import POLICIES, ROOT

POLICY = str(POLICIES / "vllm_v1.yaml")
RAISES = '''from invariants import invariant


class NotAnException(BaseException):
    pass


def {name}(o, ctx, t):
    """It raises."""
    {body}


def _trigger(o, ctx, t):
    return True


INVARIANTS = [invariant({name}, _trigger)]
'''
EVALUATED = "an invariant that returns a condition for every frame"


def _module(tmp_path: Path, name: str, body: str) -> Path:
    path = tmp_path / f"{name}.py"
    path.write_text(RAISES.format(name=name, body=body))
    return path


def _verify(capsys, module: Path, invariant: str | None = None) -> tuple[int, str, str]:
    return run(capsys, "verify", POLICY, "--invariant-module", str(module), *(("--invariant", invariant) if invariant
                                                                              else ()), "--requests", "1", "--depth", "1")


def test_an_invariant_that_raises_is_exit_2_naming_module_invariant_and_exception(capsys, tmp_path):
    module = _module(tmp_path, "user_divides_by_zero", "return 1 // 0")
    code, out, err = _verify(capsys, module, "user_divides_by_zero")
    assert (code, out) == (2, "")
    assert err == (f"batchcheck: error: {module}:10: invariant user_divides_by_zero=<raised ZeroDivisionError: integer "
                   f"division or modulo by zero> (expected {EVALUATED} (user invariant module {module}; its error, "
                   "not batchcheck's))\n")


def test_system_exit_and_other_base_exceptions_in_an_invariant(capsys, tmp_path):
    module = _module(tmp_path, "user_exits", "raise SystemExit(0)")
    code, out, err = _verify(capsys, module, "user_exits")
    assert (code, out) == (2, "")
    assert err == (f"batchcheck: error: {module}:10: invariant user_exits=<raised SystemExit: 0> (expected {EVALUATED} "
                   f"(user invariant module {module}; its error, not batchcheck's))\n")
    module = _module(tmp_path, "user_base_exception", "raise NotAnException('odd')")
    code, out, err = _verify(capsys, module, "user_base_exception")
    assert (code, out) == (2, "")
    assert err == (f"batchcheck: error: {module}:10: invariant user_base_exception=<raised NotAnException: odd> "
                   f"(expected {EVALUATED} (user invariant module {module}; its error, not batchcheck's))\n")


def test_system_exit_on_import_is_exit_2_not_a_silent_exit_0(capsys, tmp_path):
    module = tmp_path / "exits_on_import.py"
    module.write_text("import sys\n\nsys.exit(0)\n")
    code, out, err = _verify(capsys, module)
    assert (code, out) == (2, "")
    assert err == (f"batchcheck: error: {module}:3: (import)=<raised SystemExit: 0> (expected a module that imports "
                   f"cleanly and defines INVARIANTS (user invariant module {module}; its error, not batchcheck's))\n")


def test_as_a_process_no_traceback(tmp_path):
    module = tmp_path / "exits_on_import.py"
    module.write_text("raise SystemExit(0)\n")
    done = subprocess.run([sys.executable, "-m", "checker.cli", "verify", POLICY, "--invariant-module", str(module)],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr.startswith(f"batchcheck: error: {module}:1: (import)=<raised SystemExit: 0>")
    assert "Traceback" not in done.stderr


def test_ci_invariant_modules(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "spec").mkdir()
    (tmp_path / "spec" / "vllm_v1.yaml").write_text(Path(POLICY).read_text())
    _module(tmp_path, "ci_user_raises", "raise KeyError('slot')")
    config = ('policies = ["spec/vllm_v1.yaml"]\ninvariant_modules = ["{module}"]\n[defaults]\nrequests = 1\n'
              'depth = 1\n[[verify]]\ninvariants = ["{invariant}"]\n')
    (tmp_path / "batchcheck.toml").write_text(config.format(module="ci_user_raises.py", invariant="ci_user_raises"))
    code, out, err = run(capsys, "ci", "--jobs", "1")
    assert (code, out) == (2, "")
    assert err == ("batchcheck: error: verify[0].invariants[0], policy spec/vllm_v1.yaml, ci_user_raises: "
                   "ci_user_raises.py:10: invariant ci_user_raises=<raised KeyError: 'slot'> (expected "
                   f"{EVALUATED} (user invariant module ci_user_raises.py; its error, not batchcheck's))\n")
    (tmp_path / "ci_exits.py").write_text("raise SystemExit(3)\n")
    (tmp_path / "batchcheck.toml").write_text(config.format(module="ci_exits.py", invariant="token_budget"))
    code, out, err = run(capsys, "ci", "--jobs", "1")
    assert (code, out) == (2, "")
    assert err == ("batchcheck: error: batchcheck.toml:2: invariant_modules[0]='ci_exits.py' (expected a module "
                   "that imports cleanly (it raised SystemExit: 3))\n")
