"""Writing an imported policy: YAML that keeps its comments (where each value came from, what was
assumed), and an atomic write (temporary file in the target's directory, then ``os.replace``)."""

from __future__ import annotations

import shlex
import textwrap
from typing import Any

from pydantic import BaseModel

from checker.errors import InternalError
from checker.fileio import write_atomic  # noqa: F401  (re-exported)
from checker.importers.common import Draft, scalar
from checker.policy import Policy

COMMENT_COLUMN = 34


def _sections() -> list[tuple[str, list[str] | None]]:
    """Policy fields in schema order; for a section, its fields in schema order."""
    out: list[tuple[str, list[str] | None]] = []
    for name, info in Policy.model_fields.items():
        annotation = info.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            out.append((name, list(annotation.model_fields)))
        else:
            out.append((name, None))
    return out


def _line(indent: str, key: str, value: Any, comment: str | None) -> str:
    text = f"{indent}{key}: {scalar(value)}"
    if comment:
        text = text.ljust(COMMENT_COLUMN) + f"  # {comment}"
    return text


def _wrap(prefix: str, text: str) -> list[str]:
    return textwrap.wrap(text, width=100, initial_indent=prefix, subsequent_indent="#   ",
                         break_on_hyphens=False, break_long_words=False) or [prefix.rstrip()]


def render(draft: Draft, args: list[str], config: str | None, name: str | None) -> str:
    """The policy file: a header naming the source and every assumption, then the fields."""
    lines = [f"# Imported by `batchcheck import {draft.system}`: {draft.title}."]
    if args:
        lines += _wrap("# Arguments: ", shlex.join(args))
    if config:
        lines.append(f"# Config file: {config}")
    lines.append("# Field reference: docs/spec-reference.md; the mapping and what it assumes: docs/importers.md.")
    notes = ([f"assumed: {a}" for a in draft.assumed] + [f"approximated: {a}" for a in draft.approximated]
             + [f"ignored: {a}" for a in draft.ignored])
    if notes:
        lines.append("#")
        for note in notes:
            lines += _wrap("# ", note)
    if name is not None:
        lines.append(f"name: {scalar(name)}")
    used: set[str] = set()
    for section, fields in _sections():
        if fields is None:
            if section in draft.fields:
                value, comment = draft.fields[section]
                lines.append(_line("", section, value, comment))
                used.add(section)
            continue
        nested = {f: [k for k in draft.fields if k.startswith(f"{section}.{f}.")] for f in fields}
        present = [f for f in fields if f"{section}.{f}" in draft.fields or nested[f]]
        if not present:
            continue
        lines.append(f"{section}:")
        for f in present:
            if nested[f]:  # a sub-section (kv.prefix_caching), its fields in the order they were set
                lines.append(f"  {f}:")
                for key in nested[f]:
                    value, comment = draft.fields[key]
                    lines.append(_line("    ", key.rsplit(".", 1)[1], value, comment))
                    used.add(key)
                continue
            value, comment = draft.fields[f"{section}.{f}"]
            lines.append(_line("  ", f, value, comment))
            used.add(f"{section}.{f}")
    unknown = set(draft.fields) - used
    if unknown:
        raise InternalError(f"importer set fields the policy does not have: {sorted(unknown)}")
    return "\n".join(lines) + "\n"


