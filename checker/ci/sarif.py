"""SARIF 2.1.0 for GitHub code scanning: one result per failing or inconclusive check, located at the
policy field it judges, with a stable partial fingerprint. Code scanning shows only about ten annotations
per rule, so results are ranked and at most ``MAX_PER_RULE`` per rule are kept; the rest are listed in
the markdown summary."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path

from checker import __version__
from checker.ci.findings import FINGERPRINT_KEY, Finding
from checker.ci.plan import DIFF, FUZZ, LIVENESS

SCHEMA_URI = "https://json.schemastore.org/sarif-2.1.0.json"
SARIF_VERSION = "2.1.0"
MAX_PER_RULE = 10
SOURCE_ROOT = "%SRCROOT%"
RUN_TIME = re.compile(r"\s*\[[0-9.]+ s\]\s*$")  # run times stay out of messages


def annotated(findings: Sequence[Finding]) -> tuple[list[Finding], list[Finding]]:
    """(the findings to annotate, ranked; the overflow past MAX_PER_RULE per rule)."""
    shown, overflow, per_rule = [], [], {}
    for f in sorted((f for f in findings if f.level is not None), key=Finding.rank):
        per_rule[f.rule_id] = per_rule.get(f.rule_id, 0) + 1
        (shown if per_rule[f.rule_id] <= MAX_PER_RULE else overflow).append(f)
    return shown, overflow


def _statement(f: Finding) -> str:
    if f.check.kind == LIVENESS:
        from checker.liveness.lasso import STATEMENTS

        return STATEMENTS[f.check.rule] + " Checked on the state graph of a small instance (docs/liveness.md)."
    if f.check.kind != FUZZ:
        from invariants.catalogue import CATALOGUE

        inv = CATALOGUE.get(f.check.rule)
        return inv.statement if inv is not None else f"invariant {f.check.rule}"
    return f"SLO property kind {f.check.rule} holds on the fuzzed traces (docs/fuzz.md)"


def _message(f: Finding) -> str:
    c, r = f.check, f.result
    where = f"policy {c.policy_name} ({c.policy.shown})"
    if c.kind == DIFF:
        where += f", compared with {c.old.shown}"
    field = f" at {f.field}" if f.field else ""
    detail = RUN_TIME.sub("", r.line.split(None, 2)[-1].strip())
    text = f"{c.label} {r.verdict} for {where}{field}: {detail}."
    if f.counterexample:
        text += f" Replay: batchcheck replay {f.counterexample}"
    return text


def sarif_log(findings: Sequence[Finding], root: Path, unfinished: str | None = None) -> dict:
    """``unfinished``: the run is still going (e.g. "3 of 40 checks finished"): the invocation is not (yet)
    successful and says so."""
    shown, _ = annotated(findings)
    rules: dict[str, dict] = {}
    for f in sorted(findings, key=lambda f: f.rule_id):
        rules.setdefault(f.rule_id, {
            "id": f.rule_id, "name": f.check.rule,
            "shortDescription": {"text": f"{f.check.rule}"},
            "fullDescription": {"text": _statement(f)},
            "defaultConfiguration": {"level": "error"},
        })
    order = list(rules)
    results = []
    for f in shown:
        uri = f.check.policy.shown
        results.append({
            "ruleId": f.rule_id, "ruleIndex": order.index(f.rule_id), "level": f.level,
            "message": {"text": _message(f)},
            "locations": [{"physicalLocation": {
                "artifactLocation": {"uri": uri, **({"uriBaseId": SOURCE_ROOT} if not Path(uri).is_absolute()
                                                    else {})},
                "region": {"startLine": f.line}}}],
            "partialFingerprints": {FINGERPRINT_KEY: f.fingerprint},
            "properties": {"verdict": f.result.verdict, "policy": f.check.policy_name, "check": f.check.label,
                           "field": f.field, "gating": f.gating,
                           **({"counterexample": f.counterexample} if f.counterexample else {})},
        })
    run = {
        "tool": {"driver": {"name": "batchcheck", "version": __version__,
                            "rules": list(rules.values())}},
        "originalUriBaseIds": {SOURCE_ROOT: {"uri": root.resolve().as_uri() + "/"}},
        "results": results,
        "invocations": [{"executionSuccessful": True} if unfinished is None else
                        {"executionSuccessful": False, "toolExecutionNotifications": [
                            {"level": "note", "message": {"text": f"unfinished: {unfinished}"}}]}],
    }
    return {"$schema": SCHEMA_URI, "version": SARIF_VERSION, "runs": [run]}


def sarif_text(findings: Sequence[Finding], root: Path, unfinished: str | None = None) -> str:
    return json.dumps(sarif_log(findings, root, unfinished), indent=2) + "\n"
