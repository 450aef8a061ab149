"""The fleet file: every error names the file (and line where known), the field path, the value and what is
allowed, word for word; the command line exits 2 with it and no traceback."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from checker.cli import main
from checker.errors import InputError
from checker.fleet.spec import load_fleet
from tests.helpers import WORKLOADS

ONE = "replicas:\n  - {name: r, policy: vllm_v1}\n"
CASES = {
    "strategy": (ONE + "router: {strategy: random}\n",
                 "{f}:4: router.strategy='random' (expected one of: round_robin, least_outstanding, least_kv_load, "
                 "prefix_aware or session_affinity)"),
    "fault_replica": ("replicas:\n  - {name: r, policy: vllm_v1, count: 2}\nfaults:\n  - {kind: lost, replica: r-2, "
                      "at_ms: 10}\n", "{f}:4: faults.0.replica='r-2' (expected a replica of the fleet: r-0, r-1)"),
    "pools": (ONE + "pools: {kind: disaggregated}\n",
              "{f}:4: pools.prefill=None (expected a non-empty list of replica groups with kind disaggregated)"),
    "load_cap": (ONE + "router: {strategy: round_robin, load_cap: 4}\n",
                 "{f}:4: router.load_cap=4 (expected no load_cap with strategy round_robin (it caps prefix_aware's "
                 "choice only))"),
    "policy_missing": ("replicas:\n  - {name: r, policy: nope.yaml}\n",
                       "{f}: replicas[0].policy='nope.yaml' (expected a policy file (relative to the fleet file) or a "
                       "shipped policy's name)"),
    "two_clients": (ONE + "clients:\n  - {name: a, classes: [x]}\n  - {name: b, classes: [x]}\n",
                    "{f}:4: clients.1.classes='x' (expected a class no other client sends (clients.0 sends it))"),
    "set": ("replicas:\n  - {name: r, policy: vllm_v1, set: ['batch.max_num_seqs=0']}\n",
            "{f}: replicas[0].set: batch.max_num_seqs=0 (expected a number >= 1)"),
    "slow_window": (ONE + "faults:\n  - {kind: slow, replica: r, start_ms: 50, end_ms: 50, factor: 2}\n",
                    "{f}:5: faults[0].end_ms=50.0 (expected > start_ms=50)"),
    "fault_kind": (ONE + "faults:\n  - {kind: fire, replica: r}\n",
                   "{f}:5: faults[0].kind='fire' (expected one of: slow, lost, view_lost)"),
    "typo": (ONE + "router: {stalenes_ms: 5}\n",
             "{f}:4: router.stalenes_ms=5 (expected a known key; did you mean staleness_ms? allowed here: load_cap, "
             "staleness_ms, strategy)"),
    "detect": (ONE + "faults:\n  - {kind: lost, replica: r, at_ms: 0, detect_ms: 500, recover_after_ms: 100}\n",
               "{f}:5: faults[0].detect_ms=500.0 (expected <= recover_after_ms=100)"),
    "both_sources": (ONE + "workload: chat_mixed\ntrace: t.json\n",
                     "{f}:5: trace='t.json' (expected no trace when a workload is given (one source of requests))"),
    "trace_missing": (ONE + "trace: t.json\n",
                      "{f}: trace='t.json' (expected a trace file (relative to the fleet file))"),
    "two_losses": (ONE + "faults:\n  - {kind: lost, replica: r, at_ms: 0}\n  - {kind: lost, replica: r, at_ms: 9}\n",
                   "{f}:4: faults.0.replica='r' (expected one lost fault per replica)"),
}


def write(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "fleet.yaml"
    path.write_text("format: batchcheck-fleet\n" + body)
    return path


@pytest.mark.parametrize("case", sorted(CASES))
def test_errors_word_for_word(tmp_path, case):
    body, message = CASES[case]
    path = write(tmp_path, body)
    with pytest.raises(InputError) as exc:
        load_fleet(path)
    assert str(exc.value) == message.format(f=path)


def test_an_slo_property_the_fleet_cannot_measure_is_refused_by_name(tmp_path):
    shutil.copy(WORKLOADS / "chat_mixed.slo.yaml", tmp_path / "chat.slo.yaml")
    path = write(tmp_path, ONE + "slo: chat.slo.yaml\n")
    with pytest.raises(InputError) as exc:
        load_fleet(path)
    assert str(exc.value) == (f"{tmp_path / 'chat.slo.yaml'}: properties.interactive_max_tbt='max_tbt_ms' (expected "
                              "a property the fleet measures: latency of ttft_ms or e2e_ms, or rejection_rate)")


def test_a_client_class_the_requests_lack_is_an_input_error(tmp_path, capsys):
    path = write(tmp_path, ONE + "clients:\n  - {name: a, classes: [chat]}\n")
    assert main(["fleet", str(path), "--workload", str(WORKLOADS / "chat_mixed.yaml"), "--limit", "5"]) == 2
    err = capsys.readouterr().err
    assert f"{path}: clients[0].classes='chat' (expected a class of the requests: interactive, background)" in err
    assert "Traceback" not in err


def test_the_command_line_exits_2_on_a_bad_fleet_file(tmp_path, capsys):
    body, message = CASES["strategy"]
    path = write(tmp_path, body)
    assert main(["fleet", str(path), "--workload", str(WORKLOADS / "chat_mixed.yaml")]) == 2
    err = capsys.readouterr().err
    assert message.format(f=path) in err and "Traceback" not in err


def test_no_requests_named_anywhere_is_an_input_error(tmp_path, capsys):
    assert main(["fleet", str(write(tmp_path, ONE))]) == 2
    assert ("--workload/--trace=<none> (expected one of them, or a workload: or trace: in the fleet file)"
            in capsys.readouterr().err)


def test_heterogeneous_groups_and_names(tmp_path):
    path = write(tmp_path, "replicas:\n  - {name: big, policy: vllm_v1, count: 2}\n"
                           "  - {name: small, policy: vllm_v1, profile: a100-llama-2-70b-tp2, "
                           "set: ['batch.max_num_seqs=8']}\n")
    fleet = load_fleet(path)
    assert [r.name for r in fleet.replicas] == ["big-0", "big-1", "small"]
    assert [r.policy.batch.max_num_seqs for r in fleet.replicas] == [256, 256, 8]
    assert fleet.replicas[0].profile.name == "default-linear" and fleet.replicas[2].profile.name != "default-linear"
