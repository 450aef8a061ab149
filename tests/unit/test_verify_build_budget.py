"""verify's --timeout covers building the query, not only solving it (issue 23: ``verify --requests 64 --depth 1
--timeout 2`` spent over 200 s in Python building one step's terms): checker/verify/budget.py."""

from __future__ import annotations

import time

import pytest

from checker.api import load_policy
from checker.verify.budget import BuildTimeout, within
from checker.verify.run import run_verify
from tests.helpers import POLICIES


def test_a_block_past_its_time_is_stopped_and_nothing_fires_later():
    started = time.monotonic()
    with pytest.raises(BuildTimeout):
        with within(0.2):
            while True:
                try:
                    sum(range(1000))
                except Exception:  # noqa: BLE001 -- an except Exception on the way does not swallow it
                    pass
    assert time.monotonic() - started < 1.5
    with within(0.2):  # a block that ends in time: no exception then, none later
        pass
    time.sleep(0.5)
    with pytest.raises(BuildTimeout):
        with within(0):
            pass


@pytest.mark.parametrize("invariant", ["token_budget", "kv_never_overcommitted"])
def test_building_64_slots_stops_at_the_timeout(invariant):
    started = time.monotonic()
    _, (checked,) = run_verify(load_policy(POLICIES / "vllm_v1.yaml"), [invariant], requests=64, depth=1,
                               timeout_s=2.0, out_dir=None)
    seconds = time.monotonic() - started
    assert checked.verdict.value == "UNKNOWN", checked.line()
    assert seconds < 2.0 * 1.1 + 1.0, seconds  # the limit's tenth, and the environment's set-up
