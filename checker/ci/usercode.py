"""User code that the checks run: invariant modules (``verify --invariant-module``, batchcheck.toml's
``invariant_modules``, the ``batchcheck.invariants`` entry points). An exception such code raises, while it is
imported or while one of its invariants is evaluated, SystemExit and other BaseException subclasses included
(never KeyboardInterrupt: that is Ctrl-C), is the user's error: exit 2, naming the module, the invariant and
the exception, never "internal error" (exit 101) and never a silent exit. ``user_code_error`` tells such an
exception from one of batchcheck's own by its traceback: the outermost frame that runs user code."""

from __future__ import annotations

import os
import sysconfig
import traceback
from pathlib import Path
from types import FrameType

from checker.errors import InputError, Problem

_OWN = tuple(str(Path(p).resolve()) + os.sep for p in (
    Path(__file__).resolve().parents[1],  # checker/
    Path(__file__).resolve().parents[2] / "invariants",
    *{sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")}))

# A user module carried into a temporary folder (ci's workers) -> the name its config gives it.
SHOWN_AS: dict[str, str] = {}


def _user_modules() -> set[str]:
    """The modules that define the registered invariants that are not batchcheck's own."""
    from invariants.catalogue import CATALOGUE

    found = set()
    for inv in CATALOGUE.values():
        for fn in (inv.check, inv.trigger):
            code = getattr(fn, "__code__", None)
            if code is not None and not _own_file(code.co_filename):
                found.add(getattr(fn, "__module__", ""))
    return found


def _own_file(filename: str) -> bool:
    """batchcheck's own code, the standard library or an installed package (a user invariant module installed as
    a package is known by the invariants it registered: ``_user_modules``)."""
    if filename.startswith("<"):
        return True
    resolved = str(Path(filename).resolve())
    return resolved.startswith(_OWN) or any(f"{os.sep}{d}{os.sep}" in resolved for d in ("site-packages",
                                                                                          "dist-packages"))


def _shown(filename: str) -> str:
    """A file below the working directory by its relative path, any other by its absolute one."""
    relative = os.path.relpath(filename)
    return filename if relative.startswith("..") else relative


def _is_user(frame: FrameType, modules: set[str]) -> bool:
    name = frame.f_globals.get("__name__", "")
    return name.startswith("batchcheck_user_") or name in modules or not _own_file(frame.f_code.co_filename)


def _invariant_of(frame: FrameType) -> str | None:
    from invariants.catalogue import CATALOGUE

    for inv in CATALOGUE.values():
        if frame.f_code in (getattr(inv.check, "__code__", None), getattr(inv.trigger, "__code__", None)):
            return inv.name
    return None


def user_code_error(exc: BaseException) -> InputError | None:
    """The located input error for an exception raised in a user invariant module, or None when its traceback
    runs no user code (a bug of batchcheck's, or a Ctrl-C)."""
    if isinstance(exc, KeyboardInterrupt):
        return None
    modules = _user_modules()
    frames = [frame for frame, _ in traceback.walk_tb(exc.__traceback__)]
    user = [(frame, line) for frame, line in traceback.walk_tb(exc.__traceback__) if _is_user(frame, modules)]
    if not user:
        return None
    frame, line = user[0]  # where batchcheck called into the user's code
    module = SHOWN_AS.get(frame.f_code.co_filename) or _shown(frame.f_code.co_filename)
    raised = f"<raised {type(exc).__name__}" + (f": {exc}>" if str(exc) else ">")
    if frame.f_code.co_name == "<module>":
        return InputError(Problem("(import)", raised, f"a module that imports cleanly and defines INVARIANTS (user "
                                  f"invariant module {module}; its error, not batchcheck's)", line), module)
    name = _invariant_of(frame) or next((n for f in frames if (n := _invariant_of(f))), None)
    what = f"invariant {name}" if name is not None else f"{frame.f_code.co_name}()"
    return InputError(Problem(what, raised, f"an invariant that returns a condition for every frame (user invariant "
                              f"module {module}; its error, not batchcheck's)", line), module)
