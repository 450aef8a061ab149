"""Scale-out: the same campaign (verify, fuzz, liveness) on a Dask LocalCluster (two worker processes) gives the serial verdicts."""

from __future__ import annotations

from distributed import Client, LocalCluster

from checker.api import run_ci
from tests.unit.ci_sample import make_project

CAMPAIGN = """\
policies = ["spec/policies/*.yaml"]
[defaults]
requests = 2
depth = 2
unbounded = false
[[verify]]
invariants = ["token_budget"]
[[verify]]
policies = ["spec/policies/unchecked_growth.yaml"]
invariants = ["kv_never_overcommitted"]
[[verify]]
policies = ["spec/policies/tgi_router.yaml"]
invariants = ["cancellation_releases:0"]
depth = 3
[[fuzz]]
policies = ["spec/policies/vllm_v1.yaml"]
workload = "spec/workloads/chat_mixed.yaml"
slo = "spec/slo/kv_safety.slo.yaml"
max_examples = 5
time_budget_s = 5
[[liveness]]
policies = ["spec/policies/vllm_v1.yaml"]
requests = 1
"""


def _verdicts(outcome) -> list[tuple[str, str, str]]:
    return [(f.check.policy.shown, f.check.label, f.result.verdict) for f in outcome.findings]


def test_a_dask_local_cluster_gives_the_serial_verdicts(tmp_path):
    config = make_project(tmp_path, CAMPAIGN)
    serial = run_ci(config, jobs=1)
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        distributed = run_ci(config, scheduler=cluster.scheduler_address)  # as --scheduler tcp://... does
        tasks_per_worker = client.run(lambda dask_worker: len(dask_worker.data) + dask_worker.state.executed_count)
    assert len(tasks_per_worker) == 2 and all(n > 0 for n in tasks_per_worker.values())  # both workers ran checks
    assert _verdicts(distributed) == _verdicts(serial)
    # one request in flight never reaches vLLM's limits: the liveness findings are VACUOUS, not PROVED
    assert {v for _, _, v in _verdicts(serial)} == {"VIOLATED", "HOLDS_UP_TO", "NO_COUNTEREXAMPLE", "VACUOUS"}
    assert [label for _, label, _ in _verdicts(serial)][-3:] == [  # one liveness task, three findings
        "eventually_served(requests=1)", "no_livelock(requests=1)", "no_deadlock(requests=1)"]
    assert distributed.exit_code == serial.exit_code == 1
    assert distributed.where == f"Dask cluster at {cluster.scheduler_address}"
    fingerprints = [f.fingerprint for f in serial.findings]
    assert [f.fingerprint for f in distributed.findings] == fingerprints
