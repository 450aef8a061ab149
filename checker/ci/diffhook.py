"""HOOK: ``[[diff]]`` entries of batchcheck.toml, for ``batchcheck diff OLD NEW`` (issue 7; the verb and
its library live in checker/diff/, built separately).

What is here: the config model (checker.ci.config.DiffEntry) and its validation in checker.ci.plan (both
policies exist and load, their invariants parse, and their KV pools count in the same unit: same
``kv.block_size``). What is missing: running the diff. To wire it, set ``DIFF_RUNNER`` to a function
``(old_path: str, new_path: str, entry: DiffEntry) -> list[tuple[Check, Result]]`` that returns one Check
(kind "diff", rule the invariant or SLO property, policy = NEW) and Result per property compared, with
verdict VIOLATED for a regression (its witness as a counterexample artifact); checker.ci.run turns them
into findings located at NEW's policy fields like any other check. Until then a config with [[diff]]
entries exits 2 with a message that says so.
"""

from __future__ import annotations

from collections.abc import Callable

from checker.ci.config import DiffEntry
from checker.ci.execute import Result
from checker.ci.plan import Check, Plan
from checker.ci.tomllines import LineMap
from checker.errors import InputError, Problem
from checker.loading import _line_for

DiffRunner = Callable[[str, str, DiffEntry], list[tuple[Check, Result]]]
DIFF_RUNNER: DiffRunner | None = None  # HOOK: batchcheck diff's library function, once it exists


def run_diffs(plan: Plan, lines: LineMap) -> list[tuple[Check, Result]]:
    if not plan.diffs:
        return []
    if DIFF_RUNNER is None:
        i, entry = plan.diffs[0]
        raise InputError(Problem(f"diff[{i}]", f"{entry.old} -> {entry.new}",
                                 "no [[diff]] entries: this build's `batchcheck ci` cannot run `batchcheck diff` yet "
                                 "(run it separately)", _line_for(("diff", i), lines)), plan.source)
    pairs: list[tuple[Check, Result]] = []
    for _, entry in plan.diffs:
        pairs += DIFF_RUNNER(str(plan.root / entry.old), str(plan.root / entry.new), entry)
    return pairs
