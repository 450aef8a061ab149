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


# ----------------------------------------------------------------------------------------- --seed-trace
def _seed_csv(tmp_path, rows: str = "0,100,50\n1,200,60\n"):
    path = tmp_path / "seed.csv"
    path.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n" + rows)
    return path


def test_seed_trace_runs_first_and_a_failing_seed_is_shrunk(capsys, tmp_path):
    # five long prompts at once: the decode stall of vllm_v0_no_chunking is in the seed itself
    trace = _seed_csv(tmp_path, "0,374,44\n0.01,5000,900\n0.02,5000,900\n0.03,5000,900\n0.04,5000,900\n1.0,100,20\n")
    code, out, err = run(capsys, "fuzz", str(POLICIES / "vllm_v0_no_chunking.yaml"), "--workload",
                         str(WORKLOADS / "chat_mixed.yaml"), "--property", "interactive_max_tbt", "--seed-trace",
                         str(trace), "--out", str(tmp_path), "--database", "none", "--max-examples", "5")
    assert code == 1, err
    lines = out.splitlines()
    assert lines[:2] == [f"note: seed trace {trace}: 6 requests cut into 1 windows; the 1 busiest (tokens arriving "
                         "per second) run first as explicit examples", "note: seed classes: default -> by prompt length"]
    assert lines[2].startswith("VIOLATED           interactive_max_tbt          observed ")
    assert "after shrinking (found in seed window 1, example 1, then shrunk); replayed;" in lines[2]
    (path,) = tmp_path.glob("vllm_v0_no_chunking__interactive_max_tbt__*.json")
    doc = json.loads(path.read_text())
    assert doc["environment"]["found_in_seed_window"] == 1 and len(doc["requests"]) < 6


def test_seed_trace_bad_input_is_one_line(capsys, tmp_path):
    trace = _seed_csv(tmp_path)
    policy, workload = str(POLICIES / "vllm_v1.yaml"), str(WORKLOADS / "chat_mixed.yaml")
    code, _, err = run(capsys, "fuzz", policy, "--seed-trace", str(trace))
    assert (code, err) == (2, "batchcheck: error: --seed-trace needs --workload FILE (the classes and length ranges "
                              "the seeds map onto)\n")
    code, _, err = run(capsys, "fuzz", policy, "--workload", workload, "--seed-trace", str(trace), "--window", "5:9")
    assert (code, err) == (2, f"batchcheck: error: {trace}: --window='5:9' (expected a window holding at least one "
                              "request of the trace)\n")
    code, _, err = run(capsys, "fuzz", policy, "--workload", workload, "--rate-scale", "2")
    assert (code, err) == (2, "batchcheck: error: --window, --rate-scale, --class-by-prompt and --class-column need "
                              "--seed-trace TRACE\n")
    named = tmp_path / "named.jsonl"
    named.write_text('{"timestamp": 0, "input_length": 10, "output_length": 5, "app": "search"}\n')
    code, _, err = run(capsys, "fuzz", policy, "--workload", workload, "--seed-trace", str(named), "--class-column", "app")
    assert (code, err) == (2, f"batchcheck: error: {named}: class='search' (expected a class of the workload "
                              "(interactive, background), or a trace without class names, whose requests map by "
                              "prompt length)\n")
