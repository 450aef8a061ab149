"""Run a whole ``diff``: invariants (z3), SLO properties (generated traces), the audit of both; and the
report a reviewer reads: a summary first (ten seconds), then the details."""

from __future__ import annotations

from dataclasses import dataclass, field

from checker.diff.compare import Change, PropertyDiff
from checker.exitcodes import ExitCode
from checker.policy import Policy
from checker.verify.env import Environment


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
    old_file: str
    new_file: str
    env: Environment | None
    properties: list[PropertyDiff]
    audit: AuditPair | None = None
    changed_fields: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def regressions(self) -> list[PropertyDiff]:
        return [p for p in self.properties if p.regression]

    @property
    def exit_code(self) -> ExitCode:
        if self.regressions:
            return ExitCode.VIOLATED
        if any(p.change is Change.UNKNOWN for p in self.properties):
            return ExitCode.INCONCLUSIVE
        return ExitCode.OK

    def headline(self) -> str:
        n, r = len(self.properties), len(self.regressions)
        props = "property" if n == 1 else "properties"
        if r:
            word = f"REGRESSION in {r} of {n} {props}"
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
            if first is not None and first.kind == "invariant":
                lines.append(f"  replay: batchcheck replay {first.new_worse.path} (NEW fails); "
                             f"batchcheck replay {first.new_worse.path} --policy {self.old_file} (OLD holds)")
            elif first is not None:
                lines.append(f"  replay: batchcheck simulate {self.new_file} --trace {first.new_worse.path}  and the same "
                             f"with {self.old_file}")
        lines.append(f"  [{self.seconds:.1f} s]")
        return "\n".join(lines)

    def as_dict(self) -> dict:
        return {"old": {"name": self.old.name, "file": self.old_file}, "new": {"name": self.new.name, "file": self.new_file},
                "exit_code": int(self.exit_code), "regressions": [p.label for p in self.regressions],
                "changed": self.changed_fields, "properties": [p.as_dict() for p in self.properties],
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
