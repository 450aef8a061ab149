"""From a validated config to the list of checks to run, with every input checked first.

Globs are expanded relative to the config file; every policy, workload, SLO file and invariant is loaded
and validated here, before any check starts, so a bad config exits 2 with nothing written. Each check
carries the text of the files it needs, so a worker on another machine needs no shared file system.
"""

from __future__ import annotations

import glob
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from checker.ci.config import CiConfig, DiffEntry, Level, LivenessEntry
from checker.ci.gitbase import changed_files, text_at
from checker.ci.tomllines import LineMap
from checker.errors import InputError, Problem
from checker.inputfiles import apply_overrides, load_policy
from checker.loading import _line_for, load_model, parse_yaml, read_text, validate

VERIFY = "verify"
FUZZ = "fuzz"
DIFF = "diff"  # OLD vs NEW (checker/ci/diffhook.py); policy is NEW
LIVENESS = "liveness"  # a lasso search on a small instance (checker.liveness.check.run_liveness); one per property


@dataclass(frozen=True)
class InputFile:
    shown: str  # the path as reports show it (relative to the config file's folder)
    text: str


@dataclass(frozen=True)
class PolicyInfo:
    shown: str
    name: str
    lines: LineMap  # field path -> line in the policy YAML (for SARIF locations)
    block_size: int


@dataclass(frozen=True)
class LivenessInstance:
    """A liveness check's instance beyond Check.requests and Check.timeout_s (liveness CLI options)."""

    prompts: tuple[int, ...] | None
    outputs: tuple[int, ...]
    priorities: tuple[int, ...] | None
    tenants: int
    cancellations: bool
    arrivals_per_step: int | None
    step_ms: float
    max_states: int
    overrides: tuple[str, ...]
    identities: tuple | None = None  # prompt identities (checker.requests.IDENTITIES entries), None: the default
    external: tuple[int, ...] | None = None  # a KV connector's external hits (liveness --external), None: the default
    accepted: tuple[int, ...] | None = None  # the verifier's accepted-draft counts (liveness --accepted), None: 0..k


@dataclass(frozen=True)
class Check:
    """One unit of work: one invariant or one SLO property on one policy."""

    kind: str  # VERIFY or FUZZ
    policy: InputFile
    policy_name: str
    name: str  # the invariant as written (NAME[:PARAMS]), the SLO property name or the liveness property
    rule: str  # invariant name, SLO property kind or liveness property (SARIF rule, policy field mapping)
    params: tuple[tuple[str, int | str], ...]  # every parameter with its value (defaults included); liveness:
    # the instance (requests and what differs from the liveness defaults, then the overrides)
    level: Level
    where: str  # the config path that asked for it, e.g. "verify[0].invariants[1]"
    requests: int = 0
    depth: int = 0
    timeout_s: float = 0.0
    unbounded: bool | None = False  # None: verify's default (the proof first where one applies)
    temporal_induction: bool = False  # verify --temporal-induction
    workload: InputFile | None = None
    slo: InputFile | None = None
    profile: InputFile | None = None
    metric: str | None = None  # latency SLOs: which metric
    max_examples: int = 0
    time_budget_s: float = 0.0
    seed: int = 0
    max_requests: int = 0
    modules: tuple[InputFile | str, ...] = ()  # user invariant modules: .py files carried, module names as is
    old: InputFile | None = None  # DIFF: the policy before the change
    instance: LivenessInstance | None = None  # LIVENESS

    @property
    def label(self) -> str:
        shown = ", ".join(f"{k}={v}" for k, v in self.params)
        if self.kind == FUZZ:
            return self.name
        return f"{self.rule}({shown})" if shown else self.rule

    @property
    def key(self) -> Check:
        """What makes two checks the same work: everything but how it gates, where it was asked for, and
        how the invariant was spelled (its parameters are all in ``params``)."""
        return replace(self, level="error", where="", name=self.name if self.kind == FUZZ else self.rule)


@dataclass
class Plan:
    root: Path  # the config file's folder: relative paths in the config are relative to it
    source: str  # the config file as named on the command line
    checks: list[Check] = field(default_factory=list)
    policies: dict[str, PolicyInfo] = field(default_factory=dict)
    not_configured: list[str] = field(default_factory=list)  # --policy files no entry covers
    notes: list[str] = field(default_factory=list)  # what the plan left out and why (base diffs)


def materialise(folder: Path, files: dict[str, InputFile | None]) -> dict[str, str | None]:
    """Write the carried files into ``folder`` (a worker's private one); their paths there, by role."""
    out: dict[str, str | None] = {}
    for i, (role, ref) in enumerate(files.items()):
        if ref is None:
            out[role] = None
            continue
        path = folder / f"in{i}" / Path(ref.shown.split("@", 1)[0]).name  # PATH@REF: a policy at --base
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(ref.text, encoding="utf-8")
        out[role] = str(path)
    return out


_LOADED_MODULES: set[str | InputFile] = set()  # user invariant modules already registered in this process


def load_invariant_modules(modules: Sequence[str | InputFile]) -> None:
    """Register user invariants once per process (loading a .py file twice would register a second,
    different invariant under the same name): module names as they are, .py files from their carried text."""
    from invariants.plugins import load_entry_points, load_module

    if not _LOADED_MODULES:
        load_entry_points()
        _LOADED_MODULES.add("")
    for module in modules:
        if module in _LOADED_MODULES:
            continue
        if isinstance(module, str):
            load_module(module)
        else:
            from checker.ci.usercode import SHOWN_AS

            with tempfile.TemporaryDirectory(prefix="batchcheck-ci-") as tmp:
                path = materialise(Path(tmp), {"module": module})["module"]
                SHOWN_AS[path] = module.shown  # its errors name the project's file, not the temporary copy
                load_module(path)
        _LOADED_MODULES.add(module)


class _Resolver:
    def __init__(self, config: CiConfig, lines: LineMap, source: str, root: Path):
        self.config, self.lines, self.source, self.root = config, lines, source, root
        self.texts: dict[str, InputFile] = {}
        self.policies: dict[str, PolicyInfo] = {}

    def fail(self, loc: tuple[Any, ...], value: object, expected: str) -> InputError:
        from checker.loading import format_path

        return InputError(Problem(format_path(loc), value, expected, _line_for(loc, self.lines)), self.source)

    def shown(self, path: Path) -> str:
        try:
            return path.resolve().relative_to(self.root.resolve()).as_posix()
        except ValueError:
            return str(path)

    def file(self, loc: tuple[Any, ...], text: str, what: str) -> InputFile:
        path = self.root / text
        if not path.is_file():
            raise self.fail(loc, text, f"an existing {what} file (relative to {self.source})")
        shown = self.shown(path)
        if shown not in self.texts:
            self.texts[shown] = InputFile(shown, read_text(path))
        return self.texts[shown]

    def policy_files(self, loc: tuple[Any, ...], patterns: list[str]) -> list[InputFile]:
        found: list[InputFile] = []
        for i, pattern in enumerate(patterns):
            where = loc + (i,)
            if glob.has_magic(pattern):
                matches = sorted(p for p in glob.glob(str(self.root / pattern), recursive=True) if Path(p).is_file())
                if not matches:
                    raise self.fail(where, pattern, "a glob that matches at least one policy file")
            else:
                matches = [pattern]
            for match in matches:
                ref = self.file(where, match, "policy")
                self.policy(ref)
                if ref not in found:
                    found.append(ref)
        return found

    def policy(self, ref: InputFile) -> PolicyInfo:
        if ref.shown not in self.policies and "@" in ref.shown and not (self.root / ref.shown).is_file():
            return self._policy_at_base(ref)
        if ref.shown not in self.policies:
            pol = load_policy(os.path.relpath(self.root / ref.shown))
            _, lines = parse_yaml(ref.text, ref.shown)
            self.policies[ref.shown] = PolicyInfo(ref.shown, pol.name or Path(ref.shown).stem, lines,
                                                  pol.kv.block_size)
        return self.policies[ref.shown]

    def _policy_at_base(self, ref: InputFile) -> PolicyInfo:
        """A policy as it was at --base (PATH@REF), validated from its text."""
        from checker.policy import Policy

        data, lines = parse_yaml(ref.text, ref.shown)
        pol = validate(Policy, data, ref.shown, lambda: lines)
        info = PolicyInfo(ref.shown, pol.name or Path(ref.shown.split("@")[0]).stem, lines, pol.kv.block_size)
        self.policies[ref.shown] = info
        return info

    def entry_policies(self, section: str, index: int, own: list[str] | None) -> list[InputFile]:
        if own is not None:
            return self.policy_files((section, index, "policies"), own)
        if not self.config.policies:
            raise self.fail((section, index, "policies"), "<missing>",
                            "a list of policy files or globs here or at the top level (policies = [...])")
        return self.policy_files(("policies",), self.config.policies)


def _invariant(res: _Resolver, loc: tuple[Any, ...], text: str):
    from checker.verify.run import parse_invariant

    try:
        return parse_invariant(text)
    except InputError as exc:
        raise res.fail(loc, text, exc.problems[0].expected) from None


def _outside(root: Path, module: str) -> str | None:
    """Where an ``invariant_modules`` entry lies when that is outside ``root`` (the config's folder), else None
    (inside, or not found: the import reports that). A dotted name is looked up without running it: the
    top-level package's location (``importlib.util.find_spec`` of one name imports nothing)."""
    import importlib.util

    if module.endswith(".py"):
        places = [root / module]
    else:
        try:
            spec = importlib.util.find_spec(module.split(".")[0])
        except (ImportError, ValueError):
            return None
        if spec is None:
            return None
        places = [Path(p) for p in (spec.submodule_search_locations or [])] or \
            ([Path(spec.origin)] if spec.origin and spec.has_location else [])
        if not places:
            return f"{module} is built into Python"
    inside = root.resolve()
    for place in places:
        if not place.resolve().is_relative_to(inside):
            return f"{module} is {place.resolve()}"
    return None


def build_plan(config: CiConfig, lines: LineMap, source: str, only: list[str] | None = None,
               base: str | None = None, allow_outside_modules: bool = False) -> Plan:
    """Resolve globs, load and check every input, and list the checks (``only``: keep the checks of
    these policy files, e.g. the ones a pull request changed). ``base``: a git ref; [[diff]] entries without
    old/new compare each changed policy with its version there, and without ``only`` the checks kept are
    those of the policy files changed since it (all of them when the config itself changed).
    ``allow_outside_modules``: ``invariant_modules`` may name code outside the config's folder (ci
    --allow-outside-modules; by default refused: a config is code execution, docs/ci.md)."""
    root = Path(source).resolve().parent
    changed = changed_files(root, base) if base is not None else None
    res = _Resolver(config, lines, source, root)
    d = config.defaults
    modules: list[InputFile | str] = []
    for i, module in enumerate(config.invariant_modules):
        if not allow_outside_modules and (outside := _outside(root, module)) is not None:
            raise res.fail(("invariant_modules", i), module, f"a module inside {root} (it is code that ci runs: "
                           f"{outside}; ci --allow-outside-modules allows it)")
        ref = res.file(("invariant_modules", i), module, "invariant module") if module.endswith(".py") else module
        try:
            load_invariant_modules([ref])
        except InputError as exc:
            raise res.fail(("invariant_modules", i), module, exc.problems[0].expected) from None
        except BaseException as exc:  # SystemExit or another BaseException on import: the module's error
            from checker.ci.usercode import user_code_error

            if user_code_error(exc) is None:
                raise
            raise res.fail(("invariant_modules", i), module, f"a module that imports cleanly (it raised "
                           f"{type(exc).__name__}" + (f": {exc})" if str(exc) else ")")) from None
        modules.append(ref)
    load_invariant_modules([])
    plan = Plan(root, source)
    for i, entry in enumerate(config.verify):
        policies = res.entry_policies("verify", i, entry.policies)
        workload = res.file(("verify", i, "workload"), entry.workload, "workload") if entry.workload else None
        if workload is not None:
            from checker.workload import Workload

            load_model(Workload, root / workload.shown)
        unbounded = d.unbounded if entry.unbounded is None else entry.unbounded
        temporal = d.temporal_induction if entry.temporal_induction is None else entry.temporal_induction
        if temporal and unbounded is False:
            where = ("verify", i, "temporal_induction") if entry.temporal_induction else ("defaults", "temporal_induction")
            raise res.fail(where, True, "false with unbounded = false (k-induction is a proof; the bounded search "
                           "alone cannot use it)")
        for j, text in enumerate(entry.invariants):
            inv, params = _invariant(res, ("verify", i, "invariants", j), text)
            for ref in policies:
                plan.checks.append(Check(
                    VERIFY, ref, res.policies[ref.shown].name, text, inv.name,
                    tuple({**inv.defaults, **params}.items()), entry.level or d.level, f"verify[{i}].invariants[{j}]",
                    requests=entry.requests or d.requests, depth=entry.depth or d.depth,
                    timeout_s=entry.timeout_s or d.timeout_s,
                    unbounded=unbounded, temporal_induction=temporal, workload=workload, modules=tuple(modules)))
    for i, entry in enumerate(config.fuzz):
        _fuzz_checks(res, plan, i, entry)
    for i, entry in enumerate(config.diff):
        if entry.old is None and entry.new is None:
            plan.checks += _base_diff_checks(res, plan, i, entry, tuple(modules), base, changed)
        else:
            plan.checks += _diff_checks(res, i, entry, tuple(modules))
    for i, entry in enumerate(config.liveness):
        plan.checks += _liveness_checks(res, i, entry)
    plan.policies = res.policies
    unique: dict[Check, Check] = {}
    for check in plan.checks:  # the same work asked for twice runs once, gating if either asks it to
        first = unique.setdefault(check.key, check)
        if check.level == "error" and first.level != "error":
            unique[check.key] = replace(first, level="error")
    plan.checks = list(unique.values())
    if only is None and changed is not None and Path(source).resolve() not in changed:
        only = [str(root / shown) for shown in res.policies if (root / shown).resolve() in changed]
        if not only:
            plan.notes.append(f"no policy file of the config changed since {base}: nothing to check")
            plan.checks = []
    if only:
        _keep_only(plan, res, only)
    return plan


def _fuzz_checks(res: _Resolver, plan: Plan, i: int, entry) -> None:
    from checker.fuzz.slo import SLOFile, slo_file_for
    from checker.workload import Workload

    d, root = res.config.defaults, res.root
    policies = res.entry_policies("fuzz", i, entry.policies)
    workload = res.file(("fuzz", i, "workload"), entry.workload, "workload")
    wl = load_model(Workload, root / workload.shown)
    if entry.slo is not None:
        slo = res.file(("fuzz", i, "slo"), entry.slo, "SLO")
    else:
        default = slo_file_for(root / workload.shown)
        if not default.is_file():
            raise res.fail(("fuzz", i, "workload"), entry.workload,
                           f"a workload with an SLO file next to it ({default.name}), or slo = FILE")
        slo = res.file(("fuzz", i, "workload"), str(default.relative_to(root)), "SLO")
    slo_file = load_model(SLOFile, root / slo.shown)
    known = {p.name: p for p in slo_file.properties}
    for j, name in enumerate(entry.properties or []):
        if name not in known:
            raise res.fail(("fuzz", i, "properties", j), name, f"a property of {slo.shown}: " + ", ".join(known))
    classes = [c.name for c in wl.classes]
    for prop in slo_file.properties:
        for attr in ("request_class", "protected", "background"):
            cls = getattr(prop, attr, None)
            if cls is not None and cls not in classes:
                raise res.fail(("fuzz", i, "slo"), slo.shown, f"an SLO file whose classes are classes of the workload "
                               f"({', '.join(classes)}); property {prop.name} names {cls}")
    profile = res.file(("fuzz", i, "profile"), entry.profile, "profile") if entry.profile else None
    chosen = [known[n] for n in entry.properties] if entry.properties else list(slo_file.properties)
    for ref in policies:
        for prop in chosen:
            plan.checks.append(Check(
                FUZZ, ref, res.policies[ref.shown].name, prop.name, prop.kind, (), entry.level or d.level,
                f"fuzz[{i}]", workload=workload, slo=slo, profile=profile, metric=getattr(prop, "metric", None),
                max_examples=entry.max_examples, time_budget_s=entry.time_budget_s / len(chosen), seed=entry.seed,
                max_requests=entry.max_requests))


def _diff_checks(res: _Resolver, i: int, entry: DiffEntry, modules: tuple,
                 old_ref: InputFile | None = None, new_ref: InputFile | None = None) -> list[Check]:
    """Both policies must exist and count their KV pools in the same unit (tokens per block): the diff
    compares pool sizes and blocks in use between them. One check per invariant."""
    from checker.diff.run import DIFF_INVARIANTS

    d = res.config.defaults
    if old_ref is None:
        for key in ("old", "new"):
            if getattr(entry, key) is None:
                raise res.fail(("diff", i), f"<no {key}>", "both old and new, or neither (a base diff: each changed "
                               "policy against its version at batchcheck ci --base REF)")
        if entry.policies is not None:
            raise res.fail(("diff", i, "policies"), entry.policies, "policies only in a base diff (no old, no new)")
        old_ref = res.file(("diff", i, "old"), entry.old, "policy")
        new_ref = res.file(("diff", i, "new"), entry.new, "policy")
    old, new = res.policy(old_ref), res.policy(new_ref)
    if old.block_size != new.block_size:
        raise res.fail(("diff", i, "new"), entry.new or new_ref.shown,
                       f"a policy with the same KV block size as {old.shown} ({old.block_size} tokens per block) to "
                       f"compare their pools; it has {new.block_size}")
    checks = []
    texts = entry.invariants if entry.invariants is not None else list(DIFF_INVARIANTS)
    for j, text in enumerate(texts):
        where = ("diff", i, "invariants", j) if entry.invariants is not None else ("diff", i)
        inv, params = _invariant(res, where, text)
        checks.append(Check(DIFF, new_ref, new.name, text, inv.name, tuple({**inv.defaults, **params}.items()),
                            entry.level or d.level, f"diff[{i}]", requests=entry.requests or d.requests,
                            depth=entry.depth or d.depth, timeout_s=entry.timeout_s or d.timeout_s,
                            modules=modules, old=old_ref))
    return checks


_LIVENESS_OPTIONS = {"--requests": "requests", "--prompts": "prompts", "--outputs": "outputs",
                     "--priorities": "priorities", "--arrivals-per-step": "arrivals_per_step", "--step-ms": "step_ms",
                     "--identities": "identities", "--external": "external", "--accepted": "accepted"}
_INSTANCE_KEYS = ("prompts", "outputs", "priorities", "tenants", "cancellations", "identities", "external",
                  "accepted", "arrivals_per_step", "step_ms")


def _base_diff_checks(res: _Resolver, plan: Plan, i: int, entry: DiffEntry, modules: tuple, base: str | None,
                      changed: set[Path] | None) -> list[Check]:
    """Each policy of the entry that changed since ``base``, against its own text there (OLD is shown as
    PATH@REF). Without --base the entry compares nothing, and says so."""
    policies = res.entry_policies("diff", i, entry.policies)
    if base is None or changed is None:
        plan.notes.append(f"diff[{i}] compares each changed policy with its version at --base REF: no --base given, "
                          "not run")
        return []
    checks = []
    for ref in policies:
        path = (res.root / ref.shown).resolve()
        if path not in changed:
            continue
        text = text_at(res.root, base, path)
        if text is None:
            plan.notes.append(f"diff[{i}]: {ref.shown} is new since {base}: nothing to compare")
            continue
        old_ref = InputFile(f"{ref.shown}@{base}", text)
        res.policy(old_ref)
        checks += _diff_checks(res, i, entry, modules, old_ref, ref)
    return checks


def _liveness_checks(res: _Resolver, i: int, entry: LivenessEntry) -> list[Check]:
    """One check per (policy, property); each policy's overrides and instance are checked here, located at
    the key of the entry (an override that breaks the policy: at that override)."""
    from checker.liveness.canon import IDENTITY_TOKENS
    from checker.liveness.check import liveness_env
    from checker.liveness.explore import external_choice
    from checker.liveness.lasso import default_properties

    d = res.config.defaults
    defaults = LivenessEntry()
    instance = LivenessInstance(
        tuple(entry.prompts) if entry.prompts else None, tuple(entry.outputs),
        tuple(entry.priorities) if entry.priorities else None, entry.tenants, entry.cancellations,
        entry.arrivals_per_step, entry.step_ms, entry.max_states, tuple(entry.set),
        tuple(IDENTITY_TOKENS[t] for t in entry.identities) if entry.identities else None,
        tuple(external_choice(t) for t in entry.external) if entry.external else None,
        tuple(dict.fromkeys(entry.accepted)) if entry.accepted else None)
    shown = [("requests", entry.requests)]
    for key in _INSTANCE_KEYS:
        value = getattr(entry, key)
        if value != getattr(defaults, key):
            shown.append((key, ",".join(map(str, value)) if isinstance(value, list) else
                          f"{value:g}" if isinstance(value, float) else value))
    shown += [tuple(text.split("=", 1)) for text in entry.set]
    checks = []
    for ref in res.entry_policies("liveness", i, entry.policies):
        pol = overridden = load_policy(res.root / ref.shown)
        for j in range(len(entry.set)):  # each prefix of the overrides, to locate the one that breaks the policy
            try:
                overridden = apply_overrides(pol, entry.set[: j + 1])
            except InputError as exc:
                p = exc.problems[0]
                expected = p.expected if p.path in ("", "--set") else f"{p.path}: {p.expected}"
                raise res.fail(("liveness", i, "set", j), entry.set[j], f"{expected} in {ref.shown}") from None
        try:
            liveness_env(overridden, entry.requests, instance.prompts, instance.outputs,
                         instance.priorities, entry.tenants, entry.cancellations, entry.arrivals_per_step,
                         entry.step_ms, instance.identities, instance.external, instance.accepted)
        except InputError as exc:
            p = exc.problems[0]
            key = _LIVENESS_OPTIONS.get(p.path, "")
            value = getattr(entry, key) if key else p.value
            if isinstance(value, float) and value.is_integer():
                value = int(value)  # as written: step_ms = 300
            raise res.fail(("liveness", i, key) if key else ("liveness", i), value,
                           f"{p.expected} for {ref.shown}") from None
        for prop in entry.properties or default_properties(overridden):
            checks.append(Check(LIVENESS, ref, res.policies[ref.shown].name, prop, prop, tuple(shown),
                                entry.level or d.level, f"liveness[{i}]", requests=entry.requests,
                                timeout_s=entry.timeout_s, instance=instance))
    return checks


def _keep_only(plan: Plan, res: _Resolver, only: list[str]) -> None:
    wanted: dict[Path, str] = {}
    for text in only:
        path = Path(text)
        if not path.is_file():
            raise InputError(Problem("--policy", text, "an existing policy file"))
        wanted[path.resolve()] = text

    def files(c: Check) -> set[Path]:
        return {(res.root / ref.shown).resolve() for ref in (c.policy, c.old) if ref is not None}
    covered = set().union(*(files(c) for c in plan.checks)) if plan.checks else set()
    plan.checks = [c for c in plan.checks if files(c) & set(wanted)]
    plan.not_configured = [text for path, text in wanted.items() if path not in covered]
