"""Run a whole ``diff``: invariants (z3), SLO properties (generated traces), the audit of both; and the
report a reviewer reads: a summary first (ten seconds), then the details."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from checker.semantics.blocked import refuse as refuse_blocked
from checker.audit import run_derived_audit
from checker.diff.compare import (Change, Pair, PropertyDiff, compare_invariant, diff_invariant, diff_slo,
                                  unreached_line)
from checker.diff.sides import parallel_ok, side_verdicts
from checker.errors import InputError, Problem, UsageError
from checker.exitcodes import ExitCode
from checker.fuzz.slo import load_slo, slo_file_for
from checker.inputfiles import PolicyInput, load_policy, policy_source
from checker.loading import load_document, load_model
from checker.policy import Policy
from checker.profile import load_profile
from checker.verify.env import Environment, default_environment
from checker.verify.run import DEFAULT_INVARIANTS, parse_invariant
from checker.workload import Workload

DIFF_INVARIANTS = DEFAULT_INVARIANTS + ("no_deadlock", "decode_progress")


@dataclass
class AuditPair:
    old: str  # the audit's key=value text
    new: str
    old_decision: str
    new_decision: str


@dataclass
class DiffReport:
    old: Policy
    new: Policy
    old_file: str | None  # None: a Policy object
    new_file: str | None
    env: Environment | None
    properties: list[PropertyDiff]
    audit: AuditPair | None = None
    changed_fields: list[str] = field(default_factory=list)
    seconds: float = 0.0
    unreached: str | None = None  # the summary's line when no run within the bounds reaches the changed limits

    @property
    def regressions(self) -> list[PropertyDiff]:
        return [p for p in self.properties if p.regression]

    @property
    def exit_code(self) -> ExitCode:
        if self.regressions:
            return ExitCode.VIOLATED
        if any(p.change is Change.UNKNOWN for p in self.properties) or self.change_unseen:
            return ExitCode.INCONCLUSIVE
        return ExitCode.OK

    @property
    def change_unseen(self) -> bool:
        """The rules differ only in limits no run within the bounds reaches and no SLO row ran a workload: no row
        saw the change, so "no regression" would be a green gate for any value of the knob (exit 3, not 0)."""
        return self.unreached is not None and not any(p.kind == "slo" for p in self.properties)

    def headline(self) -> str:
        n, r = len(self.properties), len(self.regressions)
        props = "property" if n == 1 else "properties"
        if r:
            word = f"REGRESSION in {r} of {n} {props}"
        elif self.change_unseen:
            word = f"the change is not reached within the bounds: no row of {n} {props} saw it (see unreached:)"
        elif self.exit_code is ExitCode.INCONCLUSIVE:
            word = f"no regression found, but {sum(p.change is Change.UNKNOWN for p in self.properties)} of {n} " \
                   f"{props} undecided (timeout)"
        else:
            word = f"no regression in {n} {props} (within the bounds below; not a proof unless PROVED)"
        return f"diff {self.old.name} -> {self.new.name}: {word}  (exit {int(self.exit_code)})"

    def text(self) -> str:
        lines = [self.headline()]
        if self.changed_fields:
            lines.append("changed: " + ", ".join(self.changed_fields))
        else:
            lines.append("changed: nothing (identical rules)")
        if self.unreached:
            lines.append(self.unreached)
        for p in self.regressions:  # one line each: what the change breaks, and how it shows
            assert p.new_worse is not None
            lines.append(f"why {p.label}: NEW worse, {p.new_worse.detail}")
        undecided = [p for p in self.properties if p.change is Change.UNKNOWN and not p.regression]
        if undecided:
            hints = (["raise --timeout, or lower --requests / --depth"] * any(p.kind != "slo" for p in undecided)
                     + ["raise --fuzz-budget (SLO searches)"] * any(p.kind == "slo" for p in undecided))
            lines.append(f"undecided: {', '.join(p.label for p in undecided)} (a search timed out: "
                         f"{'; '.join(hints)})")
        lines.append("")
        lines += [p.summary_line() for p in self.properties]
        if self.audit is not None:
            lines.append(f"audit: {self.audit.old_decision} -> {self.audit.new_decision}")
        lines += ["", "details:"]
        for p in self.properties:
            lines.append(f"  {p.label} ({p.kind}): {p.change.value}")
            if p.new_worse is not None:
                lines.append(f"    NEW worse: {p.new_worse.detail}; witness: {p.new_worse.path or 'not saved (--out none)'}")
            if p.old_worse is not None:
                lines.append(f"    OLD worse: {p.old_worse.detail}; witness: {p.old_worse.path or 'not saved (--out none)'}")
            if p.new_worse is None and p.old_worse is None:
                lines.append(f"    no witness either way: {p.strength}")
            elif p.new_worse is None or p.old_worse is None:
                lines.append(f"    no witness the other way: {p.strength}")
            lines += [f"    note: {n}" for n in p.notes]
        if self.env is not None:
            lines.append("  environment (invariants): " + "; ".join(self.env.describe()))
        if self.audit is not None:
            lines.append("  audit OLD: " + self.audit.old.replace("\n", " "))
            lines.append("  audit NEW: " + self.audit.new.replace("\n", " "))
        if self.regressions:
            first = next((p for p in self.regressions if p.new_worse and p.new_worse.path), None)
            old_file, new_file = (f or f"<{p.name}: a Policy object>" for f, p in ((self.old_file, self.old),
                                                                                   (self.new_file, self.new)))
            if first is not None and first.kind == "invariant":
                lines.append(f"  replay: batchcheck replay {first.new_worse.path} (NEW fails); "
                             f"batchcheck replay {first.new_worse.path} --policy {old_file} (OLD holds)")
            elif first is not None:
                lines.append(f"  replay: batchcheck simulate {new_file} --trace {first.new_worse.path}  and the same "
                             f"with {old_file}")
        lines.append(f"  [{self.seconds:.1f} s]")
        return "\n".join(lines)

    def as_dict(self) -> dict:
        return {"old": {"name": self.old.name, "file": self.old_file}, "new": {"name": self.new.name, "file": self.new_file},
                "exit_code": int(self.exit_code), "regressions": [p.label for p in self.regressions],
                "changed": self.changed_fields, "unreached": self.unreached, "properties": [p.as_dict() for p in self.properties],
                "environment": self.env.as_dict() if self.env else None,
                "audit": None if self.audit is None else {"old": self.audit.old, "new": self.audit.new},
                "seconds": round(self.seconds, 2)}


def changed_fields(old: Policy, new: Policy) -> list[str]:
    """Dotted paths of the rule fields that differ (``batch.max_num_batched_tokens: 8192 -> 2048``)."""
    out: list[str] = []

    def walk(a, b, path: str) -> None:
        if isinstance(a, dict) and isinstance(b, dict):
            for key in sorted(set(a) | set(b)):
                walk(a.get(key), b.get(key), f"{path}.{key}" if path else key)
        elif a != b:
            out.append(f"{path}: {a} -> {b}")

    walk(old.model_dump(mode="json", exclude={"name"}), new.model_dump(mode="json", exclude={"name"}), "")
    return out


def run_diff(old: PolicyInput, new: PolicyInput, workload: str | Path | None = None, slo: str | Path | None = None,
             invariants: list[str] | None = None, requests: int = 3, depth: int = 5, timeout_s: float = 60.0,
             profile: str | Path | None = None, threshold: float = 0.2, min_delta: float = 1.0,
             max_examples: int = 100, fuzz_budget_s: float = 60.0, seed: int = 0,
             out_dir: str | Path | None = "counterexamples", prompt: tuple[int, int] | None = None,
             output: tuple[int, int] | None = None, unbounded: bool | None = None, slo_properties: list[str] | None = None,
             audit: bool = True, slo_must_violate: bool = False, progress=None, jobs: int = 1) -> DiffReport:
    """What a policy change breaks: invariant verdicts side by side with witnesses each way (z3), SLO
    regression witnesses on generated traces (when a workload has an SLO file), and the audit of both. OLD and
    NEW: policy files or Policy objects. ``unbounded``: each side's verdict tries the proof first (True), the
    bounded search alone (False), or, None, the proof first where the action-wise proof covers the invariant
    (checker/diff/compare.py proof_first). ``jobs``: the sides' invariant verdicts on that many worker processes
    (checker/diff/sides.py; 1: serially, in this process); the same rows and exit code either way."""
    started = time.monotonic()
    pair = Pair(load_policy(old), load_policy(new), policy_source(old), policy_source(new))
    for pol, file in ((pair.old, pair.old_file), (pair.new, pair.new_file)):  # z3's checks: refused before any run
        refuse_blocked(pol, "diff (its checks use the z3 encoding)", file)
    if pair.old.name == pair.new.name:
        pair.new = pair.new.model_copy(update={"name": f"{pair.new.name} (new)"})
    if pair.old.kv.block_size != pair.new.kv.block_size:  # pools and KV figures in different units
        line = None if pair.new_file is None else load_document(new)[1]().get(("kv", "block_size"))
        raise InputError(Problem("kv.block_size", pair.new.kv.block_size,
                                 f"the same KV block size as OLD {pair.old_file or pair.old.name} "
                                 f"({pair.old.kv.block_size} tokens per block) to compare their pools", line),
                         pair.new_file or f"NEW ({pair.new.name})")
    if not 0 <= threshold <= 100:
        raise InputError(Problem("--threshold", threshold, "a relative increase between 0 and 100 (0.2 = 20 %)"))
    if workload is None and (slo is not None or slo_properties):
        raise UsageError("--slo and --property need --workload (the traces are generated from its classes)")
    chosen = [parse_invariant(text) for text in (invariants if invariants is not None else DIFF_INVARIANTS)]
    speculative = next((side for side in (pair.new, pair.old) if side.speculative.enabled), None)
    if chosen and speculative is not None:  # before any verdict: the product's verifier choices are not paired
        from checker.smt.encode import require_no_speculative
        require_no_speculative(speculative)
    wl, slo_chosen = None, []  # every input is read and checked before the first solver call
    if workload is not None and (slo is not None or slo_properties or slo_file_for(workload).exists()):
        wl, _, slo_chosen = load_slo(workload, slo, slo_properties)
    elif workload is not None:
        wl = load_model(Workload, workload)
    prof = load_profile(profile) if slo_chosen else None
    widest = pair.old if pair.old.max_model_len >= pair.new.max_model_len else pair.new
    env = default_environment(widest, requests, depth, wl, prompt, output) if chosen else None
    out = Path(out_dir) if out_dir is not None else None
    if jobs > 1 and len(chosen) > 0 and parallel_ok(chosen):
        verdicts = side_verdicts(pair, chosen, env, timeout_s, out, unbounded, jobs, progress)
        props = [compare_invariant(pair, o, n, env, timeout_s, out, progress) for o, n in verdicts]
    else:
        props = [diff_invariant(pair, inv, params, env, timeout_s, out, unbounded, progress) for inv, params in chosen]
    audit_pair = None
    if slo_chosen:
        from checker.diff.slo import Tolerance  # Hypothesis loads only for SLO comparisons

        tolerance = Tolerance(threshold, min_delta, slo_must_violate)
        props += [diff_slo(pair, wl, prof, prop, tolerance, max_examples, fuzz_budget_s / len(slo_chosen), seed,
                           out, progress) for prop in slo_chosen]
    if workload is not None and audit:
        a, b = (run_derived_audit(p, workload, profile) for p in (old, new))
        audit_pair = AuditPair(a.text(), b.text(), a.decision, b.decision)
    return DiffReport(pair.old, pair.new, pair.old_file, pair.new_file, env, props, audit_pair,
                      changed_fields(pair.old, pair.new), time.monotonic() - started,
                      unreached_line(pair, env.requests) if chosen else None)
