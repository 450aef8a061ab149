"""Fleet metrics hand-traced: recovery time per class (a sliding window of arrivals, p99 TTFT against the SLO),
a lost request counted as infinitely late, a cancelled one left out."""

from __future__ import annotations

from types import SimpleNamespace

from checker.fleet.metrics import recovery_ms
from checker.fleet.simulation import RequestRecord
from checker.requests import RequestSpec


def records(ttft_ms: dict[int, float | None], cls: int = 0, cancelled: tuple[int, ...] = ()) -> SimpleNamespace:
    """One request per second at t = 0, 1, ... s with the given TTFT (None: lost)."""
    out = []
    for i, (t, ttft) in enumerate(sorted(ttft_ms.items())):
        rec = RequestRecord(i, RequestSpec(i, t * 1_000_000, 10, 1, 1, cls=cls), 0)
        rec.first_token_us = None if ttft is None else t * 1_000_000 + round(ttft * 1000)
        rec.outcome = "cancelled" if t in cancelled else ("finished" if ttft is not None else "replica_lost")
        out.append(rec)
    return SimpleNamespace(records=out)


def test_recovery_is_from_the_fault_to_the_first_window_back_within_the_slo_for_good():
    # requests at 3 s and 4 s wait 5 s for their first token; a window of 1.5 s holds two arrivals; fault at 2.5 s.
    # Windows ending at 3, 4 and 5 s hold a 5 s TTFT (p99 of two values is the larger); the one ending at 6 s does
    # not: recovered 3.5 s after the fault.
    run = records({t: (5000.0 if t in (3, 4) else 100.0) for t in range(10)})
    assert recovery_ms(run, 0, 2_500_000, 1000.0, 1500.0) == 3500.0


def test_no_window_missing_the_slo_after_the_fault_is_zero_and_one_missing_at_the_end_is_none():
    assert recovery_ms(records({t: 100.0 for t in range(5)}), 0, 1_000_000, 1000.0, 1500.0) == 0.0
    late = records({t: (5000.0 if t == 4 else 100.0) for t in range(5)})
    assert recovery_ms(late, 0, 1_000_000, 1000.0, 1500.0) is None


def test_a_lost_request_is_infinitely_late_and_a_cancelled_one_is_left_out():
    lost = records({0: 100.0, 1: None, 2: 100.0, 3: 100.0})
    # the windows ending at 1 and 2 s hold the lost request, the one ending at 3 s does not: 2.5 s after 0.5 s
    assert recovery_ms(lost, 0, 500_000, 1000.0, 1500.0) == 2500.0
    cancelled = records({0: 100.0, 1: None, 2: 100.0, 3: 100.0}, cancelled=(1,))
    assert recovery_ms(cancelled, 0, 500_000, 1000.0, 1500.0) == 0.0
    assert recovery_ms(lost, 1, 500_000, 1000.0, 1500.0) == 0.0  # another class: nothing to recover
