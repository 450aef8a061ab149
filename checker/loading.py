"""Reading YAML/JSON input files into pydantic models, with errors that name file, line and field.

Every input file goes through :func:`load_model`: malformed YAML, duplicate keys, unknown keys,
wrong types and cross-field inconsistencies all become one :class:`~checker.errors.InputError`.
"""

from __future__ import annotations

import difflib

import json
from pathlib import Path
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from checker.errors import InputError, Problem

M = TypeVar("M", bound=BaseModel)
LineMap = dict[tuple[Any, ...], int]

# ----------------------------------------------------------------------------------------- input limits
# Declared limits of every file batchcheck reads (docs/cli.md, "Input limits"), checked before the work
# that they bound starts: a file over one is an input error naming the file and the limit, never a
# RecursionError, a MemoryError or a hang. The TOML and pbtxt readers use the same numbers.
MAX_FILE_BYTES = 256 * 1024 * 1024
"""Any input file (traces and logs included)."""
MAX_YAML_BYTES = 1024 * 1024
"""A YAML document (policies, workloads, SLO files, audit records, importer configs), a TOML config and a
Triton config.pbtxt: hand-written files, parsed by pure-Python parsers."""
MAX_DEPTH = 64
"""Nesting of lists and mappings (messages in pbtxt) in any document or JSON line."""
MAX_NODES = 1_000_000
"""Values (scalars, lists, mappings) in a YAML document, counted with every alias expanded."""


def _too_deep(line: int | None = None) -> Problem:
    return Problem("", "<too deeply nested>", f"nesting at most {MAX_DEPTH} levels deep (lists and mappings)", line)


def check_size(text: str, source: str, what: str, limit: int | None = None) -> None:
    """An input error when ``text`` is longer than ``limit`` bytes (default: MAX_YAML_BYTES)."""
    limit = MAX_YAML_BYTES if limit is None else limit
    if len(text) > limit:  # characters; a byte count is at least this
        raise InputError(Problem("(file)", f"{len(text.encode('utf-8')):,} bytes", f"{what} of at most {limit:,} "
                                 "bytes (docs/cli.md, Input limits)"), source)


def check_depth(data: Any, source: str, line: int | None = None) -> None:
    """An input error when parsed data (lists, dicts, tuples) nests deeper than MAX_DEPTH; iterative,
    so any depth is measured without recursion."""
    stack = [(data, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict):
            children = value.values()
        elif isinstance(value, (list, tuple)):
            children = value
        else:
            continue
        if depth > MAX_DEPTH:
            raise InputError(_too_deep(line), source)
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list, tuple)))


def parse_json(text: str, source: str, line: int | None = None) -> Any:
    """json.loads within the limits: a document nested too deeply for the parser or deeper than MAX_DEPTH
    is an input error (JSONDecodeError is the caller's)."""
    try:
        data = json.loads(text)
    except RecursionError:
        raise InputError(_too_deep(line), source) from None
    check_depth(data, source, line)
    return data


class _Limit(Exception):
    def __init__(self, problem: Problem):
        self.problem = problem


class _LimitedLoader(yaml.SafeLoader):
    """PyYAML's safe loader that stops composing past MAX_DEPTH (its composer recurses per level)."""

    def __init__(self, stream: str):
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        if not self.check_event(yaml.SequenceStartEvent, yaml.MappingStartEvent):
            return super().compose_node(parent, index)
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise _Limit(_too_deep(self.peek_event().start_mark.line + 1))
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def _check_expansion(root: yaml.Node) -> None:
    """With every alias expanded: at most MAX_NODES values and MAX_DEPTH levels, no alias inside
    itself. Each node is sized once (memoized), so an alias bomb costs its written size."""
    sized: dict[int, tuple[int, int]] = {}
    open_: set[int] = set()

    def size(node: yaml.Node) -> tuple[int, int]:
        key = id(node)
        if key in sized:
            return sized[key]
        if key in open_:
            raise _Limit(Problem("", "<recursive alias>", "an alias that does not contain itself",
                                 node.start_mark.line + 1))
        open_.add(key)
        if isinstance(node, yaml.MappingNode):
            children = [part for pair in node.value for part in pair]
        elif isinstance(node, yaml.SequenceNode):
            children = node.value
        else:
            children = []
        count, depth = 1, 0 if isinstance(node, yaml.ScalarNode) else 1
        for child in children:
            n, d = size(child)
            count, depth = count + n, max(depth, d + 1)
            if count > MAX_NODES:
                raise _Limit(Problem("", "<too many values>", f"at most {MAX_NODES:,} values with every alias "
                                     "expanded", node.start_mark.line + 1))
            if depth > MAX_DEPTH:
                raise _Limit(_too_deep(node.start_mark.line + 1))
        open_.discard(key)
        sized[key] = (count, depth)
        return count, depth

    size(root)


def format_path(loc: tuple[Any, ...]) -> str:
    """("classes", 0, "arrival") -> "classes[0].arrival"."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out


def _line_map(node: yaml.Node, prefix: tuple[Any, ...] = (), lines: LineMap | None = None) -> LineMap:
    lines = {} if lines is None else lines
    lines.setdefault(prefix, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        seen: dict[Any, int] = {}
        for key_node, value_node in node.value:
            key = key_node.value
            line = key_node.start_mark.line + 1
            if key in seen:
                raise _DuplicateKey(prefix + (key,), line, seen[key])
            seen[key] = line
            lines[prefix + (key,)] = line
            _line_map(value_node, prefix + (key,), lines)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            lines[prefix + (index,)] = item.start_mark.line + 1
            _line_map(item, prefix + (index,), lines)
    return lines


class _DuplicateKey(Exception):
    def __init__(self, loc: tuple[Any, ...], line: int, first_line: int):
        self.loc, self.line, self.first_line = loc, line, first_line


def _compose(text: str) -> tuple[yaml.Node | None, _LimitedLoader]:
    """The document's node graph within the limits (depth, values with aliases expanded); YAMLError and
    _Limit are the caller's."""
    loader = _LimitedLoader(text)
    try:
        node = loader.get_single_node()
    finally:
        loader.dispose()
    if node is not None:
        _check_expansion(node)
    return node, loader


def parse_yaml(text: str, source: str) -> tuple[Any, LineMap]:
    """Parse YAML text within the input limits; return the data and a map from field path to 1-based line."""
    check_size(text, source, "a YAML document")
    try:
        node, loader = _compose(text)
        data = loader.construct_document(node) if node is not None else None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        problem = getattr(exc, "problem", None) or str(exc)
        raise InputError(Problem("", "<unparsable>", f"valid YAML: {problem}", line), source) from None
    except _Limit as limit:
        raise InputError(limit.problem, source) from None
    if node is None:
        return data, {}
    try:
        return data, _line_map(node)
    except _DuplicateKey as dup:
        raise InputError(
            Problem(format_path(dup.loc), "<duplicate key>",
                    f"each key once (first given on line {dup.first_line})", dup.line),
            source,
        ) from None


def read_text(path: str | Path) -> str:
    """A file's text; over MAX_FILE_BYTES, missing, a directory or not UTF-8 is an input error."""
    p = Path(path)
    try:
        if p.is_file() and p.stat().st_size > MAX_FILE_BYTES:
            raise InputError(Problem("(file)", f"{p.stat().st_size:,} bytes", f"a file of at most "
                                     f"{MAX_FILE_BYTES:,} bytes (docs/cli.md, Input limits)"), str(p))
        return p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(Problem("", str(p), "an existing file"), str(p)) from None
    except IsADirectoryError:
        raise InputError(Problem("", str(p), "a file, not a directory"), str(p)) from None
    except UnicodeDecodeError as exc:
        raise InputError(Problem("", f"byte {exc.start}", "UTF-8 text"), str(p)) from None
    except OSError as exc:
        raise InputError(Problem("", str(p), f"a readable file ({exc.strerror})"), str(p)) from None


def json_lines(path: str | Path) -> Iterator[tuple[int, str, Any]]:
    """(line number, text, parsed value) for each non-blank line of a JSON-lines file; a line that is not
    JSON is an input error at its line."""
    for line_no, line in enumerate(read_text(path).splitlines(), start=1):
        if not line.strip():
            continue
        try:
            yield line_no, line, parse_json(line, str(path), line_no)
        except json.JSONDecodeError as exc:
            raise InputError(Problem(f"line {line_no}", line[:40], f"a JSON object ({exc.msg})", line_no),
                             str(path)) from None


def load_document(path: str | Path) -> tuple[Any, Callable[[], LineMap]]:
    """Read a YAML or JSON file into plain data, plus a function giving the line map (computed
    only when an error needs it: large JSON traces parse fast with json, slowly with yaml)."""
    text = read_text(path)
    if str(path).endswith(".json"):
        try:
            data = parse_json(text, str(path))
        except json.JSONDecodeError as exc:
            raise InputError(Problem("", "<unparsable>", f"valid JSON: {exc.msg}", exc.lineno), str(path)) from None
        return data, lambda: _safe_line_map(text)
    data, lines = parse_yaml(text, str(path))
    return data, lambda: lines


def _safe_line_map(text: str) -> LineMap:
    """Lines of a JSON document read as YAML (within the limits: past them, no lines)."""
    if len(text) > MAX_YAML_BYTES:
        return {}
    try:
        node, _ = _compose(text)
        return _line_map(node) if node is not None else {}
    except (yaml.YAMLError, _DuplicateKey, _Limit):
        return {}


def validate(model: type[M], data: Any, source: str, lines: Callable[[], LineMap] | None = None) -> M:
    """Validate plain data against a pydantic model; raise InputError naming every problem."""
    if data is None:
        raise InputError(Problem("", "<empty>", f"a mapping with the fields of a {model.__name__}"), source)
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        line_map = lines() if lines else {}
        raise InputError([_problem(err, line_map, model, data) for err in exc.errors()], source) from None


def load_model(model: type[M], path: str | Path) -> M:
    data, lines = load_document(path)
    return validate(model, data, str(path), lines)


def _line_for(loc: tuple[Any, ...], lines: LineMap) -> int | None:
    for cut in range(len(loc), -1, -1):
        if loc[:cut] in lines:
            return lines[loc[:cut]]
    return None


def _problem(err: dict[str, Any], lines: LineMap, model: type[BaseModel], data: Any) -> Problem:
    kind = err["type"]
    ctx = err.get("ctx") or {}
    loc = _data_loc(err["loc"], data)
    if kind == "consistency":  # our cross-field checks carry their own path, value and expectation
        path = tuple(ctx["field"].split("."))
        full = loc + path
        return Problem(format_path(full), ctx["value"], ctx["expected"], _line_for(full, lines))
    value = err.get("input")
    expected = _expected(kind, ctx, err)
    if kind == "missing":
        value = "<missing>"
    if kind in ("union_tag_invalid", "union_tag_not_found"):
        field = str(ctx.get("discriminator", "")).strip("'")
        loc = loc + (field,)
        value = ctx.get("tag", "<missing>")
        expected = "one of: " + str(ctx.get("expected_tags", "")).replace("'", "")
    if kind == "extra_forbidden":
        allowed = _allowed_keys(model, loc[:-1], data)
        if allowed:
            close = difflib.get_close_matches(str(loc[-1]), allowed, n=1, cutoff=0.75) if loc else []
            hint = f"did you mean {close[0]}? " if close else ""
            expected = f"a known key; {hint}allowed here: " + ", ".join(allowed)
    return Problem(format_path(loc), value, expected, _line_for(loc, lines))


def _allowed_keys(model: type[BaseModel], loc: tuple[Any, ...], data: Any) -> list[str]:
    """Field names of the (nested) model found by following loc through fields and lists."""
    current: Any = model
    here = data
    for part in loc:
        here = _child(here, part)
        if isinstance(part, int):
            continue
        fields = getattr(current, "model_fields", None)
        if not fields or part not in fields:
            return []
        current = _model_in(fields[part].annotation, here)
        if current is None:
            return []
    fields = getattr(current, "model_fields", None)
    return sorted(fields) if fields else []


def _child(data: Any, part: Any) -> Any:
    if isinstance(data, dict):
        return data.get(part)
    if isinstance(data, list) and isinstance(part, int) and 0 <= part < len(data):
        return data[part]
    return None


def _models(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    found: list[type[BaseModel]] = []
    for arg in getattr(annotation, "__args__", ()) or ():
        found.extend(_models(arg))
    return found


def _model_in(annotation: Any, data: Any) -> Any:
    """The model a field holds; for a union of models, the member whose tag the data names."""
    candidates = _models(annotation)
    if len(candidates) > 1 and isinstance(data, dict):
        for candidate in candidates:
            for name, info in candidate.model_fields.items():
                if getattr(info.annotation, "__args__", None) and data.get(name) in info.annotation.__args__:
                    return candidate
    return candidates[0] if candidates else None


def _data_loc(loc: tuple[Any, ...], data: Any) -> tuple[Any, ...]:
    """Drop the parts pydantic adds to loc that are not in the data: the tag of a discriminated
    union member (e.g. 'poisson') and validator wrappers (e.g. 'function-after[...]')."""
    out: list[Any] = []
    current = data
    for part in loc:
        if isinstance(current, dict):
            if part in current:
                out.append(part)
                current = current[part]
            elif not (isinstance(part, str) and (part in current.values() or "[" in part)):
                out.append(part)  # a missing or unknown key: keep it, stop walking
                current = None
        elif isinstance(current, list) and isinstance(part, int) and 0 <= part < len(current):
            out.append(part)
            current = current[part]
        elif not (isinstance(part, str) and "[" in part):
            out.append(part)
            current = None
    return tuple(out)


_SIMPLE = {
    "int_type": "an integer",
    "int_parsing": "an integer",
    "int_from_float": "a whole number",
    "float_type": "a number",
    "float_parsing": "a number",
    "bool_type": "true or false",
    "bool_parsing": "true or false",
    "string_type": "a string",
    "dict_type": "a mapping",
    "model_type": "a mapping",
    "list_type": "a list",
    "missing": "this field to be given",
    "finite_number": "a finite number",
}


def _expected(kind: str, ctx: dict[str, Any], err: dict[str, Any]) -> str:
    if kind in _SIMPLE:
        return _SIMPLE[kind]
    for key, sign in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<")):
        if key in ctx and kind.endswith(("_equal", "than")):
            bound = ctx[key]
            if isinstance(bound, float) and bound.is_integer():
                bound = int(bound)
            return f"a number {sign} {bound}"
    if kind in ("literal_error", "enum"):
        return f"one of: {ctx.get('expected', '')}".replace("'", "")
    if kind == "extra_forbidden":
        return "no such key here: check the spelling against `batchcheck schema`"
    if kind in ("too_short", "too_long"):
        return err["msg"].replace("List should have", "a list with").replace("Value should have", "a value with")
    if kind == "string_too_short":
        return f"a string of at least {ctx.get('min_length')} characters"
    return err["msg"]
