"""verify --out DIR writes its certificates under DIR/proofs/, not into ./proofs/ (issue 19); --proof-dir still
wins, and without --out the default stays proofs/ as before."""

from __future__ import annotations

from checker.cli import main, verify_dirs
from checker.verify.certificate import read_binding
from tests.helpers import POLICIES

V1 = str(POLICIES / "vllm_v1.yaml")
SMALL = ("--invariant", "seq_cap", "--requests", "2", "--depth", "2", "--prompt-range", "1:2048", "--unbounded")


def test_verify_with_out_writes_the_certificate_under_it_and_nothing_in_the_working_directory(capsys, tmp_path,
                                                                                             monkeypatch):
    monkeypatch.chdir(tmp_path)
    code = main(["verify", V1, *SMALL, "--out", "run"])
    out = capsys.readouterr().out
    assert code == 0
    cert = tmp_path / "run" / "proofs" / "vllm_v1__seq_cap__N2.smt2"
    assert cert.exists() and not (tmp_path / "proofs").exists()
    assert out.splitlines()[-1].split("certificate: ")[1].startswith("run/proofs/vllm_v1__seq_cap__N2.smt2  [")
    binding, _, _ = read_binding(cert.read_text(), str(cert))  # it names the policy's hash, the invariant and N
    assert (binding.policy, binding.invariant, binding.requests) == ("vllm_v1", "seq_cap", 2)
    assert len(binding.policy_sha256) == 64


def test_the_default_folders():
    assert verify_dirs(None, None) == ("counterexamples", "proofs")
    assert verify_dirs("run", None) == ("run", "run/proofs")
    assert verify_dirs("run", "elsewhere") == ("run", "elsewhere")
    assert verify_dirs(None, "elsewhere") == ("counterexamples", "elsewhere")
