"""batchcheck audit --policy P --trace TRACE: the derived audit with class rates from a real trace."""

from __future__ import annotations

from checker.cli import main
from tests.helpers import POLICIES, WORKLOADS

VLLM = str(POLICIES / "vllm_v1.yaml")


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _csv(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0,100,50\n30,200,60\n60,300,70\n")
    return str(path)


def test_audit_from_a_trace(capsys, tmp_path):
    code, out, err = run(capsys, "audit", "--policy", VLLM, "--trace", _csv(tmp_path), "--rate-scale", "2")
    assert code == 0, err
    assert out.splitlines()[0] == "decision=CAPACITY_WITHIN_DECLARED_BOUND"


def test_audit_trace_bad_input_is_one_line(capsys, tmp_path):
    trace = _csv(tmp_path)
    code, _, err = run(capsys, "audit", "--policy", VLLM, "--trace", trace, "--window", "100:200")
    assert (code, err) == (2, f"batchcheck: error: {trace}: --window='100:200' (expected a window holding at least one "
                              "request of the trace)\n")
    workload = str(WORKLOADS / "chat_mixed.yaml")
    code, _, err = run(capsys, "audit", "--policy", VLLM, "--workload", workload, "--trace", trace)
    assert (code, err) == (2, f"batchcheck: error: give --workload or --trace, not both (got {workload} and {trace})\n")
    code, _, err = run(capsys, "audit", "--policy", VLLM, "--workload", workload, "--class-by-prompt", "512")
    assert (code, err) == (2, "batchcheck: error: --window, --rate-scale, --class-by-prompt and --class-column need "
                              "--trace FILE\n")
    code, _, err = run(capsys, "audit", "--trace", trace)
    assert (code, err) == (2, "batchcheck: error: the derived form needs --policy FILE and --workload FILE or --trace "
                              "FILE (--profile is optional)\n")
