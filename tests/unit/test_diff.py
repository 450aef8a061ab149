"""diff's pieces: the classification table, changed fields, the SLO tolerance."""

from __future__ import annotations

import pytest

from checker.api import load_policy
from checker.diff.compare import Change, classify
from checker.diff.run import changed_fields
from checker.diff.slo import Tolerance
from tests.helpers import POLICIES


@pytest.mark.parametrize("new_worse,old_worse,change", [
    (False, False, Change.EQUIVALENT),
    (True, False, Change.LESS_SAFE),
    (False, True, Change.SAFER),
    (True, True, Change.INCOMPARABLE),
    (True, None, Change.UNKNOWN),
    (None, True, Change.UNKNOWN),
    (None, False, Change.UNKNOWN),
    (None, None, Change.UNKNOWN),
])
def test_classification_from_witnesses_each_way(new_worse, old_worse, change):
    assert classify(new_worse, old_worse) is change


def test_changed_fields_name_each_rule_that_differs():
    old, new = load_policy(POLICIES / "vllm_v1.yaml"), load_policy(POLICIES / "broken" / "vllm_v1_small_pool.yaml")
    assert changed_fields(old, new) == ["kv.num_blocks: 2500 -> 32", "max_model_len: 16384 -> 1024"]
    assert changed_fields(old, old) == []


@pytest.mark.parametrize("a,b,worse", [
    (130.0, 100.0, True),  # 30 % and 30 ms above
    (119.0, 100.0, False),  # 19 %: within the threshold
    (1.4, 0.4, False),  # 3.5x, but not more than 1 above 0.4 * 1.2: within the absolute slack
    (2.0, None, True),  # the other policy observed nothing (e.g. no such request finished)
    (None, 5.0, False),
])
def test_worse_needs_both_the_relative_and_the_absolute_margin(a, b, worse):
    assert Tolerance(0.2, 1.0).worse(a, b) is worse
