"""verify --any-n (checker/verify/anyn.py): the state invariants PROVED for any number of requests on the
policies' own pools, never where they fail, certificates rechecked from the policy, uncovered rules refused by
name; and a soundness sweep against bounded model checking at small N and the engine at large N."""

from __future__ import annotations

from pathlib import Path

import pytest

from checker.api import load_policy, run_verify
from checker.errors import InputError
from checker.verify import anyn, certificate
from checker.verify.anyn_sweep import engine_check, sweep_policy
from tests.helpers import POLICIES

V1 = POLICIES / "vllm_v1.yaml"


def planted(folder: Path, name: str, num_blocks: int | None = None) -> Path:
    """vllm_v1 with decode growth unchecked (kv.check_allocation: false), optionally on another pool."""
    text = V1.read_text().replace("  allocation: on_demand", "  allocation: on_demand\n  check_allocation: false")
    if num_blocks is not None:
        text = text.replace("num_blocks: 2500", f"num_blocks: {num_blocks}")
    path = folder / name
    path.write_text(text.replace("name: vllm_v1", f"name: {path.stem}"))
    return path


def test_vllm_v1_four_state_invariants_proved_for_any_n_with_rechecked_certificates(tmp_path):
    env, results = run_verify(V1, None, 3, 5, 60.0, out_dir=tmp_path / "cex", proof_dir=tmp_path / "proofs",
                              any_n=True)
    assert [r.invariant.name for r in results] == list(anyn.TARGETS)
    for r in results:
        assert r.verdict.value == "PROVED" and r.any_n, r.line()
        line = r.line()
        assert "for any N, any number of iterations (method: aggregate abstraction" in line
        assert "pool 2,500 blocks of 16, max_num_seqs 256, token budget 8,192" in line
        assert "side conditions checked" in line and "its situation occurs" in line
        checked = certificate.recheck(r.certificate, load_policy(V1), str(V1), (r.invariant.name, {}), 40)
        assert checked.solver == "unsat", checked.checked
        assert any("rebuilt from the policy" in c for c in checked.checked)


def test_a_certificate_for_another_policy_or_fewer_candidates_is_not_accepted(tmp_path):
    _, results = run_verify(V1, ["token_budget"], 3, 5, 60.0, out_dir=None, proof_dir=tmp_path, any_n=True)
    path = results[0].certificate
    other = load_policy(POLICIES / "orca.yaml")
    with pytest.raises(InputError):
        certificate.recheck(path, other, "orca.yaml")
    # the candidates that survived, without the budget's bookkeeping: the rebuilt proof no longer holds
    proof = anyn.prove(load_policy(V1))
    weaker = {loc: [n for n in names if n != "budget_account"] for loc, names in proof.alive.items()}
    answer, where = anyn.recheck_rebuilt(load_policy(V1), weaker, 30)
    assert answer == "sat" and where


def test_planted_overcommit_is_not_proved_and_is_found(tmp_path):
    """Decode growth unchecked: on a small pool the bounded check finds and replays it (VIOLATED); on the real
    pool, where it needs tens of requests, any-N does not prove it and the engine with 60 requests finds it."""
    small = planted(tmp_path, "planted_small.yaml", num_blocks=8)
    _, (r,) = run_verify(small, ["kv_never_overcommitted"], 2, 6, 60.0, out_dir=tmp_path / "cex", proof_dir=None,
                         prompt=(1, 64), any_n=True)
    assert r.verdict.value == "VIOLATED" and any("any-N: not proved" in n for n in r.notes)
    real = load_policy(planted(tmp_path, "planted_real.yaml"))
    assert not anyn.prove(real).proved("kv_never_overcommitted")
    assert anyn.prove(real).proved("token_budget")
    assert engine_check(real, "kv_never_overcommitted", 2, 8, 120, prompt_cap=1024).startswith("holds")
    assert engine_check(real, "kv_never_overcommitted", 2, 60, 120, prompt_cap=1024).startswith("violated")
    _, (r,) = run_verify(planted(tmp_path, "planted_cli.yaml"), ["kv_never_overcommitted"], 3, 5, 60.0,
                         out_dir=None, proof_dir=None, any_n=True)
    assert r.verdict.value != "PROVED"


@pytest.mark.parametrize(("policy", "rule"), [("connector/vllm_v1_decode_node.yaml", "connector"),
                                              ("sglang/sglang_v05.yaml", "scheduler: sglang"),
                                              ("prefix_caching/vllm_v1.yaml", "kv.prefix_caching.enabled")])
def test_uncovered_rules_are_refused_by_name(policy, rule):
    with pytest.raises(InputError, match=f"any-N: not covered: {rule}"):
        run_verify(POLICIES / policy, None, 2, 2, 10.0, out_dir=None, proof_dir=None, any_n=True)


def test_uncovered_invariants_are_refused_by_name():
    with pytest.raises(InputError, match="any-N: not covered: invariant decode_progress"):
        run_verify(V1, ["decode_progress"], 2, 2, 10.0, out_dir=None, proof_dir=None, any_n=True)
    with pytest.raises(InputError, match="any-N: not covered: invariant kv_never_overcommitted headroom=4"):
        run_verify(V1, ["kv_never_overcommitted:4"], 2, 2, 10.0, out_dir=None, proof_dir=None, any_n=True)


@pytest.mark.parametrize("policy", ["vllm_v1.yaml", "orca.yaml", "broken/unchecked_growth.yaml"])
def test_soundness_sweep_small(policy):
    """No PROVED where bounded model checking (N=2, 3 iterations) or the engine (40 requests) finds a violation."""
    rows = sweep_policy(policy, load_policy(POLICIES / policy), bmc=(2, 3), engine=(2, 40, 40))
    assert not [r for r in rows if r.unsound], rows
    if policy.startswith("broken/"):
        kv = next(r for r in rows if r.invariant == "kv_never_overcommitted")
        assert kv.any_n == "not proved" and kv.bmc == "VIOLATED"
    else:
        assert all(r.any_n == "PROVED" for r in rows)
