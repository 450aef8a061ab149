"""JUnit XML: one testsuite per policy, one testcase per check. A gating violation is a <failure>; a
gating inconclusive verdict (UNKNOWN, VACUOUS) is an <error> (the check could not decide); a non-gating
inconclusive one is <skipped>; a non-gating violation passes with the finding in <system-out>."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Sequence

from checker.ci.results import FAILED, INCONCLUSIVE
from checker.ci.findings import Finding


def _case(f: Finding) -> ET.Element:
    c, r = f.check, f.result
    case = ET.Element("testcase", {"classname": f"batchcheck.{c.policy_name}",
                                   "name": f"{c.kind} {c.label}" + (f" from {c.old.shown}" if c.old else ""),
                                   "file": c.policy.shown, "line": str(f.line), "time": f"{r.seconds:.3f}"})
    text = r.line + (f"\nreplay: batchcheck replay {f.counterexample}" if f.counterexample else "")
    if f.outcome == FAILED and f.gating:
        ET.SubElement(case, "failure", {"type": r.verdict, "message": f"{c.label} {r.verdict} ({f.field})"}).text = text
    elif f.outcome == INCONCLUSIVE and f.gating:
        ET.SubElement(case, "error", {"type": r.verdict, "message": f"{c.label} {r.verdict}: not decided"}).text = text
    elif f.outcome == INCONCLUSIVE:
        ET.SubElement(case, "skipped", {"message": f"{r.verdict} (warning only): {r.line}"})
    else:
        ET.SubElement(case, "system-out").text = text + ("\n(warning only: does not gate)" if f.outcome == FAILED
                                                         else "")
    return case


def junit_xml(findings: Sequence[Finding], seconds: float, unfinished: str | None = None) -> str:
    """``unfinished``: the run is still going (e.g. "3 of 40 checks finished"): said in the suites' name."""
    name = "batchcheck ci" + (f" (unfinished: {unfinished})" if unfinished else "")
    suites = ET.Element("testsuites", {"name": name, "time": f"{seconds:.3f}"})
    by_policy: dict[str, list[Finding]] = {}
    for f in findings:
        by_policy.setdefault(f.check.policy.shown, []).append(f)
    totals = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    for shown, group in by_policy.items():
        cases = [_case(f) for f in group]
        counts = {"tests": len(cases),
                  "failures": sum(1 for c in cases if c.find("failure") is not None),
                  "errors": sum(1 for c in cases if c.find("error") is not None),
                  "skipped": sum(1 for c in cases if c.find("skipped") is not None)}
        suite = ET.SubElement(suites, "testsuite", {"name": shown, **{k: str(v) for k, v in counts.items()},
                                                    "time": f"{sum(f.result.seconds for f in group):.3f}"})
        suite.extend(cases)
        for key, value in counts.items():
            totals[key] += value
    for key, value in totals.items():
        suites.set(key, str(value))
    ET.indent(suites)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(suites, encoding="unicode") + "\n"
