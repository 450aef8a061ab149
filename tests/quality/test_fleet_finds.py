"""A planted fleet find: clients that retry a failure at once, with no jitter and no budget, amplify a lost
replica's load past the fleet's retry-amplification bound (spec/fleets/lost_replica_retry_storm.yaml). The fleet
search finds it and shrinks it to one request sent to a replica lost and not yet noticed, retried at once; the
minimal trace is checked in (counterexamples/fleet/) and replays VIOLATED; the fix (backoff with jitter and retry
budgets, lost_replica_retry_budget.yaml) holds on it, on the whole workload, and on the search's examples."""

from __future__ import annotations

from checker.cli import main
from checker.fleet.run import replay_fleet, run_fleet
from checker.fleet.search import fleet_search
from tests.helpers import ROOT

FLEETS = ROOT / "spec" / "fleets"
STORM, FIX = FLEETS / "lost_replica_retry_storm.yaml", FLEETS / "lost_replica_retry_budget.yaml"
CEX = ROOT / "counterexamples" / "fleet" / "lost_replica_retry_storm__retry_amplification__66ea7d27.json"
# short requests (the search's examples run in milliseconds), with the classes the fleet's SLO file names
SHORT = """name: short_chat
seed: 1
duration_s: 5
classes:
  - name: interactive
    arrival: {process: poisson, rate_per_s: 20}
    prompt_tokens: {dist: uniform, low: 16, high: 200}
    output_tokens: {dist: uniform, low: 2, high: 20}
  - name: background
    arrival: {process: poisson, rate_per_s: 2}
    prompt_tokens: {dist: uniform, low: 100, high: 400}
    output_tokens: {dist: uniform, low: 2, high: 20}
"""


def verdict(run, name: str) -> str:
    return next(f.verdict for f in run.findings if f.prop.name == name)


def test_the_checked_in_minimal_storm_replays_violated_and_the_fix_holds_on_it(capsys):
    storm = replay_fleet(STORM, CEX)
    assert verdict(storm, "retry_amplification") == "VIOLATED"
    assert storm.summary["offered"] == {"unique_requests": 1, "attempts": 2, "first": 1, "retry": 1, "reroute": 0,
                                        "retry_amplification": 2.0}
    [rec] = storm.result.records
    first, retry = (storm.result.attempts[a] for a in rec.attempts)
    assert (first.replica, first.outcome, retry.sent_us, retry.replica) == (0, "replica_lost", 0, 1)
    fixed = replay_fleet(FIX, CEX)
    assert verdict(fixed, "retry_amplification") == "HOLDS"
    # the price of the budget: with one request sent, 4 % of it allows no retry, and the request is lost
    assert fixed.summary["overall"]["lost_by_reason"] == {"replica_lost": 1}
    assert main(["fleet", str(STORM), "--replay", str(CEX)]) == 1
    assert main(["fleet", str(FIX), "--replay", str(CEX)]) == 1  # interactive_lost: its one request is lost
    capsys.readouterr()


def test_on_the_workload_the_storm_passes_the_bound_and_the_fix_does_not():
    storm, fixed = run_fleet(STORM, limit=120), run_fleet(FIX, limit=120)
    assert storm.summary["offered"]["retry_amplification"] > 1.05 >= fixed.summary["offered"]["retry_amplification"]
    assert storm.summary["offered"]["retry"] > 4 * fixed.summary["offered"]["retry"]


def short_workload(tmp_path):
    workload = tmp_path / "short.yaml"
    workload.write_text(SHORT)
    return workload


def test_the_search_finds_the_storm_and_shrinks_it(tmp_path):
    [found] = fleet_search(STORM, short_workload(tmp_path), max_examples=60, time_budget_s=120, max_requests=3, seed=1,
                           only=["retry_amplification"], out_dir=tmp_path)
    assert found.violated and len(found.requests.specs) == 1 and len(found.faults) == 1
    assert found.faults[0].kind == "lost" and found.outcome.observed == 2.0
    assert found.counterexample is not None and found.counterexample.exists()


def test_the_search_finds_no_storm_in_the_fix(tmp_path):
    [clean] = fleet_search(FIX, short_workload(tmp_path), max_examples=25, time_budget_s=120, max_requests=6,
                           only=["retry_amplification"])
    assert not clean.violated and clean.examples > 0


def test_fuzz_fleet_is_the_fleet_search(tmp_path, capsys):
    import json

    argv = ["--fleet", str(STORM), "--workload", str(short_workload(tmp_path)), "--property", "retry_amplification",
            "--max-examples", "60", "--time-budget", "120", "--max-requests", "3", "--seed", "1", "--json",
            "--database", "none"]
    assert main(["fuzz", *argv, "--out", str(tmp_path / "a")]) == 1
    doc = json.loads(capsys.readouterr().out)
    [found] = doc["results"]
    assert (found["verdict"], found["requests"], found["faults"], found["observed"]) == ("VIOLATED", 1, 1, 2.0)
    assert main(["fleet", str(STORM), "--search", *argv[2:-2], "--out", str(tmp_path / "b")]) == 1
    same = json.loads(capsys.readouterr().out)["results"][0]
    assert {k: v for k, v in same.items() if k not in ("seconds", "counterexample")} == \
        {k: v for k, v in found.items() if k not in ("seconds", "counterexample")}
    assert main(["fleet", str(FIX), "--replay", found["counterexample"]]) == 1  # the budget holds; the request is lost
    assert "HOLDS     retry_amplification" in capsys.readouterr().out


def test_the_property_searches_on_two_processes_find_what_they_find_one_after_the_other(tmp_path):
    def found(**how) -> list[dict]:
        results = fleet_search(STORM, short_workload(tmp_path), max_examples=60, time_budget_s=120, max_requests=3,
                               seed=1, out_dir=tmp_path / str(len(how)), **how)
        return [{k: v for k, v in r.as_json().items() if k not in ("seconds", "counterexample")} |
                {"saved": r.counterexample.name if r.counterexample else None} for r in results]

    serial, two = found(), found(jobs=2)
    assert two == serial and len(serial) == 5
    assert any(r["verdict"] == "VIOLATED" for r in serial)


def test_fuzz_fleet_on_two_processes_and_on_dask_finds_what_it_finds_one_after_the_other(tmp_path, capsys):
    import json

    import pytest

    argv = ["fuzz", "--fleet", str(STORM), "--workload", str(short_workload(tmp_path)), "--property",
            "retry_amplification", "--property", "every_request_accounted", "--max-examples", "30", "--time-budget",
            "240", "--max-requests", "3", "--seed", "1", "--json", "--database", "none"]

    def found(*how: str) -> list[dict]:
        assert main([*argv, "--out", str(tmp_path / str(len(how))), *how]) == 1
        return [{k: v for k, v in r.items() if k not in ("seconds", "counterexample")} |
                {"saved": r["counterexample"] and r["counterexample"].rsplit("/", 1)[-1]}
                for r in json.loads(capsys.readouterr().out)["results"]]

    def children_cpu() -> float:
        return os.times().children_user + os.times().children_system

    import os

    before = children_cpu()
    serial = found()
    assert [r["verdict"] for r in serial] == ["VIOLATED", "NO_COUNTEREXAMPLE"] and children_cpu() == before
    assert found("--jobs", "2") == serial and children_cpu() > before  # the searches ran in worker processes
    distributed = pytest.importorskip("distributed", reason="Dask distributed (batchcheck[scale]) is not installed")
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster, \
            distributed.Client(cluster) as watching, distributed.get_task_stream(client=watching) as stream:
        assert found("--scheduler", cluster.scheduler_address) == serial
    assert len(stream.data) == 2  # one Dask task per property, run on the cluster
