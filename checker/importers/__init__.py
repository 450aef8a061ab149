"""Importers: a real server's scheduler configuration -> a batchcheck policy (docs/importers.md).

One module per system (vllm, sglang, tgi, trtllm, triton) turns that system's options into a
:class:`~checker.importers.common.Draft`; :func:`import_policy` validates it as a Policy and renders the
YAML with its provenance comments. Every value filled from a default is reported as assumed; options the
policy model cannot express are refused with exit 2 (InputError/UsageError), never dropped.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from checker.errors import NumberRange, UsageError
from checker.importers.common import Draft, Machine
from checker.policy import Policy

SYSTEMS = ("vllm", "sglang", "tgi", "trtllm", "triton")
# Which batchcheck-side options each system reads.
USES_CONFIG = {"vllm", "trtllm", "triton"}
USES_MACHINE = {"vllm", "sglang", "trtllm"}


@dataclass(frozen=True)
class ImportResult:
    """An imported policy: the validated model, its YAML text, and the report of how it was built."""

    system: str
    policy: Policy
    data: dict[str, Any]
    text: str
    assumed: list[str]
    approximated: list[str]
    ignored: list[str]

    def notes(self) -> list[str]:
        """One line each, as printed on stderr: ``assumed: field=value (why)`` and the like."""
        return ([f"assumed: {a}" for a in self.assumed] + [f"approximated: {a}" for a in self.approximated]
                + [f"ignored: {a}" for a in self.ignored])


RULES = ("vllm", "sglang")  # --rules: whose rules an SGLang import maps onto (the engine's scheduler field)


def _draft(system: str, args: list[str], config: str | None, machine: Machine, vllm_version: str | None,
           usage_context: str | None, rules: str | None = None) -> Draft:
    if system not in SYSTEMS:
        raise UsageError(f"unknown system {system!r} (expected one of: {', '.join(SYSTEMS)})")
    if config is not None and system not in USES_CONFIG:
        raise UsageError(f"--config is not read by the {system} importer (expected it only for "
                         f"{', '.join(sorted(USES_CONFIG))}): pass {system}'s own arguments")
    if machine.given() and system not in USES_MACHINE:
        raise UsageError(f"{machine.given()[0]} is not read by the {system} importer (expected it only for "
                         f"{', '.join(sorted(USES_MACHINE))}): see docs/importers.md for how {system}'s KV pool "
                         "is given")
    if (vllm_version is not None or usage_context is not None) and system != "vllm":
        flag = "--vllm-version" if vllm_version is not None else "--usage-context"
        raise UsageError(f"{flag} is read by the vllm importer only (system is {system})")
    if rules is not None and system != "sglang":
        raise UsageError(f"--rules is read by the sglang importer only (system is {system})")
    if rules is not None and rules not in RULES:
        from checker.errors import InputError, Problem

        raise InputError(Problem("--rules", rules, "vllm (SGLang mapped onto the vLLM-shaped rules, the default) "
                                 "or sglang (the engine's SGLang rules, scheduler: sglang)"))
    machine.check()
    if system == "vllm":
        from checker.importers.vllm import import_vllm

        return import_vllm(args, config, machine, vllm_version, usage_context)
    if system == "sglang":
        from checker.importers.sglang import import_sglang

        return import_sglang(args, machine, rules or "vllm")
    if system == "tgi":
        from checker.importers.tgi import import_tgi

        return import_tgi(args)
    if system == "trtllm":
        from checker.importers.trtllm import import_trtllm

        return import_trtllm(args, config, machine)
    from checker.importers.triton import import_triton

    return import_triton(args, config)


def import_policy(system: str, args: list[str] | tuple[str, ...] = (), config: str | Path | None = None, *,
                  name: str | None = None, machine: Machine | None = None, vllm_version: str | None = None,
                  usage_context: str | None = None, rules: str | None = None,
                  ignore_unknown: bool = False) -> ImportResult:
    """Import a server configuration; raise InputError/UsageError (exit 2) for what cannot be imported:
    every unknown and every refused option of the run at once (refusals.py), not only the first.
    ``rules`` (sglang only): vllm (default) maps SGLang onto the vLLM-shaped rules, sglang onto the engine's
    SGLang rules (``scheduler: sglang``). ``ignore_unknown``: an option the importer does not know is
    left out and listed as ignored instead of refused (a known option that can change scheduling is
    still refused)."""
    from checker.errors import BatchcheckError, InputError, InternalError
    from checker.importers.output import render
    from checker.importers.refusals import finish, gathering
    from checker.loading import validate

    args = [str(a) for a in args if a != "--"]
    config_text = None if config is None else str(config)
    with gathering(ignore_unknown) as refusals:
        try:
            draft = _draft(system, args, config_text, machine or Machine(), vllm_version, usage_context, rules)
        except InternalError:
            raise
        except BatchcheckError as exc:
            finish(refusals, exc)
            raise
        finish(refusals)
    draft.ignored[:0] = refusals.ignored
    data = draft.data()
    if name is not None:
        data = {"name": name, **data}
    try:
        policy = validate(Policy, data, f"batchcheck import {system}")
    except InputError as exc:  # a combination the importer did not check first: say where it came from
        files = [config_text] if config_text else [a for a in args if Path(a).suffix in (".yaml", ".yml", ".pbtxt")]
        raise InputError(exc.problems, f"the policy imported from {system}"
                         + (f" ({', '.join(files)})" if files else "")) from None
    text = render(draft, args, config_text, name)
    return ImportResult(system, policy, data, text, list(draft.assumed), list(draft.approximated),
                        list(draft.ignored))


# batchcheck's own options of `batchcheck import`: flag -> (keyword of run_import, str or the numbers allowed);
# checker/cli.py declares the same numeric flags with these ranges (before SYSTEM)
GIB = NumberRange(float, 0, 1e6, low_open=True, unit="GiB")
OVERHEAD_GIB = NumberRange(float, 0, 1e6, unit="GiB")
KV_BYTES = NumberRange(int, 1, 10**12, unit="bytes")
OWN_OPTIONS: dict[str, tuple[str, type | NumberRange]] = {
    "--out": ("out", str), "--name": ("name", str), "--config": ("config", str),
    "--vllm-version": ("vllm_version", str), "--usage-context": ("usage_context", str), "--rules": ("rules", str),
    "--gpu-memory-gib": ("gpu_memory_gib", GIB), "--model-weights-gib": ("model_weights_gib", GIB),
    "--kv-bytes-per-token": ("kv_bytes_per_token", KV_BYTES), "--overhead-gib": ("overhead_gib", OVERHEAD_GIB),
    "--profile": ("profile", str),
}
OWN_SWITCHES = {"--ignore-unknown": "ignore_unknown"}  # batchcheck's own on/off import options (no value)


def split_options(tokens: list[str]) -> tuple[dict[str, Any], list[str]]:
    """Take batchcheck's own import options (OWN_OPTIONS, as ``--flag VALUE`` or ``--flag=VALUE``, and
    OWN_SWITCHES) out of
    the arguments that follow SYSTEM, wherever they are; the rest (without ``--``) belongs to SYSTEM. No
    supported system has an option of these names, except vLLM's ``--config``, which means the same."""
    from checker.errors import InputError, Problem

    own: dict[str, Any] = {}
    rest: list[str] = []
    i = 0
    while i < len(tokens):
        token = tokens[i]
        i += 1
        flag, eq, inline = token.partition("=")
        if token in OWN_SWITCHES:
            own[OWN_SWITCHES[token]] = True
            continue
        if flag not in OWN_OPTIONS:
            if token != "--":
                rest.append(token)
            continue
        if eq:
            raw = inline
        elif i < len(tokens):
            raw = tokens[i]
            i += 1
        else:
            raise InputError(Problem(flag, "<missing>", f"a value after {flag}"))
        key, kind = OWN_OPTIONS[flag]
        if key in own:
            raise UsageError(f"{flag} given twice")
        value = kind.read(raw) if isinstance(kind, NumberRange) else kind(raw)
        if value is None:
            raise InputError(Problem(flag, raw, kind.expected))
        own[key] = value
    return own, rest
