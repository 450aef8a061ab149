"""Issue 23, path traversal: a policy named ``../../ESCAPED_proof`` made ``verify --unbounded`` write its
certificate outside ``--proof-dir``, an SLO property named ``../../ESCAPED_fuzz`` made ``fuzz`` write outside
``--out``. Every name that becomes part of a file name goes through ``checker.fileio.safe_name``."""

from __future__ import annotations

from pathlib import Path

import pytest

from checker.cli import main
from checker.fileio import safe_name
from tests.helpers import POLICIES, WORKLOADS


@pytest.mark.parametrize("name", ["../../ESCAPED", "..", "/etc/passwd", "a/b\\c", "", "x" * 500, "\x00", "é.json"])
def test_safe_name_is_one_plain_file_name_part(name):
    safe = safe_name(name)
    assert safe and len(safe) <= 120 and set(safe) <= set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                                            "0123456789-_") | {"é"}
    assert safe == safe_name(safe)


def test_plain_names_are_kept():
    assert safe_name("vllm_v1") == "vllm_v1" and safe_name("interactive-ttft_p99") == "interactive-ttft_p99"


def _escaped(root: Path) -> list[Path]:
    return sorted(root.rglob("*ESCAPED*"))


def test_verify_certificate_stays_in_the_proof_dir(tmp_path):
    from checker.policy import Policy
    from checker.verify import run as verify_run
    from checker.inputfiles import load_policy

    policy = load_policy(POLICIES / "vllm_v1.yaml").model_copy(update={"name": "../../ESCAPED_proof"})
    assert isinstance(policy, Policy)

    class Inv:
        name = "../ESCAPED_inv"

    class Env:
        requests = 2

    proofs = tmp_path / "a" / "b" / "proofs"
    path = verify_run._write_certificate(policy, Inv, Env, proofs, "(check-sat)\n", "step query", [])
    assert path is not None and path.parent == proofs and path.exists()
    assert not (tmp_path / "a" / "ESCAPED_proof__ESCAPED_inv__N2.smt2").exists()


def test_fuzz_counterexample_stays_in_out(tmp_path, capsys):
    work = tmp_path / "work"
    out = work / "a" / "b"
    work.mkdir()
    slo = work / "s.slo.yaml"
    slo.write_text("format: batchcheck-slo\nproperties:\n  - {kind: latency, name: ../../ESCAPED_fuzz, class: "
                   "interactive, metric: ttft_ms, stat: max, bound_ms: 0.001}\n")
    code = main(["fuzz", str(POLICIES / "vllm_v1.yaml"), "--workload", str(WORKLOADS / "chat_mixed.yaml"),
                 "--slo", str(slo), "--max-examples", "5", "--seed", "0", "--out", str(out), "--database", "none",
                 "--time-budget", "120"])
    err = capsys.readouterr().err
    assert code == 1, err
    assert _escaped(tmp_path) == sorted(out.glob("*ESCAPED_fuzz*")) and len(_escaped(tmp_path)) == 1


def test_counterexample_file_name_sanitizes_the_property_too():
    from checker.verify.counterexample import file_name

    doc = {"policy": {"name": "../p", "sha256": "0"}, "property": {"name": "../../x"}, "requests": []}
    name = file_name(doc)
    assert "/" not in name and ".." not in name and name.endswith(".json")
