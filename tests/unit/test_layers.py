"""The layers of checker/ (docs/design.md, "Who owns what"), read from the imports of the code itself.

Bottom up: inputs -> semantics -> {engine, smt, liveness explorer, frames, invariants} -> checks -> outputs
-> the facade checker/api.py -> the command line (checker/cli.py and checker/commands/). Nothing imports
upward. Every import counts, the ones inside functions too (a lazy import is still a dependency).
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

from tests.helpers import ROOT

CHECKER = ROOT / "checker"
INPUTS = ("policy", "workload", "traces", "requests", "profile", "loading", "errors", "inputfiles", "examples")
CLI_LAYER = ("checker.cli", "checker.commands")
# docs/design.md, "Who owns what": every module's layer, bottom up (a package or a module; the longest name wins)
LAYERS: tuple[tuple[str, ...], ...] = (
    ("checker.exitcodes", "checker.errors", "checker.fileio", "checker.childproc", "checker.parallel", "checker.loading",
     "checker.requests",
     "checker.policy",
     "checker.workload", "checker.traces", "checker.profile", "checker.inputfiles", "checker.examples", "checker.docgen",
     "checker.strategies", "checker.importers", "checker.calibrate"),
    ("checker.semantics",),
    ("checker.engine", "checker.metrics", "checker.fastforward", "checker.smt", "checker.frames",
     "checker.liveness.explore", "checker.liveness.canon", "checker.liveness.lasso", "checker.liveness.properties",
     "invariants"),
    ("checker.verify", "checker.fuzz", "checker.diff", "checker.audit", "checker.liveness.check", "checker.checklog",
     "checker.checkmetrics", "checker.fleet"),
    ("checker.report", "checker.bugreport", "checker.ci"),
    ("checker.api",),
    CLI_LAYER,
)
PACKAGES = ("checker", "checker.liveness")  # their __init__.py holds no code of a layer


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@cache
def _imports() -> dict[str, frozenset[str]]:
    """Each module under checker/ -> the modules it imports (``from a import b`` counts as a and a.b)."""
    found = {}
    for path in sorted(CHECKER.rglob("*.py")):
        name = _module(path)
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        names = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join(anchor + ([base] if base else []))
                names.add(base)
                names.update(f"{base}.{alias.name}" for alias in node.names)
        found[name] = frozenset(names)
    return found


def _within(name: str, prefixes) -> bool:
    """``name`` is one of ``prefixes`` or a module inside one of them."""
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def _modules(*prefixes: str) -> list[str]:
    return [m for m in _imports() if _within(m, prefixes)]


def _all_but(*prefixes: str) -> list[str]:
    return [m for m in _imports() if not _within(m, prefixes)]


def _offenders(importers: list[str], imported) -> list[str]:
    """'A imports B' for each module A of ``importers`` and each B it imports in (a package of) ``imported``;
    B is the module, not also the names taken from it."""
    return sorted(f"{mod} imports {target}" for mod in importers for target in _imports()[mod]
                  if _within(target, imported) and not (target.rpartition(".")[0] in _imports()[mod]
                                                        and _within(target.rpartition(".")[0], imported)))


def test_the_modules_are_found():
    assert {"checker.api", "checker.cli", "checker.semantics.step", "checker.ci.plan"} <= set(_imports())


def test_only_the_command_line_imports_the_facade():
    assert _offenders(_all_but("checker.api", *CLI_LAYER), ["checker.api"]) == []


def test_nothing_below_the_command_line_imports_it():
    assert _offenders(_all_but(*CLI_LAYER), CLI_LAYER) == []


def test_the_semantics_imports_no_checker_built_on_it():
    assert _offenders(_modules("checker.semantics"), ["checker.smt", "checker.engine", "checker.verify",
                                                      "checker.liveness", "z3"]) == []


def test_the_inputs_import_no_semantics():
    assert _offenders(_modules(*(f"checker.{m}" for m in INPUTS)), ["checker.semantics"]) == []


def _layer(name: str) -> int | None:
    found = [(len(prefix), i) for i, layer in enumerate(LAYERS) for prefix in layer if _within(name, [prefix])]
    return max(found)[1] if found else None


def test_every_module_has_a_layer():
    assert [m for m in _imports() if m not in PACKAGES and _layer(m) is None] == [], \
        "say in LAYERS (and in docs/design.md, 'Who owns what') which layer the module belongs to"


def test_nothing_imports_upward():
    upward = [f"{mod} imports {target}" for mod in _imports() if _layer(mod) is not None
              for target in _imports()[mod] if target not in PACKAGES and (_layer(target) or 0) > _layer(mod)]
    assert sorted(set(upward)) == []
