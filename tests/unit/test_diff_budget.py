"""Every phase of ``diff`` keeps to its budget (issue 19: "a 30 s fuzz budget ran 72-106 s"): the SLO searches stop
at --fuzz-budget also while shrinking a witness and when --max-examples is far more than the budget allows (before,
Hypothesis went on generating examples that returned at once: --fuzz-budget 10 --max-examples 3000 ran 47 s of
SLO search); an SLO direction in which no example ran decides nothing (undecided, never "ok"); each solver search
keeps to --timeout (tests/unit/test_verify_build_budget.py and the product search's own deadline)."""

from __future__ import annotations

import time

from checker.diff.compare import Change
from checker.diff.run import run_diff
from checker.exitcodes import ExitCode
from tests.helpers import POLICIES, WORKLOADS

OLD, NEW = POLICIES / "vllm_v1.yaml", POLICIES / "vllm_v0_no_chunking.yaml"


def test_the_slo_searches_stop_at_the_fuzz_budget_not_at_max_examples():
    started = time.monotonic()
    report = run_diff(OLD, NEW, WORKLOADS / "chat_mixed.yaml", invariants=[], max_examples=100_000, fuzz_budget_s=2.0,
                      out_dir=None, audit=False)
    assert time.monotonic() - started < 30  # a generous bound: 100,000 examples a direction would take hours
    assert report.properties and all(p.kind == "slo" for p in report.properties)


def test_an_slo_search_in_which_no_example_ran_is_undecided():
    report = run_diff(OLD, NEW, WORKLOADS / "chat_mixed.yaml", invariants=[], fuzz_budget_s=1e-6, out_dir=None,
                      audit=False)
    assert report.properties and all(p.change is Change.UNKNOWN for p in report.properties)
    assert report.exit_code is ExitCode.INCONCLUSIVE
    text = report.text()
    assert "(a search timed out: raise --fuzz-budget (SLO searches))" in text
    assert "ok " not in text and "no example ran looking for a trace where NEW is worse" in text
