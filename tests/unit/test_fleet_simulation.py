"""The fleet simulation: a 1-replica fleet with no faults and no retries is the plain engine, request by request;
a run is deterministic; faults and retries land at the times the spec declares (hand-traced)."""

from __future__ import annotations

from pathlib import Path

import pytest

from checker.engine import simulate
from checker.fleet.metrics import summarize_fleet
from checker.fleet.simulation import simulate_fleet
from checker.fleet.spec import load_fleet
from checker.requests import RequestSpec
from checker.traces import RequestSet, load_requests
from tests.helpers import POLICIES, WORKLOADS


def fleet_file(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "fleet.yaml"
    path.write_text("format: batchcheck-fleet\n" + body)
    return path


@pytest.mark.parametrize("policy,workload,limit", [
    ("vllm_v1.yaml", "chat_mixed.yaml", 150),
    ("prefix_caching/vllm_v1.yaml", "shared_prefixes.yaml", 80),
    ("sglang/sglang_v05.yaml", "chat_mixed.yaml", 80),
    ("tiered_shedding.yaml", "tiered_overload_2x.yaml", 150),
    ("priority_aging.yaml", "chat_mixed.yaml", 80),
    ("connector/vllm_v1_decode_node.yaml", "disaggregated_decode.yaml", 80),
])
def test_one_replica_without_faults_is_the_engine_request_by_request(tmp_path, policy, workload, limit):
    path = fleet_file(tmp_path, f"replicas:\n  - {{name: r, policy: {POLICIES / policy}}}\n")
    fleet = load_fleet(path)
    rs = load_requests(workload=WORKLOADS / workload, limit=limit)
    result = simulate_fleet(fleet, rs)
    life = result.nodes[0].life
    for fast in (False, True):
        plain = simulate(fleet.replicas[0].policy, rs, fleet.replicas[0].profile, fast_forward=fast)
        for rec in result.records:
            [a] = rec.attempts
            rid = result.attempts[a].rid
            mine, theirs = life.state.requests[rid], plain.state.requests[rec.index]
            assert (mine.status, mine.reason, mine.num_generated, mine.num_preemptions) == \
                (theirs.status, theirs.reason, theirs.num_generated, theirs.num_preemptions), rec.index
            for slot in ("first_scheduled", "first_token", "done", "max_gap", "tokens_scheduled"):
                assert getattr(life.times, slot)[rid] == getattr(plain.times, slot)[rec.index], (rec.index, slot)
    summary = summarize_fleet(result)
    assert summary["offered"]["retry_amplification"] == 1.0
    assert summary["overall"]["finished"] == sum(r.status.name == "FINISHED" for r in plain.state.requests)


def test_the_same_inputs_give_the_same_run(tmp_path):
    path = fleet_file(tmp_path, f"""replicas:
  - {{name: r, policy: {POLICIES / 'vllm_v1.yaml'}, count: 3}}
router: {{strategy: least_outstanding, staleness_ms: 200}}
clients:
  - {{name: c, timeout_ms: 400, max_retries: 2, backoff: {{initial_ms: 50, jitter: full, seed: 3}}}}
faults:
  - {{kind: lost, replica: r-1, at_ms: 20000, rule: reroute, recover_after_ms: 10000, warmup_ms: 5000,
     warmup_factor: 3}}
  - {{kind: slow, replica: r-0, start_ms: 5000, end_ms: 15000, factor: 4}}
""")
    rs = load_requests(workload=WORKLOADS / "chat_mixed.yaml", limit=120)
    a, b = (summarize_fleet(simulate_fleet(load_fleet(path), rs)) for _ in range(2))
    a["engine"].pop("wall_s"), b["engine"].pop("wall_s")
    assert a == b
    assert a["offered"]["retry"] > 0 and a["offered"]["reroute"] > 0


def test_a_request_arriving_during_an_idle_replicas_last_step_waits_for_its_end(tmp_path):
    path = fleet_file(tmp_path, f"replicas:\n  - {{name: r, policy: {POLICIES / 'vllm_v1.yaml'}}}\n")
    fleet = load_fleet(path)
    policy, profile = fleet.replicas[0].policy, fleet.replicas[0].profile
    alone = simulate(policy, RequestSet([RequestSpec(0, 0, 100, 1, 1)], ["default"], ["default"], "hand"), profile)
    step_end = alone.times.done[0]  # the one step that prefills and finishes it
    rs = RequestSet([RequestSpec(0, 0, 100, 1, 1), RequestSpec(1, step_end // 2, 100, 1, 1)], ["default"],
                    ["default"], "hand")
    plain, result = simulate(policy, rs, profile), simulate_fleet(fleet, rs)
    assert [r.first_token_us for r in result.records] == plain.times.first_token
    assert result.records[1].first_token_us == 2 * step_end  # its step starts when the first one ends
