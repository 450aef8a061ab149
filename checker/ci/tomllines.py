"""Line numbers for the keys of a TOML document (tomllib parses, but keeps no positions).

``toml_lines(text)`` maps a field path, in the form pydantic reports it (``("verify", 0, "invariants", 2)``),
to the 1-based line that holds it: table headers, ``[[array]]`` tables (counted), ``key = value`` lines
(dotted keys too), and the items of arrays of plain values, one line each where the array spans lines.
It reads only what batchcheck's config needs; anything it cannot place falls back to its parent's line
(checker.loading does that lookup).
"""

from __future__ import annotations

import re
from typing import Any

LineMap = dict[tuple[Any, ...], int]

_BARE_OR_QUOTED = r'(?:[A-Za-z0-9_-]+|"[^"]*"|\'[^\']*\')'
_KEY = re.compile(rf"^\s*({_BARE_OR_QUOTED}(?:\s*\.\s*{_BARE_OR_QUOTED})*)\s*=\s*(.*)$")
_ARRAY_TABLE = re.compile(rf"^\s*\[\[\s*({_BARE_OR_QUOTED}(?:\s*\.\s*{_BARE_OR_QUOTED})*)\s*\]\]")
_TABLE = re.compile(rf"^\s*\[\s*({_BARE_OR_QUOTED}(?:\s*\.\s*{_BARE_OR_QUOTED})*)\s*\]")
_ITEM = re.compile(r'"(?:[^"\\]|\\.)*"|\'[^\']*\'|[^\s,\[\]#]+')


def _keys(dotted: str) -> tuple[str, ...]:
    parts = re.findall(_BARE_OR_QUOTED, dotted)
    return tuple(p[1:-1] if p[:1] in "\"'" else p for p in parts)


def _strip_comment(text: str) -> str:
    """The text before a ``#`` that is not inside a string."""
    quote = ""
    for i, ch in enumerate(text):
        if quote:
            if ch == quote:
                quote = ""
        elif ch in "\"'":
            quote = ch
        elif ch == "#":
            return text[:i]
    return text


def toml_lines(text: str) -> LineMap:
    lines: LineMap = {(): 1}
    counts: dict[tuple[str, ...], int] = {}
    prefix: tuple[Any, ...] = ()
    array: tuple[tuple[Any, ...], int, int] | None = None  # (path, next index, bracket depth) of an open array
    for number, raw in enumerate(text.splitlines(), start=1):
        line = _strip_comment(raw)
        if array is not None:
            path, index, depth = array
            for token in _ITEM.findall(line):
                if depth == 1:
                    lines.setdefault(path + (index,), number)
                    index += 1
            depth += line.count("[") - line.count("]")
            array = (path, index, depth) if depth > 0 else None
            continue
        if match := _ARRAY_TABLE.match(line):
            name = _keys(match.group(1))
            counts[name] = counts.get(name, -1) + 1
            prefix = name + (counts[name],)
            lines.setdefault(name, number)
            lines[prefix] = number
            continue
        if match := _TABLE.match(line):
            prefix = _keys(match.group(1))
            lines[prefix] = number
            continue
        if match := _KEY.match(line):
            path = prefix + _keys(match.group(1))
            lines[path] = number
            value = match.group(2).strip()
            if value.startswith("["):
                depth = value.count("[") - value.count("]")
                if depth > 0:
                    inner = value[1:]
                    index = 0
                    for _ in _ITEM.findall(inner.split("[")[0]):
                        lines[path + (index,)] = number
                        index += 1
                    array = (path, index, depth)
                else:
                    for index, _ in enumerate(_ITEM.findall(value[1:value.rfind("]")])):
                        lines[path + (index,)] = number
    return lines
