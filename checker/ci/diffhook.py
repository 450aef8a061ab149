"""``[[diff]]`` entries of batchcheck.toml: OLD vs NEW with ``batchcheck diff``'s library function
(checker.diff.run.run_diff), one check per invariant so they run in parallel like the others.

A diff check asks "is NEW no worse than OLD for this invariant?". Its verdict: VIOLATED when NEW has a
regression witness (a trace on which NEW breaks the invariant and OLD keeps it, saved as a
counterexample), UNKNOWN when the comparison timed out, otherwise HOLDS_UP_TO (no regression within the
bounds; not a proof). Findings are located at NEW's policy field for the invariant. SLO regressions
(``batchcheck diff --workload``) are not run from the config: run ``batchcheck diff`` for those.
"""

from __future__ import annotations

from typing import Any

from checker.ci.plan import Check

REGRESSION = "VIOLATED"
NO_REGRESSION = "HOLDS_UP_TO"
UNDECIDED = "UNKNOWN"


def run_diff_check(check: Check, paths: dict[str, str | None], out_dir) -> tuple[str, dict[str, Any], str]:
    """Run one invariant of a diff entry in a worker; returns (verdict, detail, line)."""
    from checker.diff.compare import Change
    from checker.diff.run import run_diff

    report = run_diff(paths["old"], paths["policy"], invariants=[check.name], requests=check.requests,
                      depth=check.depth, timeout_s=check.timeout_s, out_dir=out_dir, audit=False)
    prop = report.properties[0]
    verdict = REGRESSION if prop.regression else UNDECIDED if prop.change is Change.UNKNOWN else NO_REGRESSION
    detail = prop.as_dict()
    detail["verdict"] = verdict
    if prop.new_worse is not None:
        detail["requests"] = prop.new_worse.requests
        detail["violation_iteration"] = prop.new_worse.iterations - 1
        detail["counterexample"] = str(prop.new_worse.path) if prop.new_worse.path else None
    what = (f"NEW worse: {prop.new_worse.detail}" if prop.new_worse is not None else
            f"no regression: {prop.strength}" if verdict == NO_REGRESSION else "undecided (timeout)")
    line = (f"{verdict:<12} {check.label:<40} {check.old.shown} -> {check.policy.shown}: {prop.change.value} "
            f"({prop.old_verdict} -> {prop.new_verdict}); {what}")
    return verdict, detail, line
