"""Each side's invariant verdicts for ``diff``: serially in this process (``jobs`` 1), or on local worker processes
(checker.parallel), the same verdicts either way; the comparison (witnesses, product queries) then runs here.

Work units, longest first: per side, the invariants the action-wise proof covers go together (one Houdini run serves
the four state invariants: checker/verify/actions.py keeps it within a process), every other invariant is a unit of
its own (a bounded search each). A user invariant (loaded from a module) keeps the whole diff serial: a spawned
worker does not have its module."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from checker.diff.compare import Pair, proof_first
from checker.policy import Policy
from checker.verify.env import Environment
from checker.verify.run import Checked, check_one
from invariants.catalogue import CATALOGUE, Invariant

Chosen = list[tuple[Invariant, dict[str, int]]]


@dataclass(frozen=True)
class Unit:
    """Some invariants' verdicts under one side's policy (what one worker computes)."""

    side: str  # "old" or "new"
    policy: Policy
    policy_file: str | None
    checks: tuple[tuple[int, str, tuple[tuple[str, int], ...]], ...]  # (index in chosen, invariant, params)
    env: Environment
    timeout_s: float
    out_dir: Path | None
    unbounded: bool | None


def run_unit(unit: Unit, progress=None) -> list[Checked]:
    out = []
    for _, name, params in unit.checks:
        inv = CATALOGUE[name]
        out.append(check_one(unit.policy, unit.policy_file, inv, dict(params), unit.env, unit.timeout_s, unit.out_dir,
                             proof_first(unit.policy, inv, unit.unbounded), None, progress))
    return out


def _in_worker(unit: Unit) -> list[Checked]:
    return run_unit(unit)


def units(pair: Pair, chosen: Chosen, env: Environment, timeout_s: float, out_dir: Path | None,
          unbounded: bool | None) -> list[Unit]:
    """The work units, the proof-first group of each side first (the longest), then one per invariant and side."""
    sides = [("old", pair.old, pair.old_file)] + [("new", pair.new, pair.new_file)] * (not pair.same_within(env.requests))
    out: list[Unit] = []
    for side, policy, file in sides:
        proved = tuple((i, inv.name, tuple(sorted(params.items()))) for i, (inv, params) in enumerate(chosen)
                       if proof_first(policy, inv, unbounded))
        if proved:
            out.append(Unit(side, policy, file, proved, env, timeout_s, out_dir, unbounded))
    for i, (inv, params) in enumerate(chosen):
        for side, policy, file in sides:
            if not proof_first(policy, inv, unbounded):
                out.append(Unit(side, policy, file, ((i, inv.name, tuple(sorted(params.items()))),), env, timeout_s,
                                out_dir, unbounded))
    return out


def parallel_ok(chosen: Chosen) -> bool:
    """Whether workers can rebuild every chosen invariant by its name (a user invariant's module is not theirs)."""
    from invariants.plugins import ORIGINS

    return all(CATALOGUE.get(inv.name) is inv and ORIGINS.get(inv.name) is None for inv, _ in chosen)


def side_verdicts(pair: Pair, chosen: Chosen, env: Environment, timeout_s: float, out_dir: Path | None,
                  unbounded: bool | None, jobs: int, progress=None) -> list[tuple[Checked, Checked | None]]:
    """(OLD's, NEW's) verdict of each chosen invariant, in the order chosen (NEW's None: Pair.same_within), the
    units run on ``jobs`` worker processes; progress says each verdict as it comes."""
    from checker.parallel import map_processes, quiet_worker

    plan = units(pair, chosen, env, timeout_s, out_dir, unbounded)
    found: dict[tuple[int, str], Checked] = {}
    total = sum(len(u.checks) for u in plan)

    def done(k: int, results: list[Checked]) -> None:
        for (i, _, _), checked in zip(plan[k].checks, results):
            found[(i, plan[k].side)] = checked
            if progress is not None:
                progress(f"{checked.label}: {plan[k].side.upper()} {checked.verdict.value} "
                         f"({len(found)}/{total} verdicts)")

    if progress is not None:
        progress(f"{total} verdicts ({len(chosen)} invariants) on {min(jobs, len(plan))} worker process(es)")
    import os

    map_processes(_in_worker, plan, jobs, done, quiet_worker, (os.getpid(),))
    return [(found[(i, "old")], found.get((i, "new"))) for i in range(len(chosen))]
