"""``diff OLD NEW``: what did a scheduler config change break?

For each invariant: the verdict under OLD and under NEW (``verify``'s bounded check), and a
classification of the change from witnesses, each a trace replayed on the engine under both policies:

- ``less safe`` witness: a trace on which NEW violates the invariant and OLD does not;
- ``safer`` witness: a trace on which OLD violates it and NEW does not.

When one side has no violation within the bounds, the other side's minimal counterexample is such a
witness (checked on the engine under both); when both sides violate, the product encoding
(``checker.diff.product``: both policies on the same symbolic arrivals) looks for one each way.
For each SLO property the same two directions are searched on generated traces (``checker.diff.slo``).

Classification: no witness either way -> equivalent (within the bounds / examples stated); only safer
witnesses -> strictly safer; only less-safe ones -> strictly less safe; both -> incomparable. A
regression is a property with a less-safe witness (strictly less safe or incomparable): exit 1.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from checker.errors import InternalError
from checker.fuzz.slo import Property
from checker.policy import Policy
from checker.profile import Profile
from checker.traces import dump_json_trace
from checker.verify import counterexample as cex
from checker.verify.env import Environment
from checker.verify.replay import first_violation, replay_fixed_clock
from checker.verify.run import Checked, Verdict, check_one, save_counterexample
from checker.workload import Workload
from invariants.catalogue import Invariant


class Change(StrEnum):
    EQUIVALENT = "equivalent"
    SAFER = "strictly safer"
    LESS_SAFE = "strictly less safe"
    INCOMPARABLE = "incomparable"
    UNKNOWN = "unknown"


def classify(new_worse: bool | None, old_worse: bool | None) -> Change:
    """From whether a witness exists each way (None: not decided, e.g. a timeout)."""
    if new_worse and old_worse:
        return Change.INCOMPARABLE
    if new_worse is None or old_worse is None:
        return Change.UNKNOWN  # a regression all the same if new_worse: the witness exists
    if new_worse:
        return Change.LESS_SAFE
    return Change.SAFER if old_worse else Change.EQUIVALENT


@dataclass
class Side:
    """A witness one way: where it is saved and what it shows."""

    requests: int
    iterations: int  # for an invariant: iterations up to the violation; for an SLO: the trace's requests again
    path: Path | None
    detail: str
    row: str = ""  # an SLO witness's figures for the summary row (the columns show the workload's own values)


@dataclass
class PropertyDiff:
    kind: str  # "invariant" or "slo"
    label: str
    old_verdict: str
    new_verdict: str
    change: Change
    new_worse: Side | None = None  # witness that NEW is worse (a regression)
    old_worse: Side | None = None  # witness that OLD is worse (what the change fixes)
    strength: str = ""  # how far "no witness" was checked
    notes: list[str] = field(default_factory=list)

    @property
    def regression(self) -> bool:
        return self.new_worse is not None

    def summary_line(self) -> str:
        mark = "REGRESSION" if self.regression else "undecided" if self.change is Change.UNKNOWN else "ok"
        line = f"{mark:<11}{self.label:<34}{self.change.value:<20}{self.old_verdict} -> {self.new_verdict}"
        if self.new_worse is not None and self.new_worse.row:
            line += f"; {self.new_worse.row}"
        return line

    def as_dict(self) -> dict:
        def side(s: Side | None) -> dict | None:
            return None if s is None else {"requests": s.requests, "iterations": s.iterations,
                                           "file": str(s.path) if s.path else None, "detail": s.detail}
        return {"kind": self.kind, "property": self.label, "old": self.old_verdict, "new": self.new_verdict,
                "change": self.change.value, "regression": self.regression, "new_worse_witness": side(self.new_worse),
                "old_worse_witness": side(self.old_worse), "strength": self.strength, "notes": self.notes}


# ----------------------------------------------------------------------------------------- invariants
HELD = (Verdict.HOLDS_UP_TO, Verdict.PROVED, Verdict.VACUOUS)


@dataclass
class Pair:
    old: Policy
    new: Policy
    old_file: str | None  # None: a Policy object (no file; counterexamples record its whole spec)
    new_file: str | None

    @property
    def identical(self) -> bool:
        return cex.policy_hash(self.old) == cex.policy_hash(self.new)

    def same_within(self, slots: int) -> bool:
        """Identical rules, or rules that differ only in limits no run of ``slots`` requests reaches
        (checker/semantics/limits.py): then every verdict of NEW is OLD's, for any number of iterations."""
        from checker.semantics.limits import as_seen_by

        return self.identical or cex.policy_hash(as_seen_by(self.old, slots)) == \
            cex.policy_hash(as_seen_by(self.new, slots))


def unreached_line(pair: Pair, slots: int) -> str | None:
    """The summary's line when the rules differ only in limits that ``slots`` requests cannot reach."""
    if pair.identical or not pair.same_within(slots):
        return None
    return (f"unreached: with {slots} request slots no run reaches the changed limits (a count of {slots} requests "
            f"is below both values): every invariant row is OLD's verdict on both sides; to compare them, raise "
            f"--requests above the smaller value")


def _holds_on(policy: Policy, inv: Invariant, params: dict[str, int], env: Environment, specs, depth: int) -> bool:
    return first_violation(inv, params, replay_fixed_clock(policy, specs, depth, env.step_us, env.tenants)) is None


def _from_counterexample(checked: Checked, keeps: Policy, env: Environment) -> Side:
    """The breaking side's own minimal counterexample, when the other side holds everywhere within the
    bounds: it is a witness; confirm that on the engine."""
    assert checked.violation_step is not None
    depth = checked.violation_step + 1
    if not _holds_on(keeps, checked.invariant, checked.params, env, checked.specs, depth):
        raise InternalError(f"{keeps.name} holds {checked.invariant.name} within the bounds, yet fails on the "
                            f"counterexample {checked.counterexample} when replayed on the engine")
    return Side(checked.requests, depth, checked.counterexample,
                f"{checked.requests} request(s), fails at iteration {checked.violation_step}")


def _product_side(keeps: Policy, breaks: Policy, breaks_file: str | None, inv: Invariant, params: dict[str, int],
                  env: Environment, timeout_s: float, out_dir: Path | None, progress) -> tuple[bool | None, Side | None, str]:
    from checker.diff.product import witness

    search = witness(keeps, breaks, inv, params, env, timeout_s, progress)
    if search.status == "unknown":
        return None, None, (f"timeout while looking for a trace where {breaks.name} fails and {keeps.name} "
                            f"holds (decided up to depth {search.depth_reached})")
    if search.status == "none":
        return False, None, ""
    w = search.witness
    assert w is not None
    path = save_counterexample(breaks, breaks_file, inv, params, env, w.specs, w.violation, w.breaks_frames,
                               w.minimal, "not minimised", "z3 product encoding (batchcheck diff)", out_dir,
                               holds_under={"name": keeps.name, "sha256": cex.policy_hash(keeps)})
    detail = f"{len(w.specs)} request(s), {breaks.name} fails at iteration {w.violation}, {keeps.name} holds"
    return True, Side(len(w.specs), w.depth, path, detail + ("; " + "; ".join(w.notes) if w.notes else "")), ""


def proof_first(policy: Policy, inv: Invariant, unbounded: bool | None) -> bool:
    """Whether a side's verdict tries the proof first: ``unbounded`` True or False as given; None (diff's default,
    issue 19): where the action-wise proof covers the policy and the invariant (PROVED for N slots and any depth
    implies no violation within the bounds, so a witness search is needed only where a side does not hold), else
    the bounded search alone (no whole-step induction added to it)."""
    if unbounded is not None:
        return unbounded
    from checker.verify.actions import supported
    from checker.verify.run import proof_applies

    return proof_applies(policy) and supported(inv)


def diff_invariant(pair: Pair, inv: Invariant, params: dict[str, int], env: Environment, timeout_s: float,
                   out_dir: Path | None, unbounded: bool | None = None, progress=None) -> PropertyDiff:
    """``unbounded``: see proof_first. Each side's verdict in this process, then the comparison."""
    old = check_one(pair.old, pair.old_file, inv, params, env, timeout_s, out_dir,
                    proof_first(pair.old, inv, unbounded), None, progress)
    new = None if pair.same_within(env.requests) else check_one(pair.new, pair.new_file, inv, params, env, timeout_s, out_dir,
                                                proof_first(pair.new, inv, unbounded), None, progress)
    return compare_invariant(pair, old, new, env, timeout_s, out_dir, progress)


# Said on a row when the product query was not asked because the breaking side's own search timed out
PRODUCT_SKIPPED = ("no product query: {breaks}'s own search timed out and {keeps} {how}, so a trace where {breaks} "
                   "fails and {keeps} holds is a question at least as hard as the one that timed out: undecided "
                   "(raise --timeout, or lower --requests / --depth)")


def compare_invariant(pair: Pair, old: Checked, new: Checked | None, env: Environment, timeout_s: float,
                      out_dir: Path | None, progress=None) -> PropertyDiff:
    """The row of one invariant from each side's verdict (``new`` None: the same rules as N slots see them,
    Pair.same_within): witnesses each way.

    Where the breaking side VIOLATED and the other HELD, its counterexample is a witness (replayed on the engine);
    where the other side is UNKNOWN, that counterexample is replayed on it first and is a witness if it holds there,
    else the product encoding asks for one. Where the breaking side is UNKNOWN (its own search timed out) and the
    other side did not violate, the product query is not asked: it cannot be easier than the search that timed out
    (the row is undecided, and a note says why)."""
    inv, params = old.invariant, old.params
    label = old.label
    bounds = f"{env.requests} requests, {env.depth} iterations"
    if new is None:
        return PropertyDiff("invariant", label, old.verdict.value, old.verdict.value, Change.EQUIVALENT,
                            strength="identical rules (the step semantics is a function of the rules)"
                            if pair.identical else
                            f"the same runs with {env.requests} request slots: the rules differ only in limits no "
                            f"run of {env.requests} requests reaches ({old.verdict.value} on both, "
                            + ("for any number of iterations)" if old.verdict is Verdict.PROVED else f"within {bounds})"))
    result = PropertyDiff("invariant", label, old.verdict.value, new.verdict.value, Change.UNKNOWN)

    def direction(breaks: Checked, keeps: Checked, keeps_policy: Policy, breaks_policy: Policy,
                  breaks_file: str | None) -> tuple[bool | None, Side | None]:
        if breaks.verdict in HELD:
            return False, None
        if breaks.verdict is Verdict.VIOLATED and keeps.verdict in HELD:
            return True, _from_counterexample(breaks, keeps_policy, env)
        if breaks.verdict is Verdict.VIOLATED and keeps.verdict is Verdict.UNKNOWN and breaks.specs \
                and _holds_on(keeps_policy, inv, params, env, breaks.specs, breaks.violation_step + 1):
            return True, _from_counterexample(breaks, keeps_policy, env)
        if breaks.verdict is Verdict.UNKNOWN and keeps.verdict is not Verdict.VIOLATED:
            how = "was undecided too" if keeps.verdict is Verdict.UNKNOWN else \
                f"holds within the bounds ({keeps.verdict.value})"
            note = PRODUCT_SKIPPED.format(breaks=breaks_policy.name, keeps=keeps_policy.name, how=how)
            result.notes.append(note)
            return None, None
        found, side, note = _product_side(keeps_policy, breaks_policy, breaks_file, inv, params, env, timeout_s,
                                          out_dir, progress)
        if note:
            result.notes.append(note)
        return found, side

    new_worse, result.new_worse = direction(new, old, pair.old, pair.new, pair.new_file)
    old_worse, result.old_worse = direction(old, new, pair.new, pair.old, pair.old_file)
    result.change = classify(new_worse, old_worse)
    both_proved = old.verdict is Verdict.PROVED and new.verdict is Verdict.PROVED
    result.strength = ("both PROVED for any number of iterations" if both_proved else
                       f"checked within {bounds} (bounded, not a proof)")
    return result


# ----------------------------------------------------------------------------------------- SLO properties
def _save_trace(trace, workload: Workload, prop: Property, which: str, out_dir: Path | None) -> Path | None:
    if out_dir is None:
        return None
    from checker.fileio import safe_name, write_atomic
    from checker.fuzz.strategies import to_requests

    doc = dump_json_trace(to_requests(trace, workload, f"batchcheck diff witness: {which} worse on {prop.name}"))
    text = json.dumps(doc, indent=1) + "\n"
    digest = hashlib.sha256(text.encode()).hexdigest()[:8]
    path = out_dir / f"diff__{safe_name(prop.name)}__{which}_worse__{digest}.trace.json"
    write_atomic(path, text, create_dirs=True)
    return path


def _on_workload(policy: Policy, workload: Workload, profile: Profile, prop: Property) -> str:
    """The property on the workload's own generated requests (what ``simulate`` runs)."""
    from checker.engine import simulate
    from checker.fuzz.slo import evaluate
    from checker.traces import from_workload

    o = evaluate(prop, simulate(policy, from_workload(workload, "workload"), profile).summary())
    if o.observed is None:
        return "holds (vacuous)"
    return f"holds ({o.observed:g})" if o.holds else f"VIOLATED ({o.observed:g} > {o.allowed:g})"


def diff_slo(pair: Pair, workload: Workload, profile: Profile, prop: Property, tolerance, max_examples: int,
             time_budget_s: float, seed: int, out_dir: Path | None, progress=None) -> PropertyDiff:
    from checker.diff.slo import samples_needed, search_direction

    sides: dict[str, tuple[bool | None, Side | None]] = {}
    examples, notes = 0, []
    for which, new_is_worse in (("new", True), ("old", False)):
        d = search_direction(pair.old, pair.new, workload, profile, prop, new_is_worse, tolerance, max_examples,
                             time_budget_s / 2, seed, progress=progress)
        examples += d.examples
        if d.witness is None and d.examples == 0:  # the budget was spent before the first example: undecided
            sides[which] = (None, None)
            notes.append(f"no example ran looking for a trace where {which.upper()} is worse (the SLO search's "
                         f"share of --fuzz-budget, {time_budget_s / 2:g} s, was spent first): undecided")
            continue
        if d.witness is None:
            sides[which] = (False, None)
            continue
        c = d.witness.comparison
        path = _save_trace(d.witness.trace, workload, prop, which, out_dir)
        why = c.why(prop, new_is_worse)
        n = len(d.witness.trace)
        detail = (f"{n} request(s): {c.new.detail} old {c.old.observed} -> new {c.new.observed} "
                  f"(allowed {c.new.allowed}); it {why}")
        row = f"on a {n}-request witness {c.old.observed:g} -> {c.new.observed:g} (allowed {c.new.allowed:g}): {why}"
        sides[which] = (True, Side(n, n, path, detail, row))
    change = classify(sides["new"][0], sides["old"][0])
    on_workload = [_on_workload(policy, workload, profile, prop) for policy in (pair.old, pair.new)]
    result = PropertyDiff("slo", prop.name, on_workload[0], on_workload[1], change, sides["new"][1], sides["old"][1])
    result.notes += notes
    need, stat = samples_needed(prop)
    result.strength = (f"searched {examples} generated examples (a search, not a proof); worse means "
                       f"more than {tolerance.threshold:.0%} and {tolerance.min_delta:g} above the other"
                       + (", breaking the SLO where the other meets it" if tolerance.must_violate else
                          f", on a trace that breaks the SLO where the other meets it or has at least {need} "
                          f"requests for {stat}"))
    return result
