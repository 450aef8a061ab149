"""User invariants, added without editing this package: from a module (``--invariant-module``, a dotted
name or a .py file) or from the ``batchcheck.invariants`` entry-point group. A module provides a list
``INVARIANTS`` of ``invariants.Invariant`` (build them with ``invariants.invariant(check, trigger, ...)``).
"""

from __future__ import annotations

import importlib
import importlib.util
from importlib.metadata import entry_points
from pathlib import Path
from types import ModuleType

from checker.errors import InputError, Problem
from invariants.catalogue import CATALOGUE, Invariant

ENTRY_POINT_GROUP = "batchcheck.invariants"
# invariant name -> the --invariant-module it was loaded from, as given (a counterexample of it records this, so
# that replay and report load it again); entry-point invariants load by themselves and are not listed
ORIGINS: dict[str, str] = {}


def _import(spec: str) -> ModuleType:
    try:
        if spec.endswith(".py"):
            path = Path(spec)
            module_spec = importlib.util.spec_from_file_location(f"batchcheck_user_{path.stem}", path)
            if module_spec is None or module_spec.loader is None or not path.exists():
                raise InputError(Problem("--invariant-module", spec, "an existing .py file or an importable module"))
            module = importlib.util.module_from_spec(module_spec)
            module_spec.loader.exec_module(module)
            return module
        return importlib.import_module(spec)
    except InputError:
        raise
    except Exception as exc:  # the user's module failed to import: say so, no traceback
        raise InputError(Problem("--invariant-module", spec, f"a module that imports cleanly "
                                 f"(it raised {type(exc).__name__}: {exc})")) from None


def register(found: object, source: str) -> list[str]:
    if not isinstance(found, (list, tuple)) or not all(isinstance(x, Invariant) for x in found):
        raise InputError(Problem(f"{source}.INVARIANTS", type(found).__name__,
                                 "a list of invariants.Invariant (see docs/invariants.md)"))
    names = []
    for inv in found:
        if inv.name in CATALOGUE and CATALOGUE[inv.name] is not inv:
            raise InputError(Problem(f"{source}.INVARIANTS", inv.name, "a name not already in the catalogue"))
        CATALOGUE[inv.name] = inv
        names.append(inv.name)
    return names


def load_module(spec: str) -> list[str]:
    module = _import(spec)
    names = register(getattr(module, "INVARIANTS", None), spec)
    ORIGINS.update(dict.fromkeys(names, spec))
    return names


def load_recorded(name: str, spec: str, source: str) -> None:
    """Load the module a counterexample of user invariant ``name`` recorded (``source``: that file), unless the
    invariant is in the catalogue already (an --invariant-module given with replay or report comes first)."""
    if name in CATALOGUE:
        return
    try:
        load_module(spec)
    except InputError as exc:
        raise InputError(Problem("property.module", spec, f"{exc.problems[0].expected}: the module of user invariant "
                                 f"{name}, recorded when it was found (give it with --invariant-module)"),
                         source) from None


def load_entry_points() -> list[str]:
    names = []
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        loaded = ep.load()
        names += register(getattr(loaded, "INVARIANTS", loaded), f"entry point {ep.name}")
    return names
