"""A finished check as CI reports it: its verdict, whether it gates, where in the policy it points, its
stable fingerprint, and the order in which findings are shown."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from checker.ci.results import FAILED, INCONCLUSIVE, Result
from checker.ci.locations import changed_lines, fields_for, locate, locate_change
from checker.ci.plan import DIFF, FUZZ, LIVENESS, VERIFY, Check, PolicyInfo

ERROR, WARNING, NOTE = "error", "warning", "note"  # SARIF levels
_LEVEL_RANK = {ERROR: 0, WARNING: 1, NOTE: 2}
_VERDICT_RANK = {"VIOLATED": 0, "UNKNOWN": 1, "VACUOUS": 2, "NO_COUNTEREXAMPLE": 2}
FINGERPRINT_KEY = "batchcheckFinding/v1"


@dataclass
class Finding:
    check: Check
    result: Result
    field: str  # the policy field path it points at ("" for the whole policy)
    line: int  # that field's line in the policy YAML
    gating: bool  # counts for the exit code
    counterexample: str | None = None  # where the caller wrote it
    certificate: str | None = None

    @property
    def outcome(self) -> str:
        return self.result.outcome

    @property
    def never_occurs(self) -> bool:
        """A VACUOUS verdict whose situation is proved never to occur, at any depth (verify's ``vacuity``)."""
        return self.result.verdict == "VACUOUS" and self.result.detail.get("vacuity") == "never occurs at any depth"

    @property
    def level(self) -> str | None:
        """SARIF level, or None for a passing check (no result is reported for it)."""
        if self.outcome == FAILED:
            return ERROR if self.gating else WARNING
        if self.outcome == INCONCLUSIVE:
            return WARNING if self.gating else NOTE
        return None

    @property
    def rule_id(self) -> str:
        prefix = {VERIFY: "invariant", FUZZ: "slo", DIFF: "diff", LIVENESS: "liveness"}[self.check.kind]
        return f"{prefix}/{self.check.rule}"

    @property
    def fingerprint(self) -> str:
        """From what the finding is about, never from lines or times: policy name, check, parameters, field."""
        c = self.check
        params = ",".join(f"{k}={v}" for k, v in c.params)
        what = c.name if c.kind == FUZZ else c.rule
        text = "\x1f".join((c.policy_name, c.kind, what, params, self.field))
        return hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]

    def rank(self) -> tuple:
        """Gating before warning before note; violations before inconclusive; then the smallest
        counterexample, the earliest violation; then by policy and check for a stable order."""
        d = self.result.detail
        return (_LEVEL_RANK.get(self.level or "", 3), _VERDICT_RANK.get(self.result.verdict, 3),
                d.get("requests") or 0, d.get("violation_iteration") or 0, self.check.policy.shown, self.check.label)


def make_finding(check: Check, result: Result, policy: PolicyInfo, inconclusive_gates: bool) -> Finding:
    fields = fields_for(check.kind, check.rule, check.metric)
    if check.kind == DIFF and check.old is not None:  # where the change is (the pull request's lines)
        field, line = locate_change(fields, policy.lines, changed_lines(check.old.text, check.policy.text))
    else:
        field, line = locate(fields, policy.lines)
    gating = check.level == ERROR and (result.outcome != INCONCLUSIVE or inconclusive_gates)
    return Finding(check, result, field, line, gating)
