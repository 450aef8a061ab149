"""The router's choices, hand-traced: round-robin order around replicas it may not use, least outstanding and
least KV load as the (possibly stale, possibly frozen) view shows them, prefix-aware with and without its load
cap, session affinity. Ties go to the lowest index."""

from __future__ import annotations

from checker.fleet.router import Router
from checker.fleet.spec import Router as RouterSpec

A = ((5_000_000, 600),)  # a prompt of 600 tokens of prefix group 5
A_LONGER = ((5_000_000, 900),)  # the same group, longer: shares A's 600 tokens
B = ((7_000_000, 600),)


def router(**spec) -> Router:
    return Router(RouterSpec(**spec), 3)


def test_round_robin_skips_the_replicas_it_may_not_use():
    r = router(strategy="round_robin")
    assert [r.choose(None, [0, 1, 2], 0) for _ in range(4)] == [0, 1, 2, 0]
    assert [r.choose(None, [0, 2], 0) for _ in range(3)] == [2, 0, 2]  # after 0 comes 1, not usable: 2


def test_least_outstanding_ties_to_the_lowest_index():
    r = router(strategy="least_outstanding")
    r.views[0].record(0, 2, 0.0)
    r.views[1].record(0, 1, 0.0)
    r.views[2].record(0, 1, 0.0)
    assert r.choose(None, [0, 1, 2], 0) == 1
    assert r.choose(None, [0, 2], 0) == 2


def test_a_stale_view_sees_the_load_as_it_was():
    r = router(strategy="least_outstanding", staleness_ms=1)
    r.views[0].record(10_000, 3, 0.0)  # replica 0 has 3 outstanding from t = 10 ms
    assert r.choose(None, [0, 1], 10_500) == 0  # seen as of 9.5 ms: 0 outstanding, a tie
    assert r.choose(None, [0, 1], 11_000) == 1  # seen as of 10 ms: 3 against 0


def test_a_lost_view_stays_as_it_was_when_lost():
    r = router(strategy="least_outstanding")
    r.views[0].record(1_000, 1, 0.0)
    r.frozen[0] = 2_000
    r.views[0].record(3_000, 0, 0.0)  # the replica drained, but the router no longer hears of it
    r.views[1].record(3_000, 0, 0.0)
    assert r.choose(None, [0, 1], 4_000) == 1
    del r.frozen[0]
    assert r.choose(None, [0, 1], 4_000) == 0


def test_least_kv_load_reads_the_share_of_the_pool():
    r = router(strategy="least_kv_load")
    r.views[0].record(0, 0, 0.5)
    r.views[1].record(0, 5, 0.2)
    r.views[2].record(0, 1, 0.2)
    assert r.choose(None, [0, 1, 2], 0) == 2  # 0.2 twice: then fewer outstanding


def test_prefix_aware_follows_the_prefix_until_the_cap():
    r = router(strategy="prefix_aware")
    assert r.choose(A, [0, 1, 2], 0) == 0  # nothing sent yet: least outstanding, lowest index
    r.views[0].record(0, 5, 0.0)
    assert r.choose(A_LONGER, [0, 1, 2], 0) == 0  # shares 600 tokens with what replica 0 got
    assert r.choose(B, [0, 1, 2], 0) == 1  # no shared prefix: least outstanding
    assert r.choose(None, [0, 1, 2], 0) == 1  # own tokens: least outstanding
    capped = router(strategy="prefix_aware", load_cap=5)
    assert capped.choose(A, [0, 1, 2], 0) == 0
    capped.views[0].record(0, 5, 0.0)
    assert capped.choose(A_LONGER, [0, 1, 2], 0) == 1  # replica 0 at its cap: least outstanding instead
    assert capped.choose(A, [0, 1, 2], 0) == 1  # and replica 1 now holds the prefix too


def test_session_affinity_keeps_a_conversation_on_its_replica():
    r = router(strategy="session_affinity")
    first, second = ((9_000_000, 100),), ((9_000_000, 100), (42_000_000, 50))  # turn 2 extends turn 1
    assert r.choose(first, [0, 1, 2], 0) == 0
    r.views[0].record(0, 9, 0.0)
    assert r.choose(second, [0, 1, 2], 0) == 0
    assert r.choose(B, [0, 1, 2], 0) == 1
    assert r.choose(second, [1, 2], 0) == 1  # its replica is out: the least outstanding, remembered from now on
    assert r.choose(second, [0, 1, 2], 0) == 1
