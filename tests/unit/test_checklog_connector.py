"""check-log on a KV connector's logs (tests/vllm_connector_driver.py: each line says, in ``held``, what every request
that is not running holds): the pool is accounted request by request, so request_conservation, cancellation_releases,
finished_releases and no_hold_and_wait are checked on real vLLM connector logs; a leak shows; the streaming
checker gives the reference path's verdicts on every recorded fact log, mutated or not."""

from __future__ import annotations

import json

import pytest

from checker import checklog as cl
from tests.connector_logs import policy_for
from tests.unit.test_checklog_stream import SPECS, assert_same
from tests.vllm_connector_harness import FACT_CASES, FIXTURES

CONNECTOR_SPECS = ["request_conservation", "cancellation_releases:steps=1", "cancellation_releases:steps=4",
                   "finished_releases:steps=2", "finished_releases:steps=5", "no_hold_and_wait:steps=3",
                   "kv_never_overcommitted", "scheduled_requests_run", "no_deadlock"]


def _case(tmp_path, name, mutate=None):
    rows, flags = FACT_CASES[name]
    lines = [json.loads(line) for line in (FIXTURES / f"{name}.log.jsonl").read_text().splitlines()]
    if mutate:
        mutate(lines)
    arrivals_path = tmp_path / f"{name}.arrivals.json"
    arrivals_path.write_text(json.dumps(rows))
    log = tmp_path / f"{name}.log.jsonl"
    log.write_text("".join(json.dumps(line) + "\n" for line in lines))
    arrivals = cl.load_arrivals(arrivals_path)
    return policy_for(flags, name), arrivals, cl.load_log(log, arrivals), arrivals_path, log


def _leak_after_abort(lines):
    """The blocks of request "a" (aborted while loading) stay held two steps longer than the real scheduler kept
    them (the free count says so too)."""
    freed = next(k for k, line in enumerate(lines) if k and "a" not in line["held"] and "a" in lines[k - 1]["held"])
    for line in lines[freed:freed + 2]:
        line["held"]["a"] = lines[freed - 1]["held"]["a"]
        line["free_blocks"] -= line["held"]["a"]


def _free_off_by_one(lines):
    lines[len(lines) // 2]["free_blocks"] -= 1


UNCACHED = sorted(name for name, (_, flags) in FACT_CASES.items() if "--enable-prefix-caching" not in flags)


@pytest.mark.parametrize("name", UNCACHED)
def test_every_recorded_connector_log_passes_the_default_check(tmp_path, name):
    policy, arrivals, steps, arrivals_path, log = _case(tmp_path, name)
    names = cl.default_invariants(policy)
    result = cl.run_check_log(policy, log, arrivals_path)
    expected = {"producer": None, "pinned_shared": None}.get(name)
    assert result.violation is expected, (names, result.violation)
    assert not result.notes, result.notes  # nothing left unchecked, no count disagrees with the line


@pytest.mark.parametrize("name", UNCACHED)
@pytest.mark.parametrize("mutate", [None, _free_off_by_one])
def test_the_streaming_checker_gives_the_reference_verdicts_on_connector_logs(tmp_path, name, mutate):
    policy, arrivals, steps, _, _ = _case(tmp_path, name, mutate)
    assert_same(policy, arrivals, steps, CONNECTOR_SPECS + [s for s in SPECS if s.startswith(("no_hold", "finished"))])


def test_the_real_schedulers_releases_pass_the_tightest_bounds_they_meet(tmp_path):
    """A loaded request aborted while it waits is freed at once (vLLM 0.33): cancellation_releases:0 holds; an
    aborted load is freed when its report comes, two log steps after the abort: :2 holds and :1 fails."""
    policy, _, _, arrivals_path, log = _case(tmp_path, "holder_aborted")
    assert cl.run_check_log(policy, log, arrivals_path, ["cancellation_releases:steps=0"]).violation is None
    policy, _, _, arrivals_path, log = _case(tmp_path, "abort_during_load")
    assert cl.run_check_log(policy, log, arrivals_path, ["cancellation_releases:steps=2"]).violation is None
    assert cl.run_check_log(policy, log, arrivals_path, ["cancellation_releases:steps=1"]).violation.step == 2


def test_a_leak_after_an_abort_during_a_load_is_flagged_with_the_step(tmp_path):
    policy, arrivals, steps, arrivals_path, log = _case(tmp_path, "abort_during_load", _leak_after_abort)
    result = cl.run_check_log(policy, log, arrivals_path, ["cancellation_releases:steps=2", "request_conservation"])
    assert (result.violation.invariant, result.violation.step) == ("cancellation_releases", 3)


def test_a_free_count_that_does_not_match_what_requests_hold_breaks_request_conservation(tmp_path):
    policy, arrivals, steps, arrivals_path, log = _case(tmp_path, "holder_blocks", _free_off_by_one)
    result = cl.run_check_log(policy, log, arrivals_path, ["request_conservation"])
    assert result.violation.invariant == "request_conservation"
