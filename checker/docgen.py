"""Render the input-file reference (docs/spec-reference.md) from the pydantic models.

The reference is generated so that it cannot drift from the schema; tests/unit/test_docs.py checks
that the committed file is current. Regenerate with ``python -m checker.docgen > docs/spec-reference.md``.
"""

from __future__ import annotations

import enum
import inspect
import types
import typing
from typing import Any

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from checker.policy import Policy
from checker.profile import Profile
from checker.traces import Trace
from checker.workload import Workload

INTRO = """# Input file reference

Generated from the schema by `python -m checker.docgen` (do not edit by hand). `batchcheck schema
--kind policy|workload|trace|profile` prints the same as JSON Schema. Every mapping rejects unknown
keys. The semantics of the policy fields, phase by phase, are in [semantics.md](semantics.md).
"""


def _type_name(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        return _type_name(args[0])
    if origin in (typing.Union, types.UnionType):
        names = [_type_name(a) for a in args if a is not type(None)]
        tagged = all(inspect.isclass(a) and issubclass(a, BaseModel) for a in args if a is not type(None))
        text = " or ".join(names) if not tagged or len(names) < 2 else "one of " + ", ".join(names)
        return text + (" or null" if type(None) in args else "")
    if origin in (list, typing.List):
        return f"list of {_type_name(args[0])}"
    if origin in (dict, typing.Dict):
        return f"mapping of {_type_name(args[1])}"
    if origin is typing.Literal:
        return " or ".join(repr(a) for a in args)
    if inspect.isclass(annotation) and issubclass(annotation, enum.Enum):
        return " \\| ".join(f"`{m.value}`" for m in annotation)
    if inspect.isclass(annotation) and issubclass(annotation, BaseModel):
        return f"[{annotation.__name__}](#{annotation.__name__.lower()})"
    return getattr(annotation, "__name__", str(annotation))


def _bounds(info: Any) -> str:
    parts = []
    for m in info.metadata:
        for attr, sign in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<"), ("min_length", "min length")):
            if getattr(m, attr, None) is not None:
                parts.append(f"{sign} {getattr(m, attr)}")
    return ", ".join(parts)


def _default(info: Any) -> str:
    if info.is_required():
        return "**required**"
    if info.default_factory is not None:
        value = info.default_factory()
        if isinstance(value, BaseModel):
            return "(section defaults)"
        return f"`{[getattr(v, 'value', v) for v in value]}`" if isinstance(value, list) else f"`{value}`"
    value = info.default
    if value is PydanticUndefined:
        return ""
    return f"`{getattr(value, 'value', value)}`" if value is not None else "`null`"


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    if inspect.isclass(annotation) and issubclass(annotation, BaseModel):
        return [annotation]
    found: list[type[BaseModel]] = []
    for arg in typing.get_args(annotation):
        found.extend(_models_in(arg))
    return found


def _enums_in(annotation: Any) -> list[type[enum.Enum]]:
    if inspect.isclass(annotation) and issubclass(annotation, enum.Enum):
        return [annotation]
    found: list[type[enum.Enum]] = []
    for arg in typing.get_args(annotation):
        found.extend(_enums_in(arg))
    return found


def render_model(model: type[BaseModel], seen: set[type], out: list[str]) -> None:
    if model in seen:
        return
    seen.add(model)
    out.append(f"### {model.__name__}\n")
    doc = inspect.getdoc(model)
    if doc and not doc.startswith(("Usage docs", "!!! abstract")):
        out.append(" ".join(doc.split()) + "\n")
    out.append("| field | type | default | bounds | meaning |")
    out.append("|---|---|---|---|---|")
    nested: list[type[BaseModel]] = []
    for name, info in model.model_fields.items():
        key = info.alias or name
        meaning = " ".join((info.description or "").split()).replace("|", "\\|")
        for e in _enums_in(info.annotation):
            edoc = inspect.getdoc(e)
            if edoc:
                meaning += (" " if meaning else "") + " ".join(edoc.split())
        out.append(f"| `{key}` | {_type_name(info.annotation)} | {_default(info)} | {_bounds(info)} | {meaning} |")
        nested.extend(_models_in(info.annotation))
    out.append("")
    for sub in nested:
        render_model(sub, seen, out)


def render() -> str:
    out = [INTRO]
    for title, model in (("Policy (`spec/policies/*.yaml`)", Policy), ("Workload (`spec/workloads/*.yaml`)", Workload),
                         ("Trace (`batchcheck-trace` JSON)", Trace), ("Profile (`spec/profiles/*.json`)", Profile)):
        out.append(f"## {title}\n")
        render_model(model, set(), out)
    out.append(AZURE)
    return "\n".join(out).rstrip() + "\n"


AZURE = """## Azure LLM inference CSV

`--trace FILE.csv` reads the Azure public trace in its original header
`TIMESTAMP,ContextTokens,GeneratedTokens` (ISO date-times) or the rebased header
`arrived_at,num_prefill_tokens,num_decode_tokens` (seconds from the first request, as in
`../shared/data/traces/azure_conv_2023.csv`). Rows must be sorted by time; every request gets
`max_output_tokens = output_tokens`, priority 0, one tenant and one class. A bad row is reported with its
line number, column and value.
"""


if __name__ == "__main__":
    print(render(), end="")
