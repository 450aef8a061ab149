"""verify --temporal-induction (checker/verify/temporal_induction.py): the windowed temporal invariants PROVED for N
slots by k-induction (certificate rechecked from the policy), a starving policy VIOLATED with a replayed
counterexample (never PROVED), a counterexample to induction leaving the verdict bounded, and the refusals by name.
Tiny instances (2 slots, short prompts): the whole file runs in well under a minute."""

from __future__ import annotations

import pytest

from checker.api import load_policy, run_verify
from checker.errors import InputError
from checker.verify import certificate, temporal_induction
from checker.verify.env import default_environment
from checker.verify.run import parse_invariant
from tests.helpers import POLICIES

V1 = POLICIES / "vllm_v1.yaml"
SMALL = {"prompt": (1, 64), "output": (1, 4), "unbounded": None}  # None: the proofs where they apply (verify's default)


def test_cancellation_releases_proved_by_k_induction_and_its_certificate_rechecks(tmp_path):
    _, (r,) = run_verify(V1, ["cancellation_releases:2"], 2, 2, 300.0, out_dir=tmp_path / "cex",
                         proof_dir=tmp_path / "proofs", temporal_induction=True, **SMALL)
    assert r.verdict.value == "PROVED", r.line()
    assert "k-induction, k=2, N=2, pool=2500 blocks" in r.line()
    assert r.env.depth == 3  # the bounded search reaches the deepest base case k-induction may use
    checked = certificate.recheck(r.certificate, load_policy(V1), str(V1), ("cancellation_releases", {}), 2, 40_000)
    assert checked.solver == "unsat" and checked.binding.method == "temporal-induction" and checked.binding.k == 2
    # the lemmas proved inductive on their own (a query of their own), then assumed in the step query
    assert checked.binding.tier == "lemmas-first" and checked.binding.queries == 2
    assert "structural lemmas proved inductive on their own first" in r.line()


def test_off_means_unchanged():
    """Without the flag a window of 2 gets the bounded search only, as before."""
    _, (r,) = run_verify(V1, ["cancellation_releases:2"], 2, 2, 300.0, out_dir=None, proof_dir=None, **SMALL)
    assert not r.certificate and any("need --temporal-induction" in note for note in r.notes), r.notes
    assert r.verdict.value == "HOLDS_UP_TO" and r.env.depth == 2, r.line()


def test_a_policy_that_starves_stays_violated(tmp_path):
    """One running slot: a request that arrives behind a running one waits more than 2 iterations. The base
    case's depth is searched first: VIOLATED, replayed on the engine, never PROVED."""
    pol = load_policy(V1)
    one_slot = pol.model_copy(update={"name": "one_slot", "batch": pol.batch.model_copy(update={"max_num_seqs": 1})})
    _, (r,) = run_verify(one_slot, ["bounded_starvation:2"], 2, 2, 300.0, out_dir=tmp_path / "cex",
                         proof_dir=tmp_path / "proofs", temporal_induction=True, **SMALL)
    assert r.verdict.value == "VIOLATED", r.line()
    assert r.counterexample is not None and r.counterexample.exists()


def test_a_violation_deeper_than_the_base_case_is_not_proved():
    """One running slot, outputs up to 8 tokens: a request waits behind a running one for more than 3 iterations,
    but only on paths longer than the base case (k = 3, 4). The step query finds it (a CTI): never PROVED."""
    pol = load_policy(V1)
    one_slot = pol.model_copy(update={"name": "one_slot", "batch": pol.batch.model_copy(update={"max_num_seqs": 1})})
    inv, params = parse_invariant("bounded_starvation:3")
    env = default_environment(one_slot, 2, 2, prompt=(1, 64), output=(1, 8))
    result = temporal_induction.prove(one_slot, inv, params, env, 300.0)
    assert result.status == "cti" and result.k == 4 and result.cti[0] == "breaks: bounded_starvation", result.cti


def test_a_counterexample_to_induction_is_reported_not_proved():
    """bounded_starvation(steps=2) on vLLM v1 is not 2-inductive with the structural lemmas (a waiting request
    that the lemmas allow to have been served and preempted before): the step query is satisfiable, so k=2 says
    "cti"; 3-induction proves it."""
    pol = load_policy(V1)
    inv, params = parse_invariant("bounded_starvation:2")
    env = default_environment(pol, 2, 2, prompt=(1, 64), output=(1, 4))
    at2 = temporal_induction.prove(pol, inv, params, env, 300.0, k=2)
    assert at2.status == "cti" and at2.cti[0] == "breaks: bounded_starvation", at2.cti
    assert temporal_induction.prove(pol, inv, params, env, 300.0).status == "proved"


def test_a_cti_leaves_the_verdict_bounded(tmp_path, monkeypatch):
    """With no k beyond the window to try, the counterexample to induction is said with a HOLDS_UP_TO verdict."""
    monkeypatch.setattr(temporal_induction, "EXTRA_K", 0)
    _, (r,) = run_verify(V1, ["bounded_starvation:2"], 2, 3, 300.0, out_dir=tmp_path / "cex",
                         proof_dir=tmp_path / "proofs", temporal_induction=True, output=(1, 4), unbounded=None)
    assert r.verdict.value == "HOLDS_UP_TO", r.line()  # prompts up to max_model_len: a request waits (not VACUOUS)
    assert "k-induction (k=2) not proved: counterexample to induction" in r.line()


@pytest.mark.parametrize(("args", "said"), [
    ({"invariants": ["bounded_starvation:9"]}, "--temporal-induction='bounded_starvation' (expected a window of 1..8"),
    ({"invariants": ["decode_progress"], "unbounded": False}, "without --bounded-only"),
    ({"invariants": ["decode_progress"], "any_n": True}, "without --any-n"),
])
def test_refused_by_name(args, said):
    with pytest.raises(InputError, match=said.replace("(", r"\(").replace(".", r"\.")):
        run_verify(V1, args.pop("invariants"), 2, 2, 10.0, out_dir=None, proof_dir=None, temporal_induction=True,
                   **{"unbounded": None, **args})


def test_any_n_refuses_temporal_invariants_by_name_with_the_reason():
    with pytest.raises(InputError, match="any-N: not covered: invariant bounded_starvation \\(a temporal invariant"):
        run_verify(V1, ["bounded_starvation:3"], 2, 2, 10.0, out_dir=None, proof_dir=None, any_n=True)


def test_a_speculative_policy_is_proved_with_its_draft_fields(tmp_path):
    """Regression (the merge of speculative decoding in z3 with k-induction): the lemma query built its state
    without the policy, so a speculative policy's `drafts` field was missing (KeyError, exit 101). The reserved
    fix of eagle_unreserved_lookahead is PROVED with the verifier's acceptance free in every step."""
    pol = load_policy(POLICIES / "broken" / "eagle_unreserved_lookahead.yaml")
    fixed = pol.model_copy(update={"name": "eagle_reserved",
                                   "speculative": pol.speculative.model_copy(update={"reserve_lookahead": True})})
    _, (r,) = run_verify(fixed, ["cancellation_releases:2"], 2, 2, 300.0, out_dir=tmp_path / "cex",
                         proof_dir=tmp_path / "proofs", temporal_induction=True, **SMALL)
    assert r.verdict.value == "PROVED", r.line()
    assert "k-induction, k=2, N=2" in r.line()
