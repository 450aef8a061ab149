"""What a check gives back from its worker (picklable): its verdict and one-line report, the detail that
JUnit, SARIF and the summary read, and the text of the files it produced (counterexamples, certificates),
which the caller writes once all checks have finished."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from checker.ci.plan import LIVENESS, Check

FAILED = "failed"
INCONCLUSIVE = "inconclusive"
PASSED = "passed"
OUTCOME = {"VIOLATED": FAILED, "UNKNOWN": INCONCLUSIVE, "VACUOUS": INCONCLUSIVE,
           "PROVED": PASSED, "HOLDS_UP_TO": PASSED, "NO_COUNTEREXAMPLE": PASSED}
# A liveness NO_COUNTEREXAMPLE is a cut graph (--max-states/--timeout): the check could not decide. (A fuzz
# NO_COUNTEREXAMPLE is a finished search of its budget.)
LIVENESS_OUTCOME = {**OUTCOME, "NO_COUNTEREXAMPLE": INCONCLUSIVE}
COUNTEREXAMPLE = "counterexample"
CERTIFICATE = "certificate"


@dataclass
class Artifact:
    kind: str  # COUNTEREXAMPLE or CERTIFICATE
    name: str  # file name
    text: str


@dataclass
class Result:
    verdict: str  # VIOLATED, PROVED, HOLDS_UP_TO, VACUOUS, UNKNOWN, NO_COUNTEREXAMPLE
    line: str  # the one-line report, as `verify` / `fuzz` print it
    detail: dict[str, Any]
    seconds: float
    artifacts: list[Artifact] = field(default_factory=list)
    kind: str = ""  # the check's kind (LIVENESS maps NO_COUNTEREXAMPLE to inconclusive)

    @property
    def outcome(self) -> str:
        return (LIVENESS_OUTCOME if self.kind == LIVENESS else OUTCOME)[self.verdict]


def shown_paths(doc: dict, paths: dict[str, str | None], check: Check) -> dict:
    """Counterexamples record the files they came from: name the project's files, not the worker's copies."""
    shown = {paths[role]: ref.shown for role, ref in (("policy", check.policy), ("workload", check.workload),
                                                      ("slo", check.slo), ("old", check.old)) if ref is not None}
    doc["policy"]["file"] = shown.get(doc["policy"].get("file"), check.policy.shown)
    for section in ("search", "environment"):  # a lasso's search, a fuzz find's environment
        recorded = doc.get(section)
        if isinstance(recorded, dict):
            for key in ("workload", "slo"):
                if recorded.get(key) in shown:
                    recorded[key] = shown[recorded[key]]
    return doc
