"""Which rules of a policy a property depends on, and the lines of the policy YAML that hold them.

A bug report quotes the policy where a reviewer would change it: for ``decode_progress`` the
``phase_mode:`` line, for ``cancellation_releases`` the ``release_lag_steps:`` line (a rule the file
leaves to its default is shown with its default value).
From the policy file when it is present and still the policy the counterexample was found with (same
hash), with its line numbers; otherwise from the spec embedded in the counterexample.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from checker.errors import InputError
from checker.inputfiles import apply_overrides
from checker.loading import parse_yaml, read_text, validate
from checker.policy import Policy
from checker.verify.counterexample import policy_hash

FALLBACK_RULES = ("batch", "queue", "kv", "preemption")  # a property no table names (a user invariant)


def policy_overrides(environment: dict[str, Any]) -> tuple[str, ...]:
    """The ``FIELD.PATH=VALUE`` settings a lasso was found with (``liveness --set``; none for other kinds)."""
    stored = environment.get("policy_overrides") or ()
    return tuple(str(o) for o in stored) if isinstance(stored, list) else ()


def implicated_rules(kind: str, name: str, slo_spec: dict[str, Any] | None = None,
                     overrides: tuple[str, ...] = ()) -> tuple[str, ...]:
    """The policy fields a property judges: the same table ``batchcheck ci`` locates its findings with
    (checker/ci/locations.py), by invariant name, by SLO kind and metric, or by liveness property. Fields
    the counterexample was found with overridden (``--set``) come last."""
    from checker.ci.locations import fields_for

    if kind in ("invariant", "liveness"):
        fields = fields_for("verify" if kind == "invariant" else "liveness", name)
    else:
        spec = slo_spec or {}
        fields = fields_for("fuzz", str(spec.get("kind")), spec.get("metric"))
    fields = fields or FALLBACK_RULES
    return fields + tuple(path for path in (o.partition("=")[0] for o in overrides) if path and path not in fields)


@dataclass(frozen=True)
class Excerpt:
    """Lines to quote: (line number or None, text); where they come from, and why there."""

    lines: list[tuple[int | None, str]]
    source: str  # the policy file, or "the spec embedded in the counterexample"
    note: str  # why this source (file found and unchanged, changed, missing)
    numbered: bool


def _value_at(data: Any, path: tuple[str, ...]) -> Any:
    for part in path:
        data = data.get(part) if isinstance(data, dict) else None
    return data


def _file_excerpt(text: str, lines: dict[tuple[Any, ...], int], rules: tuple[str, ...],
                  spec: dict[str, Any]) -> list[tuple[int | None, str]]:
    source = text.splitlines()
    wanted: set[int] = set()
    missing: list[str] = []
    for rule in rules:
        path = tuple(rule.split("."))
        if path not in lines:
            missing.append(rule)
            continue
        for cut in range(1, len(path) + 1):  # the enclosing section lines, for context
            wanted.add(lines[path[:cut]])
        wanted.update(line for loc, line in lines.items() if loc[:len(path)] == path)  # a whole section
    out: list[tuple[int | None, str]] = [(n, source[n - 1]) for n in sorted(wanted) if n <= len(source)]
    for rule in missing:
        value = _value_at(spec, tuple(rule.split(".")))
        out.append((None, f"# {rule}: {_flow(value)}  (not in the file: the default)"))
    return out


def _flow(value: Any) -> str:
    return yaml.safe_dump(value, default_flow_style=True, width=10_000).strip().removesuffix("...").strip()


def _spec_excerpt(spec: dict[str, Any], rules: tuple[str, ...]) -> list[tuple[int | None, str]]:
    picked: dict[str, Any] = {}
    for rule in rules:
        path = rule.split(".")
        here = picked
        for part in path[:-1]:
            here = here.setdefault(part, {})
        here[path[-1]] = _value_at(spec, tuple(path))
    text = yaml.safe_dump(picked, sort_keys=False, default_flow_style=False, width=100)
    return [(None, line) for line in text.splitlines()]


def _policy_file(recorded: str | None, counterexample: Path) -> Path | None:
    """The recorded policy file: as given (relative to the working directory), else relative to the
    folder above the counterexample's folder (``counterexamples/`` beside ``spec/``)."""
    if not recorded:
        return None
    candidates = [Path(recorded)]
    if not Path(recorded).is_absolute():
        candidates.append(counterexample.resolve().parent.parent / recorded)
    return next((c for c in candidates if c.is_file()), None)


def policy_excerpt(recorded_file: str | None, recorded_sha256: str, spec: dict[str, Any], rules: tuple[str, ...],
                   counterexample: Path, overrides: tuple[str, ...] = ()) -> Excerpt:
    """The implicated rules' lines: from the policy file when it still holds the policy found (numbered;
    with ``overrides``, once they are applied, and the overridden lines marked), else from the embedded
    spec, saying why."""
    path = _policy_file(recorded_file, counterexample)
    embedded = "the spec embedded in the counterexample"
    if path is None:
        note = f"{recorded_file} not found" if recorded_file else "the counterexample names no policy file"
        return Excerpt(_spec_excerpt(spec, rules), embedded, note, False)
    try:
        text = read_text(path)
        data, lines = parse_yaml(text, str(path))
        current = validate(Policy, data, str(path), lambda: lines)
    except InputError:  # what the file holds is not shown: it may be any file (the counterexample names it)
        return Excerpt(_spec_excerpt(spec, rules), embedded, f"{recorded_file} does not load as a policy", False)
    if overrides:
        try:
            current = apply_overrides(current, list(overrides))
        except InputError as exc:
            return Excerpt(_spec_excerpt(spec, rules), embedded,
                           f"the overrides it was found with do not apply to {recorded_file} ({exc})", False)
    if policy_hash(current) != recorded_sha256:
        return Excerpt(_spec_excerpt(spec, rules), embedded,
                       f"{recorded_file} has changed since the counterexample was found (its policy hash differs)",
                       False)
    if not overrides:
        return Excerpt(_file_excerpt(text, lines, rules, spec), recorded_file or str(path),
                       "it holds the policy the counterexample was found with: same hash", True)
    shown = ", ".join(overrides)
    return Excerpt(_mark_overrides(_file_excerpt(text, lines, rules, spec), lines, overrides),
                   recorded_file or str(path),
                   f"it holds the policy the counterexample was found with once `{shown}` is applied: same hash", True)


def _mark_overrides(excerpt: list[tuple[int | None, str]], lines: dict[tuple[Any, ...], int],
                    overrides: tuple[str, ...]) -> list[tuple[int | None, str]]:
    """The excerpt with each overridden rule's line marked ``# overridden: PATH=VALUE``; an overridden
    rule the file leaves to its default is listed as overridden instead of with its default."""
    paths = {o: o.partition("=")[0] for o in overrides}
    at = {lines[key]: o for o, key in ((o, tuple(p.split("."))) for o, p in paths.items()) if key in lines}
    defaulted = [o for o in overrides if o not in at.values()]
    out = [(n, f"{text}  # overridden: {at[n]}" if n in at else text) for n, text in excerpt
           if n is not None or not any(text.startswith(f"# {paths[o]}: ") for o in defaulted)]
    return out + [(None, f"# {o}  (overridden; the file leaves it to its default)") for o in defaulted]
