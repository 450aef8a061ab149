"""The fleet's quiet decode stretches (checker/fleet/simulation.py: planned at once, applied lazily, cut when
something reaches the replica) give exactly what plain stepping gives: every request's outcome and times, every
attempt, every replica's work and per-request token records, the summary; on every shipped fleet (routers, retries,
timeouts, lost replicas, slow windows, a canary, prefix caching) and on random small fleets."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from checker.fleet.metrics import summarize_fleet
from checker.fleet.run import fleet_requests
from checker.fleet.simulation import simulate_fleet
from checker.fleet.spec import load_fleet
from checker.metrics import RequestTimes
from tests.unit.test_fleet_cli import FLEETS

SHIPPED = sorted(p.name for p in FLEETS.glob("*.yaml") if not p.name.endswith(".slo.yaml"))


def observed(result) -> dict:
    summary = summarize_fleet(result)
    summary["engine"].pop("wall_s")
    summary["engine"].pop("steps")  # counted as in plain stepping; compared per replica below
    return {
        "summary": summary,
        "records": [(r.outcome, r.first_token_us, r.done_us, r.retries, r.reroutes, r.attempts) for r in result.records],
        "attempts": [dataclasses.astuple(a) for a in result.attempts],
        "nodes": [(n.steps, n.busy_us, n.kv_peak, n.clock, len(n.lives), n.livelock,
                   [[list(getattr(life.times, f)) for f in RequestTimes.__slots__] for life in n.lives])
                  for n in result.nodes],
        "steps": result.steps, "end_us": result.end_us,
    }


def both(fleet, requests) -> tuple[dict, dict, int]:
    plain, fast = simulate_fleet(fleet, requests, fast_forward=False), simulate_fleet(fleet, requests)
    return observed(plain), observed(fast), plain.steps


@pytest.mark.parametrize("name", SHIPPED)
def test_stretches_give_plain_stepping_on_every_shipped_fleet(name):
    fleet = load_fleet(FLEETS / name)
    plain, fast, steps = both(fleet, fleet_requests(fleet, None, None, limit=200))
    assert fast == plain
    assert steps > 0


def test_stretches_are_taken_and_cut():
    """Not vacuous: on a fleet with arrivals during stretches, most steps are in stretches and some are cut."""
    from checker.fleet import simulation

    fleet = load_fleet(FLEETS / "mixed_least_outstanding.yaml")
    requests = fleet_requests(fleet, None, None, limit=150)
    counts = {"planned": 0, "cut": 0}
    plan, cut = simulation._Run.plan_stretch, simulation._Run.cut

    def counting_plan(self, node):
        plan(self, node)
        counts["planned"] += node.stretch is not None

    def counting_cut(self, node, t):
        counts["cut"] += node.stretch is not None and t > node.stretch[0]
        cut(self, node, t)

    try:
        simulation._Run.plan_stretch, simulation._Run.cut = counting_plan, counting_cut
        result = simulate_fleet(fleet, requests)
    finally:
        simulation._Run.plan_stretch, simulation._Run.cut = plan, cut
    assert counts["planned"] > 100 and counts["cut"] > 10, counts
    assert result.steps == simulate_fleet(fleet, requests, fast_forward=False).steps


FLEET = """format: batchcheck-fleet
replicas:
  - {{name: a, policy: {policy}, count: {count}, set: ["batch.max_num_seqs={seqs}", "kv.num_blocks={blocks}"]}}
  - {{name: b, policy: vllm_v1, profile: a100-llama-2-70b-tp2}}
router: {{strategy: {strategy}, staleness_ms: {stale}}}
clients:
  - {{name: c, timeout_ms: {timeout}, max_retries: 2, backoff: {{initial_ms: 5, jitter: full}}}}
faults:
  - {{kind: lost, replica: b, at_ms: {lost_at}, rule: {rule}, detect_ms: 50, recover_after_ms: 400}}
  - {{kind: slow, replica: {slow}, start_ms: {slow_at}, end_ms: {slow_end}, factor: 3}}
workload: chat_mixed
"""


@settings(max_examples=12, deadline=None, derandomize=True, database=None)
@given(policy=st.sampled_from(["vllm_v1", "tgi_router", "sarathi_serve", "prefix_caching/vllm_v1", "vtc_fair"]),
       count=st.integers(1, 3), seqs=st.sampled_from([2, 4, 16]), blocks=st.sampled_from([300, 2500]),
       strategy=st.sampled_from(["round_robin", "least_outstanding", "prefix_aware", "session_affinity"]),
       stale=st.sampled_from([0, 30]), timeout=st.sampled_from([800, 60000]), lost_at=st.integers(0, 3000),
       rule=st.sampled_from(["fail", "reroute"]), slow=st.sampled_from(["a-0", "b"]), slow_at=st.integers(0, 3000),
       limit=st.integers(5, 60))
def test_stretches_give_plain_stepping_on_random_fleets(tmp_path_factory, policy, count, seqs, blocks, strategy,
                                                        stale, timeout, lost_at, rule, slow, slow_at, limit):
    path = tmp_path_factory.mktemp("fleet") / "f.yaml"
    slow = "a" if slow == "a-0" and count == 1 else slow
    path.write_text(FLEET.format(policy=policy, count=count, seqs=seqs, blocks=blocks, strategy=strategy, stale=stale,
                                 timeout=timeout, lost_at=lost_at, rule=rule, slow=slow, slow_at=slow_at,
                                 slow_end=slow_at + 700))
    fleet = load_fleet(path)
    plain, fast, _ = both(fleet, fleet_requests(fleet, None, None, limit=limit))
    assert fast == plain


def test_a_request_sent_exactly_at_a_step_start_in_a_stretch_is_taken_by_that_step(tmp_path):
    """Events at a time go before the steps due then: an arrival at the start of a stretch's step is that step's
    (the stretch is cut before it), as in plain stepping."""
    from checker.fleet import simulation
    from checker.requests import RequestSpec
    from checker.traces import RequestSet

    path = tmp_path / "f.yaml"
    path.write_text("format: batchcheck-fleet\nreplicas:\n  - {name: r, policy: vllm_v1}\n")
    fleet = load_fleet(path)
    one = RequestSet([RequestSpec(0, 0, 300, 60, 60, 0, 0, 0)], ["c"], ["t"], "one")
    starts, step = [], simulation._Run.step_node

    def record(self, node, now):
        starts.append(now)
        step(self, node, now)

    try:
        simulation._Run.step_node = record
        simulate_fleet(fleet, one, fast_forward=False)
    finally:
        simulation._Run.step_node = step
    t = starts[30]  # a decode step in the middle of the request's quiet stretch
    two = RequestSet([RequestSpec(0, 0, 300, 60, 60, 0, 0, 0), RequestSpec(1, t, 40, 5, 5, 0, 0, 0)], ["c"], ["t"],
                     "two")
    plain, fast, _ = both(fleet, two)
    assert fast == plain
    assert plain["records"][1][1] is not None


def test_at_the_step_limit_stretches_stop_no_later_than_plain_stepping():
    """Planned steps count against the limit: never more steps than allowed, never a decided run where plain
    stepping is cut off (it may stop a little earlier: UNKNOWN, not a verdict)."""
    fleet = load_fleet(FLEETS / "mixed_least_outstanding.yaml")
    requests = fleet_requests(fleet, None, None, limit=150)
    total = simulate_fleet(fleet, requests, fast_forward=False).steps
    for limit in (50, 2_000, total - 1, total, total + 1):
        plain = simulate_fleet(fleet, requests, limit, fast_forward=False)
        fast = simulate_fleet(fleet, requests, limit)
        assert fast.steps <= limit and plain.steps <= limit
        assert plain.step_limit_hit <= fast.step_limit_hit, limit
    assert not simulate_fleet(fleet, requests, total + 1).step_limit_hit
