"""The shipped examples by name: ``vllm_v1`` for the policy spec/policies/vllm_v1.yaml, ``chat_mixed`` for the
workload spec/workloads/chat_mixed.yaml, and so on, wherever batchcheck runs.

The examples are spec/ in a checkout and the package ``batchcheck_examples`` in an installed wheel (the same
folder: pyproject.toml maps one onto the other). A path that exists, that has a suffix, or that starts at a
folder of its own (``./x``, ``/x``, ``~/x``) is always the user's file; only a bare name (``vllm_v1``,
``prefix_caching/vllm_v1``) that is no file here is looked up among the examples of the kind the argument asks
for.
"""

from __future__ import annotations

import difflib
from pathlib import Path

from checker.errors import InputError, Problem

# kind -> (folder under the examples, the suffix a name leaves out)
KINDS: dict[str, tuple[str, str]] = {
    "policy": ("policies", ".yaml"),
    "workload": ("workloads", ".yaml"),
    "profile": ("profiles", ".json"),
    "slo": ("slo", ".slo.yaml"),
    "audit": ("audit", ".yaml"),
    "fleet": ("fleets", ".yaml"),
}


def examples_root() -> Path | None:
    """The folder of the shipped examples, or None where batchcheck was installed without them."""
    try:
        from importlib.resources import files

        root = Path(str(files("batchcheck_examples")))
    except (ImportError, TypeError):
        return None
    return root if (root / "policies").is_dir() else None


def is_bare_name(text: str) -> bool:
    """A name the examples could hold: no suffix, not a path that starts at a folder of its own."""
    return bool(text) and not Path(text).suffix and not text.startswith((".", "/", "~"))


def missing_example(text: str, kind: str) -> InputError:
    """The error for a bare name that is neither a file here nor a shipped example of that kind."""
    known = names(kind)
    close = difflib.get_close_matches(text, known, n=1)
    hint = f"; did you mean {close[0]}?" if close else ""
    return InputError(Problem("", text, f"an existing file, or the name of a shipped {kind} example ("
                              f"{', '.join(known) or 'none installed'}){hint}"), text)


def resolve(path: str | Path, kind: str) -> Path:
    """The file ``path`` names: itself where it exists or is not a bare name; else the shipped example of
    that name and kind when there is one; else ``path`` (whose loader then says that it does not exist)."""
    p = Path(path)
    text = str(path)
    if p.exists() or not is_bare_name(text):
        return p
    root = examples_root()
    if root is None:
        return p
    folder, suffix = KINDS[kind]
    candidate = root / folder / (text + suffix)
    return candidate if candidate.is_file() else p


def names(kind: str) -> list[str]:
    """The shipped examples of a kind, by the names ``resolve`` takes."""
    root = examples_root()
    if root is None:
        return []
    folder, suffix = KINDS[kind]
    base = root / folder
    return sorted(str(f.relative_to(base))[:-len(suffix)] for f in base.rglob("*" + suffix)
                  if not (suffix == ".yaml" and f.name.endswith(".slo.yaml")))
