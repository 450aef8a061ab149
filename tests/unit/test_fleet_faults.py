"""Retries, backoff and fault timing in the fleet loop, hand-traced on one or two requests: the times are the
plain engine's (its step times from the profile) moved by exactly what the fault or the client declares."""

from __future__ import annotations

from pathlib import Path

from checker.engine import simulate
from checker.fleet.clients import Budget, backoff_us
from checker.fleet.metrics import summarize_fleet
from checker.fleet.simulation import simulate_fleet
from checker.fleet.spec import Backoff, RetryBudget, load_fleet
from checker.requests import RequestSpec
from checker.traces import RequestSet
from tests.helpers import POLICIES


def requests(*rows: tuple[float, int, int]) -> RequestSet:
    """(arrival_ms, prompt, output) rows, one class."""
    return RequestSet([RequestSpec(i, round(t * 1000), p, o, o) for i, (t, p, o) in enumerate(rows)],
                      ["default"], ["default"], "hand")


def fleet(tmp_path: Path, body: str, policy: str = "vllm_v1.yaml", count: int = 1):
    path = tmp_path / "fleet.yaml"
    path.write_text(f"format: batchcheck-fleet\nreplicas:\n  - {{name: r, policy: {POLICIES / policy}, "
                    f"count: {count}}}\n" + body)
    return load_fleet(path)


def plain_first_token(f, rs: RequestSet) -> int:
    return simulate(f.replicas[0].policy, rs, f.replicas[0].profile).times.first_token[0]


# ----------------------------------------------------------------------------------------- backoff and budgets
def test_backoff_grows_and_caps_and_its_jitter_is_seeded():
    b = Backoff(initial_ms=100, multiplier=2, max_ms=300)
    assert [backoff_us(b, 7, k) for k in (1, 2, 3, 4)] == [100_000, 200_000, 300_000, 300_000]
    full = Backoff(initial_ms=100, multiplier=2, max_ms=300, jitter="full", seed=1)
    draws = [backoff_us(full, 7, k) for k in (1, 2, 3)]
    assert draws == [backoff_us(full, 7, k) for k in (1, 2, 3)]  # the same seed, request and retry: the same wait
    assert all(0 <= d <= cap for d, cap in zip(draws, (100_000, 200_000, 300_000)))
    assert draws != [backoff_us(full, 8, k) for k in (1, 2, 3)]  # another request: other waits
    equal = Backoff(initial_ms=100, jitter="equal", seed=1)
    assert 50_000 <= backoff_us(equal, 7, 1) <= 100_000


def test_a_budget_allows_min_retries_plus_its_ratio_of_requests_sent():
    b = Budget(RetryBudget(ratio=0.5, min_retries=1))
    b.sent = 2
    assert b.allows()  # retry 1 of at most 1 + 0.5 * 2
    b.retries = 1
    assert b.allows()  # retry 2
    b.retries = 2
    assert not b.allows()
    assert Budget(None).allows()


# ----------------------------------------------------------------------------------------- faults
def test_a_slow_window_multiplies_the_step_times_that_start_in_it(tmp_path):
    rs = requests((0, 100, 1))
    base = plain_first_token(fleet(tmp_path, ""), rs)
    f = fleet(tmp_path, "faults:\n  - {kind: slow, replica: r, start_ms: 0, end_ms: 1, factor: 3}\n")
    [rec] = simulate_fleet(f, rs).records
    assert rec.first_token_us == round(base * 3) and rec.outcome == "finished"
    late = fleet(tmp_path, "faults:\n  - {kind: slow, replica: r, start_ms: 0.001, end_ms: 1, factor: 3}\n")
    assert simulate_fleet(late, rs).records[0].first_token_us == base  # its step started before the window


def test_a_lost_replica_fails_its_requests_at_the_loss(tmp_path):
    rs = requests((0, 2000, 200))
    f = fleet(tmp_path, "faults:\n  - {kind: lost, replica: r, at_ms: 500, rule: fail}\n")
    result = simulate_fleet(f, rs)
    [rec] = result.records
    assert (rec.outcome, rec.done_us, rec.retries) == ("replica_lost", 500_000, 0)
    summary = summarize_fleet(result)
    assert summary["overall"]["lost_by_reason"] == {"replica_lost": 1}
    assert summary["faults"] == [{"fault": 0, "kind": "lost", "replica": "r", "at_ms": 500.0, "recovery_ms": {},
                                  "until_end_ms": 2.491, "rule": "fail"}]


def test_reroute_sends_the_requests_again_from_scratch_at_the_loss(tmp_path):
    rs = requests((0, 2000, 200))
    f = fleet(tmp_path, "faults:\n  - {kind: lost, replica: r-0, at_ms: 500, rule: reroute}\n", count=2)
    result = simulate_fleet(f, rs)
    [rec] = result.records
    first, second = (result.attempts[a] for a in rec.attempts)
    assert (first.replica, first.outcome, first.end_us) == (0, "replica_lost", 500_000)
    assert (second.kind, second.replica, second.sent_us, second.outcome) == ("reroute", 1, 500_000, "finished")
    alone = plain_first_token(f, rs)  # the request alone from t = 0 on a fresh replica
    assert second.first_token_us == 500_000 + alone and rec.reroutes == 1 and rec.retries == 0
    assert rec.first_token_us == alone  # its client had its first token before the loss: its TTFT stands
    assert summarize_fleet(result)["offered"]["retry_amplification"] == 2.0


def test_before_the_router_notices_what_it_sends_there_fails_at_once_and_is_retried(tmp_path):
    rs = requests((100, 100, 1), (200, 100, 1))
    f = fleet(tmp_path, "faults:\n  - {kind: lost, replica: r-0, at_ms: 0, detect_ms: 150}\n"
                        "clients:\n  - {name: c, max_retries: 1}\n", count=2)
    result = simulate_fleet(f, rs)
    a, b = result.records
    # request 0 at 100 ms: round-robin sends it to r-0 (lost, not yet noticed): it fails at once; the retry, at
    # once too (no backoff), goes to r-1. Request 1 at 200 ms: r-0 is known lost by then: r-1.
    assert [(result.attempts[i].replica, result.attempts[i].sent_us, result.attempts[i].outcome)
            for i in a.attempts] == [(0, 100_000, "replica_lost"), (1, 100_000, "finished")]
    assert [result.attempts[i].replica for i in b.attempts] == [1]
    assert a.retries == 1 and summarize_fleet(result)["offered"]["retry"] == 1


def test_a_recovered_replica_starts_empty_and_warms_up(tmp_path):
    rs = requests((0, 100, 1), (2000, 100, 1))
    f = fleet(tmp_path, "faults:\n  - {kind: lost, replica: r, at_ms: 500, recover_after_ms: 1000, warmup_ms: 1000, "
                        "warmup_factor: 2}\n")
    result = simulate_fleet(f, rs)
    base = plain_first_token(f, requests((0, 100, 1)))
    a, b = result.records
    assert a.first_token_us == base and a.outcome == "finished"  # done long before the loss
    assert b.first_token_us == 2000_000 + round(base * 2)  # back at 1.5 s, warming up until 2.5 s
    assert len(result.nodes[0].lives) == 2 and result.attempts[b.attempts[0]].incarnation == 1


def test_a_timeout_cancels_the_attempt_and_backs_off_before_the_retry(tmp_path):
    rs = requests((0, 4000, 10))
    base = plain_first_token(fleet(tmp_path, ""), rs)
    timeout_ms = base / 2000  # half the time to the first token
    f = fleet(tmp_path, f"clients:\n  - {{name: c, timeout_ms: {timeout_ms}, max_retries: 2, "
                        "backoff: {initial_ms: 10}}\n")
    result = simulate_fleet(f, rs)
    [rec] = result.records
    sends = [result.attempts[a].sent_us for a in rec.attempts]
    timeout = round(timeout_ms * 1000)
    assert sends == [0, timeout + 10_000, 2 * timeout + 10_000 + 20_000]
    assert [result.attempts[a].outcome for a in rec.attempts] == ["timeout"] * 3
    assert (rec.outcome, rec.done_us, rec.retries) == ("timeout", sends[-1] + timeout, 2)
    give_up = fleet(tmp_path, f"clients:\n  - {{name: c, timeout_ms: {timeout_ms}, on_timeout: give_up, "
                              "max_retries: 2}\n")
    [rec] = simulate_fleet(give_up, rs).records
    assert (rec.outcome, rec.done_us, rec.retries) == ("timeout", timeout, 0)


def test_rejections_retried_at_once_are_rejected_again_until_the_retries_or_budget_run_out(tmp_path):
    rs = requests((0, 100, 50), (0, 100, 50), (0, 100, 50))
    group = f"replicas:\n  - {{name: r, policy: {POLICIES / 'tgi_router.yaml'}, set: ['admission.max_inflight=1']}}\n"
    storm = tmp_path / "storm.yaml"
    storm.write_text("format: batchcheck-fleet\n" + group + "clients:\n  - {name: c, max_retries: 4}\n")
    s = summarize_fleet(simulate_fleet(load_fleet(storm), rs))
    # one admitted; the other two rejected (overloaded) at t = 0, each retried at once and rejected again at the
    # next steps, 4 times
    assert s["offered"]["retry"] == 8 and s["overall"]["lost_by_reason"] == {"rejected:overloaded": 2}
    assert s["offered"]["retry_amplification"] == round(11 / 3, 4)
    storm.write_text(storm.read_text() + "global_retry_budget: {ratio: 0, min_retries: 3}\n")
    s = summarize_fleet(simulate_fleet(load_fleet(storm), rs))
    assert s["offered"]["retry"] == 3 and s["overall"]["retries_denied_by_budget"] == 2


def test_a_lost_view_makes_the_router_send_everything_to_the_replica_it_thinks_idle(tmp_path):
    rs = requests((1, 100, 300), (2, 100, 300), (3, 100, 300))
    plain = fleet(tmp_path, "router: {strategy: least_outstanding}\n", count=2)
    result = simulate_fleet(plain, rs)
    assert [result.attempts[r.attempts[0]].replica for r in result.records] == [0, 1, 0]  # a tie at 1 each: r-0
    blind = fleet(tmp_path, "router: {strategy: least_outstanding}\n"
                            "faults:\n  - {kind: view_lost, replica: r-0, start_ms: 0, end_ms: 10}\n", count=2)
    result = simulate_fleet(blind, rs)
    assert [result.attempts[r.attempts[0]].replica for r in result.records] == [0, 0, 0]  # r-0 seen as at 0 ms: idle
    stale = fleet(tmp_path, "router: {strategy: least_outstanding, staleness_ms: 5}\n", count=2)
    result = simulate_fleet(stale, rs)
    assert [result.attempts[r.attempts[0]].replica for r in result.records] == [0, 0, 0]  # no load seen before 5 ms
