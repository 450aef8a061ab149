"""The sweep: every configuration of the knobs (or a seeded sample of them) run on the same requests, the best
one that meets every property of the fleet chosen by the objective; the same results serially, on local
processes and on a Dask cluster; bad knobs exit 2 naming the knob and value."""

from __future__ import annotations

import contextlib
import json

import pytest

from checker.cli import main
from checker.fleet.sweep import Knob, configurations, fleet_sweep
from tests.unit.test_fleet_cli import FLEETS

CAPPED = FLEETS / "prefix_capped.yaml"
KNOBS = ["replicas=1,2,3", "batch.max_num_seqs=8,16"]


def _figures(results: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k != "wall_s"} for r in results]


def test_the_best_configuration_is_the_fewest_replicas_that_meet_the_slo():
    s = fleet_sweep(CAPPED, KNOBS)
    assert [r["config"] for r in s.results] == [{"replicas": n, "batch.max_num_seqs": m}
                                                for n in "123" for m in ("8", "16")]
    meets = [(r["config"]["replicas"], r["config"]["batch.max_num_seqs"]) for r in s.results if r["meets"]]
    assert meets == [("2", "16"), ("3", "8"), ("3", "16")]  # one replica never keeps up with the hot prefix
    assert all(r["violated"] == ["ttft_p99"] for r in s.results if not r["meets"])
    assert s.results[s.best]["config"] == {"replicas": "2", "batch.max_num_seqs": "16"}
    assert [r["replicas"] for r in s.results] == [1, 1, 2, 2, 3, 3]
    by_p99 = fleet_sweep(CAPPED, KNOBS, objective="ttft_p99")
    p99 = [r["ttft_p99_ms"] for r in by_p99.results if r["meets"]]
    assert by_p99.results[by_p99.best]["ttft_p99_ms"] == min(p99)
    assert _figures(by_p99.results) == _figures(s.results)


def test_a_sweep_of_the_prefix_routers_load_cap_finds_the_caps_that_spread_the_hot_prefix():
    s = fleet_sweep(FLEETS / "prefix_uncapped.yaml", ["router.load_cap=4,64", "replicas=2,3"])
    meets = {(r["config"]["router.load_cap"], r["config"]["replicas"]): r["meets"] for r in s.results}
    # a cap high enough never to bind is the uncapped router: one replica takes the hot prefix
    assert meets == {("4", "2"): False, ("4", "3"): True, ("64", "2"): False, ("64", "3"): False}
    assert s.results[s.best]["config"] == {"router.load_cap": "4", "replicas": "3"}


def test_local_processes_give_the_serial_results():
    serial, two = fleet_sweep(CAPPED, KNOBS, limit=120), fleet_sweep(CAPPED, KNOBS, limit=120, jobs=2)
    assert _figures(two.results) == _figures(serial.results) and two.best == serial.best
    assert two.where == "2 local processes" and serial.where == "1 process"


def test_a_dask_local_cluster_gives_the_serial_results():
    distributed = pytest.importorskip("distributed", reason="Dask distributed (batchcheck[scale]) is not installed")
    serial = fleet_sweep(CAPPED, KNOBS, limit=120)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
        remote = fleet_sweep(CAPPED, KNOBS, limit=120, scheduler=cluster.scheduler_address)
    assert _figures(remote.results) == _figures(serial.results) and remote.best == serial.best
    assert remote.where == f"Dask cluster at {cluster.scheduler_address}"


TIMINGS = ("where", "seconds")  # how and how long a sweep ran: the only figures that differ between runs


def _sweep_outputs(capsys, tmp_path, how: list[str], name: str) -> tuple[str, dict, dict]:
    """The table, the --json document and the --out file of one sweep run ``how`` (rows' wall_s and the
    document's where/seconds taken out, and where the table names them and the folder written)."""
    argv = ["sweep", str(CAPPED), "--knob", "replicas=1,2,3", "--knob", "batch.max_num_seqs=4,16",
            "--knob", "router.load_cap=2,4", "--limit", "120", *how]

    def steady(doc: dict) -> dict:
        assert set(TIMINGS) <= set(doc) and all("wall_s" in r for r in doc["results"])
        return {**{k: v for k, v in doc.items() if k not in TIMINGS}, "results": _figures(doc["results"])}

    assert main([*argv, "--out", str(tmp_path / name)]) == 0
    table = capsys.readouterr().out.replace(str(tmp_path / name), "OUT")
    head, _, rest = table.partition("\n")
    assert " on " in head and head.endswith(" s")
    assert main([*argv, "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    written = json.loads((tmp_path / name / "prefix_capped.sweep.json").read_text())
    return head.rsplit(" on ", 1)[0] + rest, steady(printed), steady(written)


def test_serial_local_processes_and_dask_give_the_same_best_rows_table_and_files(capsys, tmp_path):
    """Every output of a sweep is the same however its configurations run: the best configuration, every row, the
    table and the file written (12 configurations of unequal cost, so they finish out of grid order)."""
    serial = _sweep_outputs(capsys, tmp_path, [], "serial")
    table, printed, written = serial
    assert printed == written and len(printed["results"]) == 12 and printed["best"] is not None
    assert sum(r["meets"] for r in printed["results"]) not in (0, 12)  # the best is a choice, not the first row
    assert _sweep_outputs(capsys, tmp_path, ["--jobs", "2"], "two") == serial
    distributed = pytest.importorskip("distributed", reason="Dask distributed (batchcheck[scale]) is not installed")
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
        assert _sweep_outputs(capsys, tmp_path, ["--scheduler", cluster.scheduler_address], "dask") == serial


def test_the_configurations_read_the_fleets_files_once_and_build_the_same_fleets():
    from checker.fleet.spec import load_fleet
    from checker.fleet.sweep import configured, parse_knob

    fleet = load_fleet(FLEETS / "mixed_round_robin.yaml")  # one policy file, two profiles, an SLO file
    files: dict = {}
    grid = configurations([parse_knob("batch.max_num_seqs=2,4"), parse_knob("router.strategy=round_robin,"
                                                                          "least_outstanding")])
    memo = [configured(fleet, c, files) for c in grid]
    assert memo == [configured(fleet, c) for c in grid]  # each reading its files itself
    assert sorted(kind for kind, _ in files) == ["policy", "profile", "profile", "slo"]
    assert [m.replicas[0].policy.batch.max_num_seqs for m in memo] == [2, 2, 4, 4]


def test_a_random_sample_is_seeded_and_in_grid_order():
    knobs = [Knob("a", ("1", "2", "3", "4")), Knob("b", ("x", "y", "z"))]
    grid = configurations(knobs)
    assert len(grid) == 12 and grid[1] == {"a": "1", "b": "y"}
    sample = configurations(knobs, sample=5, seed=3)
    assert sample == configurations(knobs, sample=5, seed=3) and len(sample) == 5
    assert sample == [c for c in grid if c in sample]  # a subset, in grid order
    assert sample != configurations(knobs, sample=5, seed=4)
    assert configurations(knobs, sample=50) == grid


def test_the_command_line_table_json_and_exit_codes(capsys, tmp_path):
    assert main(["sweep", str(CAPPED), "--knob", "replicas=1,2", "--knob", "batch.max_num_seqs=16",
                 "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "2 configurations (grid) on 1 process" in out and "best (* above; by goodput" in out
    assert out.count(" yes ") == 1 and "replicas=2, batch.max_num_seqs=16" in out
    doc = json.loads((tmp_path / "prefix_capped.sweep.json").read_text())
    assert doc["best"] == 1 and doc["exit_code"] == 0
    assert main(["sweep", str(CAPPED), "--knob", "replicas=1", "--knob", "batch.max_num_seqs=4,8"]) == 1
    assert "best: none: no configuration meets every property of the fleet" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    ([str(CAPPED)], "--knob=<none> (expected at least one knob NAME=V1,V2,...)"),
    ([str(CAPPED), "--knob", "batch.max_num_seqs"], "--knob='batch.max_num_seqs' (expected NAME=V1,V2,... with NAME "
                                                    "a policy field (batch.max_num_seqs), a router field "
                                                    "(router.load_cap) or replicas"),
    ([str(CAPPED), "--knob", "batch.max_num_seqs=8,8"], "--knob='batch.max_num_seqs=8,8' (expected each value once)"),
    ([str(CAPPED), "--knob", "replicas=2", "--knob", "replicas=3"], "--knob='replicas' (expected each knob once"),
    ([str(CAPPED), "--knob", "replicas=0"], "--knob='replicas=0' (expected a whole number of replicas from 1 to 1024)"),
    ([str(CAPPED), "--knob", "batch.max_num_seqs=0"], "--knob='batch.max_num_seqs=0' (expected a configuration the "
                                                      "fleet accepts: "),
    ([str(CAPPED), "--knob", "batch.nope=3"], "--knob='batch.nope=3' (expected a configuration the fleet accepts: "),
    ([str(FLEETS / "canary_promote.yaml"), "--knob", "replicas=2"],
     "--knob='replicas' (expected a fleet of one replica group (this one has 2: base, canary))"),
    ([str(FLEETS / "lost_replica_recovery.yaml"), "--knob", "replicas=1"],
     "--knob='replicas=1' (expected a configuration the fleet accepts: "),
    ([str(CAPPED), "--knob", "router.nope=2"], "--knob='router.nope=2' (expected a configuration the fleet accepts: "),
    ([str(CAPPED), "--knob", "router.load_cap=["], "--knob='router.load_cap=[' (expected a YAML value after '=')"),
    ([str(FLEETS / "mixed_round_robin.yaml"), "--knob", "router.load_cap=2"],
     "(expected no load_cap with strategy round_robin (it caps prefix_aware's choice only)))"),
    ([str(CAPPED), "--knob", "replicas=2", "--jobs", "2", "--scheduler", "tcp://x:1"],
     "--jobs runs local processes, --scheduler a Dask cluster: one of them"),
    ([str(CAPPED), "--knob", "replicas=2", "--rate-scale", "0"], "argument --rate-scale: '0'"),
])
def test_bad_knobs_exit_2_naming_them(capsys, argv, message):
    with pytest.raises(SystemExit) if "argument" in message else contextlib.nullcontext():
        assert main(["sweep", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err, err

