"""diff's per-side invariant verdicts follow verify's default (issue 19: the cheapest decisive method first): the
action-wise proof where it covers the invariant, so a one-knob change whose sides both hold is decided by two
proofs instead of two bounded searches; ``unbounded=False`` (``--bounded-only``) is the bounded search alone."""

from __future__ import annotations

import yaml

from checker.api import run_diff
from checker.policy import Policy
from tests.helpers import POLICIES


def _pair() -> tuple[Policy, Policy]:
    doc = yaml.safe_load((POLICIES / "vllm_v1.yaml").read_text())
    old = Policy.model_validate(doc)
    doc["batch"]["max_num_seqs"] = 2  # within reach of 2 slots (256 -> 128 is not: decided on OLD alone, test_limits)
    return old, Policy.model_validate(doc)


def test_a_one_knob_change_is_decided_by_the_proof_on_both_sides():
    old, new = _pair()
    report = run_diff(old, new, invariants=["seq_cap", "decode_progress"], requests=2, depth=2, timeout_s=60,
                      out_dir=None, audit=False)
    seq_cap, progress = report.properties
    assert (seq_cap.old_verdict, seq_cap.new_verdict, seq_cap.change.value) == ("PROVED", "PROVED", "equivalent")
    assert seq_cap.strength == "both PROVED for any number of iterations"
    assert progress.old_verdict != "PROVED"  # not covered by the action-wise proof: the bounded search alone
    assert any("batch.max_num_seqs: 256 -> 2" in line for line in report.changed_fields)


def test_bounded_only_is_the_bounded_search_alone():
    old, new = _pair()
    report = run_diff(old, new, invariants=["seq_cap"], requests=2, depth=2, timeout_s=60, out_dir=None,
                      audit=False, unbounded=False)
    (seq_cap,) = report.properties
    assert (seq_cap.old_verdict, seq_cap.new_verdict) == ("HOLDS_UP_TO", "HOLDS_UP_TO")
