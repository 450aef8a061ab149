"""`batchcheck verify --any-n`: the verdict line, exit codes, the certificate `recheck` accepts, refusals by name."""

from __future__ import annotations

from tests.cli.test_cli import run
from tests.helpers import POLICIES

V1 = str(POLICIES / "vllm_v1.yaml")


def test_any_n_proves_seq_cap_and_recheck_accepts_its_certificate(capsys, tmp_path):
    code, out, _ = run(capsys, "verify", V1, "--any-n", "--invariant", "seq_cap", "--out", str(tmp_path))
    assert code == 0, out
    line = next(line for line in out.splitlines() if line.startswith("PROVED"))
    assert "seq_cap" in line and "for any N, any number of iterations (method: aggregate abstraction" in line
    cert = tmp_path / "proofs" / "vllm_v1__seq_cap__anyN.smt2"
    assert cert.is_file()
    code, out, _ = run(capsys, "recheck", str(cert), "--policy", V1, "--requests", "200")
    assert code == 0, out
    assert "made for any N (so for N=200)" in out and "instance queries (any N)" in out


def test_any_n_refuses_an_uncovered_policy_by_name(capsys):
    code, _, err = run(capsys, "verify", str(POLICIES / "sglang" / "sglang_v05.yaml"), "--any-n")
    assert code == 2
    assert "any-N: not covered: scheduler: sglang" in err


def test_any_n_is_not_an_option_of_liveness(capsys):
    code, _, err = run(capsys, "verify", V1, "--any-n", "--liveness")
    assert code == 2 and "--any-n" in err


def test_any_n_and_unbounded_together_is_a_usage_error(capsys):
    code, _, err = run(capsys, "verify", V1, "--any-n", "--unbounded")
    assert code == 2 and "--any-n and --unbounded" in err


def test_any_n_json_marks_the_verdict_and_recheck_json_names_the_method(capsys, tmp_path):
    import json

    code, out, _ = run(capsys, "verify", V1, "--any-n", "--invariant", "token_budget", "--out", str(tmp_path),
                       "--json")
    assert code == 0
    (result,) = json.loads(out)["results"]
    assert result["verdict"] == "PROVED" and result["any_n"] is True
    code, out, _ = run(capsys, "recheck", result["certificate"], "--policy", V1, "--json")
    assert code == 0 and json.loads(out)["binding"]["method"] == "any-n"
