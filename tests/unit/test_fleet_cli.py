"""The fleet verb: exit codes as docs/cli.md's table says (0 holds, 1 violated, 2 bad input), the shipped
examples' effects, --out written, and a request left stuck on a replica reported as such."""

from __future__ import annotations

import json

from checker.cli import main
from checker.fleet.run import run_fleet
from tests.helpers import POLICIES, ROOT, WORKLOADS

FLEETS = ROOT / "spec" / "fleets"


def test_round_robin_overloads_the_slow_replica_and_least_outstanding_does_not(capsys):
    rr, lo = run_fleet(FLEETS / "mixed_round_robin.yaml", limit=200), run_fleet(FLEETS / "mixed_least_outstanding.yaml",
                                                                              limit=200)
    slow = [r["attempts"] for r in rr.summary["replicas"]], [r["attempts"] for r in lo.summary["replicas"]]
    assert slow[0][2] >= 66 and slow[1][2] < slow[0][2] / 2  # round-robin: a third to the slow replica
    p99 = [run.summary["by_class"]["interactive"]["ttft_ms"]["p99"] for run in (rr, lo)]
    assert p99[0] > 3000 > p99[1]
    assert [f.verdict for f in rr.findings if f.prop.name == "interactive_ttft_p99"] == ["VIOLATED"]
    assert not lo.violated


def test_exit_codes_and_out(capsys, tmp_path):
    assert main(["fleet", "mixed_least_outstanding", "--limit", "40", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "HOLDS     interactive_ttft_p99" in out
    assert f"written: {tmp_path / 'mixed_least_outstanding.fleet.json'}" in out
    doc = json.loads((tmp_path / "mixed_least_outstanding.fleet.json").read_text())
    assert doc["exit_code"] == 0 and doc["offered"]["unique_requests"] == 40
    assert main(["fleet", str(FLEETS / "lost_replica_retry_storm.yaml"), "--limit", "120"]) == 1
    assert "VIOLATED  retry_amplification" in capsys.readouterr().out


def test_usage_errors_exit_2(capsys):
    storm = str(FLEETS / "lost_replica_retry_storm.yaml")
    cex = str(ROOT / "counterexamples" / "fleet" / "lost_replica_retry_storm__retry_amplification__66ea7d27.json")
    for argv, message in (
            (["--search", "--replay", cex], "--search and --replay exclude each other"),
            (["--replay", cex, "--limit", "3"], "--replay runs the counterexample's own requests"),
            (["--search", "--trace", "t.json"], "--search draws requests from a workload's classes"),
            (["--property", "x"], "--property chooses what --search looks for: add --search"),
            (["--jobs", "2"], "--jobs and --scheduler run --search's property searches in parallel: add --search"),
            (["--search", "--jobs", "2", "--scheduler", "tcp://x:1"], "--jobs runs local processes, --scheduler a "
                                                                      "Dask cluster: one of them"),
            (["--search", "--property", "nope"], "--property='nope' (expected a property of the fleet: "
                                                 "interactive_ttft_p99, background_ttft_p99, interactive_lost, "
                                                 "retry_amplification, every_request_accounted)"),
            (["--replay", str(FLEETS / "mixed_round_robin.yaml")],
             f"{FLEETS / 'mixed_round_robin.yaml'}: format='batchcheck-fleet' (expected "
             "'batchcheck-fleet-counterexample' (a fleet counterexample written by batchcheck fleet --search --out))")):
        assert main(["fleet", storm, *argv]) == 2, argv
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err, (argv, err)


def test_a_request_stuck_on_its_replica_is_reported_and_violates_accounting(tmp_path, capsys):
    # vllm_v1 never rejects a request that cannot fit its pool: it sits at the head of the queue for ever
    path = tmp_path / "fleet.yaml"
    path.write_text(f"format: batchcheck-fleet\nreplicas:\n  - {{name: r, policy: {POLICIES / 'vllm_v1.yaml'}, "
                    "set: ['kv.num_blocks=4']}\n")
    trace = tmp_path / "trace.json"
    trace.write_text(json.dumps({"format": "batchcheck-trace", "requests": [
        {"arrival_ms": 0, "prompt_tokens": 200, "output_tokens": 4}]}))
    assert main(["fleet", str(path), "--trace", str(trace)]) == 1
    out = capsys.readouterr().out
    assert "VIOLATED  every_request_accounted      observed 1 > allowed 0" in out and "lost: unfinished 1" in out


def test_a_shipped_fleet_runs_by_name_with_a_workload_given(capsys):
    assert main(["fleet", "mixed_least_outstanding", "--workload", str(WORKLOADS / "chat_mixed.yaml"), "--limit", "20",
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["offered"]["unique_requests"] == 20


def test_a_prefix_aware_router_without_its_cap_overloads_one_replica():
    uncapped, capped = run_fleet(FLEETS / "prefix_uncapped.yaml"), run_fleet(FLEETS / "prefix_capped.yaml")
    sent = [[r["attempts"] for r in run.summary["replicas"]] for run in (uncapped, capped)]
    assert max(sent[0]) > 0.8 * 240 and max(sent[1]) < 0.4 * 240  # the hot prefix's replica, and spread under the cap
    p99 = [run.summary["overall"]["ttft_ms"]["p99"] for run in (uncapped, capped)]
    assert p99[0] > 2000 > p99[1] and uncapped.violated and not capped.violated


def test_a_counterexample_with_faults_on_replicas_the_fleet_lacks_is_refused(tmp_path, capsys):
    cex = ROOT / "counterexamples" / "fleet" / "lost_replica_retry_storm__retry_amplification__66ea7d27.json"
    doc = json.loads(cex.read_text())
    doc["faults"][0]["replica"] = "zz"
    (tmp_path / "c.json").write_text(json.dumps(doc))
    assert main(["fleet", str(FLEETS / "lost_replica_retry_storm.yaml"), "--replay", str(tmp_path / "c.json")]) == 2
    assert (f"{tmp_path / 'c.json'}: faults.0.replica='zz' (expected a replica of the fleet: tgi-0, tgi-1, tgi-2)"
            in capsys.readouterr().err)


def test_a_run_cut_off_at_its_step_limit_decides_nothing():
    from checker.fleet.run import check, fleet_requests
    from checker.fleet.spec import load_fleet

    fleet = load_fleet(FLEETS / "mixed_least_outstanding.yaml")
    run = check(fleet, fleet_requests(fleet, None, None, limit=20), max_steps=50)
    assert run.result.step_limit_hit and not run.decided and not run.violated
    assert {f.verdict for f in run.findings} == {"UNKNOWN"}
    assert check(fleet, fleet_requests(fleet, None, None, limit=20)).decided


def _run_doc(capsys, *argv: str) -> tuple[int, dict]:
    code = main(list(argv))
    doc = json.loads(capsys.readouterr().out)
    doc["engine"].pop("wall_s")
    return code, doc


def test_simulate_fleet_is_the_fleet_verbs_run(capsys):
    fleet = str(FLEETS / "lost_replica_retry_storm.yaml")
    verb = _run_doc(capsys, "fleet", fleet, "--limit", "150", "--json")
    assert verb[0] == 1 and verb[1]["offered"]["retry"] > 0
    assert _run_doc(capsys, "simulate", "--fleet", fleet, "--limit", "150", "--json") == verb
    workload = str(WORKLOADS / "chat_mixed.yaml")
    assert (_run_doc(capsys, "simulate", "--fleet", fleet, "--workload", workload, "--limit", "150", "--json") ==
            _run_doc(capsys, "fleet", fleet, "--workload", workload, "--limit", "150", "--json"))


def test_trace_options_apply_to_the_fleets_trace(capsys):
    code, plain = _run_doc(capsys, "simulate", "--fleet", str(FLEETS / "prefix_capped.yaml"), "--json")
    code2, slow = _run_doc(capsys, "fleet", str(FLEETS / "prefix_capped.yaml"), "--rate-scale", "0.5", "--json")
    assert code == code2 == 0 and plain["offered"]["unique_requests"] == slow["offered"]["unique_requests"] == 240
    assert slow["engine"]["simulated_s"] > 1.8 * plain["engine"]["simulated_s"]  # arrivals twice as far apart
    assert main(["fleet", str(FLEETS / "mixed_least_outstanding.yaml"), "--rate-scale", "2"]) == 2
    assert ("mixed_least_outstanding.yaml: --window/--rate-scale/--class-by-prompt/--class-column='given' (expected a "
            "trace to apply them to: --trace FILE, or a trace: in the fleet file)") in capsys.readouterr().err


def test_simulate_and_fuzz_fleet_refuse_what_the_fleet_file_says(capsys):
    fleet = str(FLEETS / "mixed_least_outstanding.yaml")
    for argv, message in (
            (["simulate", "vllm_v1", "--fleet", fleet], "simulate --fleet takes no POLICY: each replica group names its "
                                                        "policy in the fleet file"),
            (["simulate", "--fleet", fleet, "--profile", "default_linear"], "simulate --fleet takes no --profile"),
            (["simulate", "--fleet", fleet, "--plot", "x.png"], "simulate --fleet takes no --plot"),
            (["simulate", "--workload", "chat_mixed"], "simulate needs POLICY (or --fleet FLEET.yaml)"),
            (["simulate", "vllm_v1"], "simulate POLICY needs --workload FILE or --trace FILE"),
            (["fuzz", "--workload", "chat_mixed"], "fuzz needs POLICY (or --fleet FLEET.yaml)"),
            (["fuzz", "vllm_v1", "--fleet", fleet], "fuzz --fleet takes no POLICY"),
            (["fuzz", "--fleet", fleet, "--slo", "kv_safety"], "fuzz --fleet takes no --slo: the fleet file names its "
                                                               "SLO file (slo:)"),
            (["fuzz", "--fleet", fleet, "--seed-trace", "t.csv"], "fuzz --fleet takes no --seed-trace"),
            (["fuzz", "--fleet", fleet, "--rate-scale", "2"], "fuzz --fleet takes no trace options"),
            (["fuzz", "--fleet", fleet, "--stress", "nope"], "--stress='nope' (expected one of: plain,"),
            (["fuzz", "--fleet", fleet, "--property", "nope"], "--property='nope' (expected a property of the fleet: "
                                                               "interactive_ttft_p99,"),
            (["fuzz", "vllm_v1", "--workload", "chat_mixed", "--jobs", "2"],
             "--jobs and --scheduler spread fuzz --fleet's property searches: fuzz POLICY runs its search in this "
             "process"),
            (["fuzz", "--fleet", fleet, "--jobs", "2", "--scheduler", "tcp://x:1"],
             "--jobs runs local processes, --scheduler a Dask cluster: one of them")):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err, (argv, err)


def test_a_lost_replica_recovers_when_it_comes_back_and_never_when_it_does_not(capsys):
    back, gone = run_fleet(FLEETS / "lost_replica_recovery.yaml"), run_fleet(FLEETS / "lost_replica_no_recovery.yaml")
    [fault], [never] = back.summary["faults"], gone.summary["faults"]
    # the loss at 30 s hurts the interactive class until the replica is back (50 s) and has drained the queue
    assert 20_000 < fault["recovery_ms"]["interactive"] < 45_000 and fault["recovery_ms"]["background"] == 0
    assert never["recovery_ms"]["interactive"] is None and never["until_end_ms"] > 45_000
    verdicts = [{f.prop.name: f.verdict for f in run.findings} for run in (back, gone)]
    assert verdicts[0]["recovery_time"] == "HOLDS" and verdicts[1]["recovery_time"] == "VIOLATED"
    assert [r["lives"] for r in back.summary["replicas"]] == [1, 2, 1]
    assert main(["simulate", "--fleet", str(FLEETS / "lost_replica_no_recovery.yaml")]) == 1
    assert "VIOLATED  recovery_time                observed 93" in capsys.readouterr().out


def test_recovery_time_without_a_fault_is_vacuous(tmp_path):
    text = (FLEETS / "lost_replica_recovery.yaml").read_text()
    start = text.index("faults:")
    (tmp_path / "f.yaml").write_text(text[:start] + text[text.index("workload:"):].replace(
        "chat_fleet.slo.yaml", str(FLEETS / "chat_fleet.slo.yaml")))
    run = run_fleet(tmp_path / "f.yaml", limit=30)
    assert [f.verdict for f in run.findings if f.prop.name == "recovery_time"] == ["VACUOUS"]


def test_the_shipped_pairs_through_simulate_fleet(capsys):
    """The issue's three effects through simulate --fleet: a retry storm the budget stops, a lost replica and its
    recovery time, a prefix-aware router that overloads one replica without its cap."""
    def doc(name: str) -> dict:
        main(["simulate", "--fleet", str(FLEETS / f"{name}.yaml"), "--json"])
        d = json.loads(capsys.readouterr().out)
        return {"props": {p["name"]: p["verdict"] for p in d["properties"]}, **d}

    storm, budget = doc("lost_replica_retry_storm"), doc("lost_replica_retry_budget")
    assert storm["props"]["retry_amplification"] == "VIOLATED" and budget["props"]["retry_amplification"] == "HOLDS"
    assert storm["offered"]["retry"] > 4 * budget["offered"]["retry"]
    back, never = doc("lost_replica_recovery"), doc("lost_replica_no_recovery")
    assert back["faults"][0]["recovery_ms"]["interactive"] > 0 and never["faults"][0]["recovery_ms"]["interactive"] is None
    assert (back["props"]["recovery_time"], never["props"]["recovery_time"]) == ("HOLDS", "VIOLATED")
    uncapped, capped = doc("prefix_uncapped"), doc("prefix_capped")
    assert max(r["attempts"] for r in uncapped["replicas"]) > 0.8 * 240 > 0.4 * 240 > max(
        r["attempts"] for r in capped["replicas"])
    assert (uncapped["exit_code"], capped["exit_code"]) == (1, 0)
