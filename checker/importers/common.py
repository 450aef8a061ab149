"""What every importer shares: option tables and their parsing, the draft policy with the provenance
of each value (given, assumed, approximated, ignored), and KV pool sizing from a declared machine.

An importer reads a real server's options into :class:`Given`, takes every one of them exactly once
(mapped to a policy field, reported as ignored or approximated, or refused with exit 2), and fills a
:class:`Draft`. Values it fills from the system's defaults are recorded as *assumed*.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from checker.errors import InputError, InternalError, Problem, UsageError
from checker.importers.refusals import refuse_later, unknown_option

GIB = 1 << 30


# ----------------------------------------------------------------------------------------- options
@dataclass(frozen=True)
class Opt:
    """One option of a real system: its canonical name (as the system's docs spell it), its kind and
    spellings. Kinds: int, float, str, bool, tokens (an int that may end in k/K/m/M, as vLLM's
    --max-model-len), choice (one of ``choices``, compared case-insensitively when ``fold_case``)."""

    name: str
    kind: str = "int"
    choices: tuple[str, ...] = ()
    aliases: tuple[str, ...] = ()
    minimum: float | None = None
    fold_case: bool = False
    tags: frozenset[str] = frozenset()  # importer-specific marks (e.g. the vLLM eras that have it)
    refused: str = ""  # why the policy model cannot take it (it can change scheduling): refused by name when given


@dataclass(frozen=True)
class Arg:
    """One option as given: canonical name, converted value, and where it was written."""

    name: str
    value: Any
    shown: str  # the name as written: "--max-num-seqs" on a command line, "max_num_seqs" in a file
    source: str | None = None  # the file it came from; None for the command line
    line: int | None = None

    def error(self, expected: str, value: Any = ...) -> InputError:
        return InputError(Problem(self.shown, self.value if value is ... else value, expected, self.line), self.source)

    def note(self) -> str:
        return f"{self.shown}={display(self.value)}"


class Given:
    """The options given to an importer. Each must be taken exactly once (``take``); ``check_all_taken``
    turns a forgotten one into an internal error, so that no option is ever dropped silently."""

    def __init__(self, args: dict[str, Arg] | None = None):
        self.args: dict[str, Arg] = dict(args or {})
        self.taken: set[str] = set()

    def update(self, other: Given) -> None:
        """Later options override earlier ones (a command line over a config file, as the servers do)."""
        self.args.update(other.args)

    def take(self, name: str) -> Arg | None:
        self.taken.add(name)
        return self.args.get(name)

    def value(self, name: str, default: Any = None) -> Any:
        arg = self.take(name)
        return default if arg is None else arg.value

    def peek(self, name: str) -> Arg | None:
        return self.args.get(name)

    def __contains__(self, name: str) -> bool:
        return name in self.args

    def remaining(self) -> list[Arg]:
        return [arg for name, arg in self.args.items() if name not in self.taken]

    def check_all_taken(self) -> None:
        left = self.remaining()
        if left:
            raise InternalError(f"importer did not handle: {', '.join(a.shown for a in left)}")


_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}
_SUFFIX = {"k": 1000, "m": 1000**2, "g": 1000**3, "K": 1024, "M": 1024**2, "G": 1024**3}


def convert(opt: Opt, raw: Any) -> tuple[Any, str | None]:
    """The value of ``raw`` for ``opt``, or (raw, what was expected)."""
    kind = opt.kind
    if kind == "bool":
        if isinstance(raw, bool):
            return raw, None
        text = str(raw).strip().lower()
        if text in _TRUE:
            return True, None
        if text in _FALSE:
            return False, None
        return raw, "true or false"
    if kind in ("int", "tokens"):
        if isinstance(raw, bool):
            return raw, "an integer"
        if isinstance(raw, int):
            value = raw
        elif isinstance(raw, float) and raw.is_integer():
            value = int(raw)
        else:
            text = str(raw).strip()
            scale = 1
            if kind == "tokens" and text[-1:] in _SUFFIX:
                scale, text = _SUFFIX[text[-1]], text[:-1]
            try:
                value = int(float(text) * scale) if scale != 1 else int(text)
            except ValueError:
                return raw, "an integer" + (" (a k/K/m/M suffix is allowed)" if kind == "tokens" else "")
        if opt.minimum is not None and value < opt.minimum:
            return value, f"an integer >= {opt.minimum:g}"
        return value, None
    if kind == "float":
        if isinstance(raw, bool):
            return raw, "a number"
        try:
            value = float(raw)
        except (TypeError, ValueError):
            return raw, "a number"
        if not math.isfinite(value) or (opt.minimum is not None and value < opt.minimum):
            return value, "a finite number" + (f" >= {opt.minimum:g}" if opt.minimum is not None else "")
        return value, None
    if kind == "choice":
        text = str(raw).strip()
        for choice in opt.choices:
            if text == choice or (opt.fold_case and text.lower() == choice.lower()):
                return choice, None
        return raw, "one of: " + ", ".join(opt.choices)
    if kind == "any":
        return raw, None
    if isinstance(raw, (dict, list)):
        return raw, "a single value"
    return str(raw), None


def _fold(name: str, fold: bool) -> str:
    return name.replace("_", "-") if fold else name


class Table:
    """The options an importer knows, indexed by every spelling."""

    def __init__(self, system: str, opts: Iterable[Opt], *, fold_underscores: bool = False,
                 flag_prefix: str = "--"):
        self.system = system
        self.opts = list(opts)
        self.fold = fold_underscores
        self.prefix = flag_prefix
        self.index: dict[str, Opt] = {}
        for opt in self.opts:
            for spelling in (opt.name, *opt.aliases):
                key = _fold(spelling, self.fold)
                if key in self.index:
                    raise InternalError(f"{system}: option {spelling} defined twice")
                self.index[key] = opt

    def lookup(self, name: str) -> Opt | None:
        return self.index.get(_fold(name, self.fold))

    def suggest(self, name: str, cli: bool = True) -> str:
        close = difflib.get_close_matches(_fold(name, self.fold), list(self.index), n=1, cutoff=0.75)
        if not close:
            return ""
        opt = self.index[close[0]]
        spelling = opt.name if opt.name.isupper() or not cli else self.prefix + opt.name
        return f"; did you mean {spelling}?"

    def unknown(self, shown: str, value: Any, source: str | None = None, line: int | None = None,
                bare: str | None = None) -> InputError:
        name = bare if bare is not None else shown.lstrip("-")
        return InputError(Problem(shown, value, f"an option batchcheck knows for {self.system}, listed in "
                                  f"docs/importers.md, or --ignore-unknown{self.suggest(name, cli=source is None)}",
                                  line), source)


def _looks_like_flag(token: str) -> bool:
    if not token.startswith("-") or token == "-":
        return False
    try:
        float(token)
        return False  # a negative number is a value
    except ValueError:
        return True


def _converted(opt: Opt, raw: Any, shown: str) -> Arg:
    """The option's value converted, or an input error naming it as the user wrote it (``shown``)."""
    value, expected = convert(opt, raw)
    arg = Arg(opt.name, value, shown)
    if expected is not None:
        raise arg.error(expected)
    return arg


def parse_cli(tokens: list[str], table: Table, *, env: dict[str, str] | None = None,
              positional: Callable[[str], None] | None = None) -> Given:
    """Parse a server's command-line arguments: ``--name VALUE``, ``--name=VALUE``, boolean ``--flag``,
    ``--no-flag`` and ``--flag=false``; ``KEY=VALUE`` environment assignments for the keys in ``env``
    (mapped to option names); other bare words go to ``positional`` (or are refused)."""
    out: dict[str, Arg] = {}
    i = 0
    while i < len(tokens):
        token = tokens[i]
        i += 1
        if token == "--":
            continue
        if _looks_like_flag(token):
            name, eq, inline = token.lstrip("-").partition("=")
            opt = table.lookup(name)
            negated = False
            if opt is None and name.startswith("no-") and (neg := table.lookup(name[3:])) is not None \
                    and neg.kind == "bool":
                opt, negated = neg, True
            if opt is None:
                has_value = not eq and i < len(tokens) and not _looks_like_flag(tokens[i])
                value = inline if eq else (tokens[i] if has_value else "<unknown option>")
                shown = f"--{name}" if token.startswith("--") else f"-{name}"
                unknown_option(table.unknown(shown, value, bare=name),
                               f"{shown}={value}" if eq or has_value else shown)
                i += has_value  # its value, if it has one, goes with it
                continue
            shown = token.split("=", 1)[0]
            if opt.kind == "bool":
                if negated:
                    if eq:
                        raise InputError(Problem(shown, inline, "no value after a --no- flag"))
                    raw: Any = False
                elif eq:
                    raw = inline
                elif i < len(tokens) and tokens[i].strip().lower() in ("true", "false"):
                    raw = tokens[i]
                    i += 1
                else:
                    raw = True
            elif eq:
                raw = inline
            elif i < len(tokens) and not _looks_like_flag(tokens[i]):
                raw = tokens[i]
                i += 1
            else:
                raise InputError(Problem(shown, "<missing>", f"a value after {shown}"))
            out[opt.name] = _converted(opt, raw, shown)
            continue
        key, eq, raw_value = token.partition("=")
        if eq and env is not None and re.fullmatch(r"[A-Z_][A-Z0-9_]*", key):
            if key not in env:
                close = difflib.get_close_matches(key, list(env), n=1, cutoff=0.75)
                hint = f"; did you mean {close[0]}?" if close else ""
                unknown_option(InputError(Problem(key, raw_value, f"an environment variable batchcheck knows for "
                                                  f"{table.system}, listed in docs/importers.md, or --ignore-unknown"
                                                  f"{hint}")), token)
                continue
            opt = table.lookup(env[key])
            if opt is None:
                raise InternalError(f"{table.system}: env {key} names unknown option {env[key]}")
            out[opt.name] = _converted(opt, raw_value, key)
            continue
        if positional is None:
            raise InputError(Problem("(argument)", token, f"{table.prefix}option VALUE: {table.system} takes "
                                     "no positional arguments here"))
        positional(token)
    return Given(out)


def parse_mapping(data: Any, lines: dict, table: Table, source: str, *, nested: Iterable[str] = (),
                  prefix: tuple[Any, ...] = ()) -> Given:
    """Parse a YAML mapping of options (a vLLM ``--config`` file, a TensorRT-LLM LLM-API file). Keys of
    ``nested`` sections are flattened to ``section.key``."""
    if data is None:
        return Given()
    if not isinstance(data, dict):
        raise InputError(Problem("", "<not a mapping>", f"a mapping of {table.system} options", 1), source)
    nested = set(nested)
    out: dict[str, Arg] = {}
    for key, raw in data.items():
        loc = prefix + (key,)
        line = lines.get(loc)
        shown = ".".join(str(p) for p in loc)
        if str(key) in nested and not prefix:
            if not isinstance(raw, dict):
                raise InputError(Problem(shown, raw, "a mapping", line), source)
            sub = parse_mapping(raw, lines, table, source, prefix=loc)
            out.update(sub.args)
            continue
        opt = table.lookup(shown)
        if opt is None:
            unknown_option(table.unknown(shown, raw, source, line, bare=shown), f"{shown}={display(raw)}")
            continue
        value, expected = convert(opt, raw)
        arg = Arg(opt.name, value, shown, source, line)
        if expected is not None:
            raise arg.error(expected)
        out[opt.name] = arg
    return Given(out)


# ----------------------------------------------------------------------------------------- the draft policy
def display(value: Any) -> str:
    """A value in a note or comment: like :func:`scalar`, but strings as they are."""
    return value if isinstance(value, str) else scalar(value)


def scalar(value: Any) -> str:
    """A value as the YAML writer prints it: true, 16, 0.9, fcfs, [kv_growth_fails]."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(scalar(v) for v in value) + "]"
    text = str(getattr(value, "value", value))
    if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_./-]*", text) and text.lower() not in (
            "true", "false", "null", "yes", "no", "on", "off", "y", "n", "~"):
        return text
    import json
    return json.dumps(text)


@dataclass
class Draft:
    """The policy being built: field path -> (value, comment), and the report of how it was built."""

    system: str
    title: str  # the system and version, for the file header
    fields: dict[str, tuple[Any, str | None]] = field(default_factory=dict)
    assumed: list[str] = field(default_factory=list)
    approximated: list[str] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)

    def set(self, path: str, value: Any, comment: str | None = None) -> None:
        self.fields[path] = (value, comment)

    def assume(self, path: str, value: Any, why: str, comment: str | None = None) -> None:
        """Set a field from the system's default (the option was not given) and say so."""
        self.set(path, value, comment or "assumed (default)")
        self.assumed.append(f"{path}={display(value)} ({why})")

    def assume_input(self, name: str, value: Any, why: str) -> None:
        """An input that is not a policy field (e.g. --gpu-memory-utilization) filled from a default."""
        self.assumed.append(f"{name}={display(value)} ({why})")

    def approximate(self, what: str, value: Any, why: str) -> None:
        self.approximated.append(f"{what}={display(value)} ({why})")

    def ignore(self, arg: Arg, why: str) -> None:
        self.ignored.append(f"{arg.note()} ({why})")

    def value(self, path: str, default: Any = None) -> Any:
        return self.fields.get(path, (default, None))[0]

    def data(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for path, (value, _) in self.fields.items():
            *parents, last = path.split(".")
            here = out
            for part in parents:
                here = here.setdefault(part, {})
            here[last] = list(value) if isinstance(value, tuple) else value
        return out


# ----------------------------------------------------------------------------------------- small helpers
def refuse(arg: Arg, expected: str) -> InputError:
    """An option the policy model cannot express (or a value the system itself rejects): exit 2."""
    return arg.error(expected)


def missing(name: str, expected: str, source: str | None = None) -> InputError:
    return InputError(Problem(name, "<missing>", expected), source)


def take_listed(given: Given, table: Table, draft: Draft) -> None:
    """Take every given option the table settles by name: one tagged "no-effect" is listed in the draft as
    ignored; one with a ``refused`` reason is refused (all of them reported together, refusals.py), or
    ignored when it is a boolean given as false (the feature is off)."""
    for arg in list(given.args.values()):
        opt = table.lookup(arg.name)
        if opt is None:
            continue
        if "no-effect" in opt.tags:
            given.take(arg.name)
            draft.ignore(arg, "no effect on scheduling")
        elif opt.refused:
            given.take(arg.name)
            if arg.value is False:
                draft.ignore(arg, "off")
            else:
                refuse_later(refuse(arg, f"no {arg.shown}: {opt.refused}"))


def take_weight_offload(given: Given, draft: Draft, name: str, fixed: str | None) -> None:
    """A CPU weight-offload option (vLLM's and SGLang's --cpu-offload-gb): it changes only the GPU memory left
    for KV, so it is ignored when ``fixed`` (the option that fixes the pool) is given or it offloads nothing,
    and refused otherwise (the pool computed from the declared machine would be too small)."""
    arg = given.take(name)
    if arg is None:
        return
    if fixed is not None:
        draft.ignore(arg, f"{fixed} fixes the pool: offloaded weights would only change how much GPU memory is "
                     "left for KV")
    elif arg.value == 0:
        draft.ignore(arg, "nothing offloaded")
    else:
        refuse_later(refuse(arg, f"0, or a fixed KV pool: offloading weights to the CPU leaves more GPU memory "
                            "for KV than the pool computed from the declared machine (give the pool the server's "
                            "log prints)"))


def take_length_limit(given: Given, draft: Draft, name: str, expected: str) -> int:
    """The required option that becomes ``max_model_len`` (exit 2 naming it when absent)."""
    arg = given.take(name)
    if arg is None:
        raise missing(f"--{name}", expected)
    draft.set("max_model_len", arg.value, arg.shown)
    return arg.value


def parse_version(text: str, what: str = "--vllm-version") -> tuple[int, int]:
    match = re.fullmatch(r"v?(\d+)\.(\d+)(?:\.\d+)?(?:[.+-]?\w+)*", text.strip())
    if not match:
        raise InputError(Problem(what, text, "a version such as 0.33, 0.9.2 or 0.6.3.post1"))
    return int(match.group(1)), int(match.group(2))


# ----------------------------------------------------------------------------------------- machine sizing
@dataclass(frozen=True)
class Machine:
    """What batchcheck needs to size a KV pool when the server computes it at start-up: the GPU's
    memory, the model's weights (whole model, split evenly by tensor parallelism), the model's KV bytes
    per token (all layers and KV heads; or a profile's model shape) and the memory the server keeps for
    activations and non-torch allocations."""

    gpu_memory_gib: float | None = None
    model_weights_gib: float | None = None
    kv_bytes_per_token: int | None = None
    overhead_gib: float | None = None
    profile: str | Path | None = None

    OPTIONS = ("--gpu-memory-gib", "--model-weights-gib", "--kv-bytes-per-token", "--overhead-gib", "--profile")

    def given(self) -> list[str]:
        values = (self.gpu_memory_gib, self.model_weights_gib, self.kv_bytes_per_token, self.overhead_gib,
                  self.profile)
        return [name for name, value in zip(self.OPTIONS, values, strict=True) if value is not None]

    def check(self) -> None:
        for name, value in (("--gpu-memory-gib", self.gpu_memory_gib), ("--model-weights-gib", self.model_weights_gib),
                            ("--overhead-gib", self.overhead_gib)):
            if value is not None and (not math.isfinite(value) or value < 0 or value > 1e6):
                raise InputError(Problem(name, value, "a number of GiB >= 0"))
        if self.gpu_memory_gib is not None and self.gpu_memory_gib <= 0:
            raise InputError(Problem("--gpu-memory-gib", self.gpu_memory_gib, "a number of GiB > 0"))
        if self.kv_bytes_per_token is not None and not 1 <= self.kv_bytes_per_token <= 1 << 30:
            raise InputError(Problem("--kv-bytes-per-token", self.kv_bytes_per_token, "an integer >= 1"))

    def kv_bytes(self, kv_dtype_bytes: int | None = None) -> tuple[int, str] | None:
        """KV bytes per token for the whole model, and where the figure comes from."""
        if self.kv_bytes_per_token is not None:
            return self.kv_bytes_per_token, "--kv-bytes-per-token"
        if self.profile is None:
            return None
        from checker.profile import load_profile

        shape = load_profile(self.profile).model
        if shape is None:
            raise InputError(Problem("model", "<missing>", "a model shape (layers, hidden, heads, kv_heads) in the "
                                     "profile, or pass --kv-bytes-per-token"), str(self.profile))
        update: dict[str, int] = {"tensor_parallel": 1}
        if kv_dtype_bytes is not None:
            update["dtype_bytes"] = kv_dtype_bytes
        return shape.model_copy(update=update).kv_bytes_per_token, f"the model shape of {self.profile}"


def pool_tokens(machine: Machine, draft: Draft, *, fraction: float, fraction_name: str, of_free: bool,
                tensor_parallel: int, server: str, kv_dtype_bytes: int | None = None) -> int:
    """KV tokens one GPU holds. vLLM and SGLang: fraction x GPU memory - weights - overhead (the fraction
    covers weights and KV); TensorRT-LLM: fraction x (GPU memory - weights - overhead) (the fraction is of
    the memory left after the weights)."""
    need = []
    if machine.gpu_memory_gib is None:
        need.append("--gpu-memory-gib")
    if machine.model_weights_gib is None:
        need.append("--model-weights-gib")
    kv = machine.kv_bytes(kv_dtype_bytes)
    if kv is None:
        need.append("--kv-bytes-per-token (or --profile with a model shape)")
    if need:
        raise UsageError(f"the KV pool size of {server} is not given: pass it (see docs/importers.md) or "
                         f"declare the machine with {', '.join(need)}")
    assert machine.gpu_memory_gib is not None and machine.model_weights_gib is not None and kv is not None
    overhead = machine.overhead_gib
    if overhead is None:
        overhead = 0.0
        draft.assume_input("--overhead-gib", 0.0, f"activation peak and non-torch memory not declared; {server} "
                           "measures them at start-up: take them from its log")
    weights = machine.model_weights_gib / tensor_parallel
    if of_free:
        free = fraction * (machine.gpu_memory_gib - weights - overhead)
    else:
        free = fraction * machine.gpu_memory_gib - weights - overhead
    per_token = kv[0] / tensor_parallel
    tokens = int(free * GIB // per_token) if free > 0 else 0
    if tokens < 1:
        raise InputError(Problem("--model-weights-gib", machine.model_weights_gib,
                                 f"weights that leave room for a KV pool: {fraction_name}={fraction:g} of "
                                 f"--gpu-memory-gib={machine.gpu_memory_gib:g} leaves {free:.2f} GiB per GPU"))
    return tokens
