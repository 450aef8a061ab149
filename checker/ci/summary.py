"""The markdown summary of a CI run, for a pull-request comment: the verdict in one line, then the
findings (ranked), what code scanning could not show, and every check."""

from __future__ import annotations

from collections.abc import Sequence

from checker.ci.results import FAILED, INCONCLUSIVE
from checker.ci.findings import Finding
from checker.ci.sarif import RUN_TIME, MAX_PER_RULE, annotated
from checker.exitcodes import ExitCode

HEADLINE = {ExitCode.OK: "no gating finding", ExitCode.VIOLATED: "gating violation(s) found",
            ExitCode.INCONCLUSIVE: "inconclusive (a gating check could not decide)",
            ExitCode.NEVER_OCCURS: "a gating invariant never applies (VACUOUS at any depth; [gate] split_vacuous)"}


def _row(f: Finding) -> str:
    c, r = f.check, f.result
    detail = " ".join(RUN_TIME.sub("", r.line.split(None, 2)[-1]).split()).replace("|", "\\|")
    gate = {"error": "gates", "warning": "warns", "note": "note", None: ""}[f.level]
    where = f"`{c.policy.shown}:{f.line}` ({f.field or 'policy'})"
    return f"| {r.verdict} | {gate} | {c.policy_name} | {c.kind} {c.label} | {where} | {detail} |"


_HEAD = "| verdict | gate | policy | check | location | detail |\n|---|---|---|---|---|---|"


def summary_markdown(findings: Sequence[Finding], code: ExitCode, seconds: float, where: str,
                     notes: Sequence[str] = (), unfinished: str | None = None) -> str:
    """``unfinished``: the run is still going (e.g. "3 of 40 checks finished"): the headline says so and gives
    the verdict of the finished checks only."""
    failed = [f for f in findings if f.outcome == FAILED]
    unsure = [f for f in findings if f.outcome == INCONCLUSIVE]
    gating = [f for f in failed if f.gating]
    policies = {f.check.policy.shown for f in findings}
    head = (f"## batchcheck ci: {HEADLINE[code]} (exit {int(code)})" if unfinished is None else
            f"## batchcheck ci, unfinished ({unfinished}): so far {HEADLINE[code]}")
    out = [head, "",
           f"{len(findings)} checks on {len(policies)} policies in {seconds:.1f} s ({where}): "
           f"{len(failed)} violated ({len(gating)} gating), {len(unsure)} inconclusive, "
           f"{len(findings) - len(failed) - len(unsure)} hold within their bounds. Bounded verdicts "
           "(HOLDS_UP_TO, NO_COUNTEREXAMPLE) are not proofs; PROVED is for the stated request slots (liveness: "
           "for the stated instance).", ""]
    shown, overflow = annotated(findings)
    if shown:
        out += ["### Findings", "", _HEAD, *(_row(f) for f in shown), ""]
    if overflow:
        out += [f"### Not annotated on the pull request (over {MAX_PER_RULE} per rule)", "", _HEAD,
                *(_row(f) for f in overflow), ""]
    replays = [f for f in shown + overflow if f.counterexample]
    if replays:
        out += ["### Reproduce", "", "```bash", *(f"batchcheck replay {f.counterexample}" for f in replays),
                "```", ""]
    for note in notes:
        out.append(f"- {note}")
    if notes:
        out.append("")
    out += ["<details><summary>All checks</summary>", "", _HEAD, *(_row(f) for f in findings), "", "</details>", ""]
    return "\n".join(out)
