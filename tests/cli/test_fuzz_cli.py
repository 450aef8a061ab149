"""batchcheck fuzz: verdict lines, exit codes, saved and replayable SLO counterexamples."""

from __future__ import annotations

import json

from checker.cli import main
from tests.helpers import POLICIES, WORKLOADS


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_fuzz_finds_the_decode_stall_saves_and_replays_it(capsys, tmp_path):
    code, out, err = run(capsys, "fuzz", str(POLICIES / "vllm_v0_no_chunking.yaml"), "--workload",
                         str(WORKLOADS / "chat_mixed.yaml"), "--property", "interactive_max_tbt", "--max-examples",
                         "60", "--seed", "0", "--out", str(tmp_path), "--database", "none", "--time-budget", "300")
    assert code == 1, err
    assert out.startswith("VIOLATED           interactive_max_tbt          observed ")
    (path,) = tmp_path.glob("vllm_v0_no_chunking__interactive_max_tbt__*.json")
    doc = json.loads(path.read_text())
    assert doc["property"]["kind"] == "slo" and doc["property"]["allowed"] == 300.0
    assert doc["property"]["observed"] > 300.0 and doc["profile"]["name"] == "default-linear"
    assert len(doc["requests"]) <= 4 and doc["states"]

    code, out, _ = run(capsys, "replay", str(path))
    assert code == 1 and out.splitlines()[-1].startswith("interactive_max_tbt VIOLATED: observed ")
    code, out, _ = run(capsys, "replay", str(path), "--policy", str(POLICIES / "sarathi_serve.yaml"))
    assert code == 0 and out.splitlines()[-1].endswith("the policy no longer fails it")


def test_fuzz_without_an_slo_file_is_a_usage_error(capsys, tmp_path):
    workload = tmp_path / "w.yaml"
    workload.write_text((WORKLOADS / "chat_mixed.yaml").read_text())
    code, _, err = run(capsys, "fuzz", str(POLICIES / "vllm_v1.yaml"), "--workload", str(workload))
    assert code == 2
    assert err == ("batchcheck: error: --slo=<none> (expected an SLO file (none given, and no w.slo.yaml next to "
                   "the workload))\n")


def test_unknown_property_and_class(capsys, tmp_path):
    code, _, err = run(capsys, "fuzz", str(POLICIES / "vllm_v1.yaml"), "--workload", str(WORKLOADS / "chat_mixed.yaml"),
                       "--property", "ttft")
    assert code == 2
    assert err.startswith(f"batchcheck: error: {WORKLOADS / 'chat_mixed.slo.yaml'}: --property='ttft' (expected one of: "
                          "interactive_ttft_p99, ")
    slo = tmp_path / "s.slo.yaml"
    slo.write_text("properties:\n  - {kind: latency, name: x, class: vip, metric: ttft_ms, bound_ms: 10}\n")
    code, _, err = run(capsys, "fuzz", str(POLICIES / "vllm_v1.yaml"), "--workload", str(WORKLOADS / "chat_mixed.yaml"),
                       "--slo", str(slo))
    assert code == 2
    assert err == f"batchcheck: error: {slo}: properties.x='vip' (expected a class of the workload: interactive, background)\n"
