"""Action-wise induction (checker/verify/actions.py) proves the state invariants where they hold, never
where they fail, and its certificate is re-checked by a fresh solver."""

from __future__ import annotations

import pytest

from checker.api import load_policy
from checker.smt.ops import CERTIFICATE_BLOCK, recheck_smt2
from checker.verify import actions
from checker.verify.env import default_environment
from checker.verify.run import parse_invariant
from tests.helpers import POLICIES

STATE = ["kv_never_overcommitted", "token_budget", "seq_cap", "request_conservation"]


def prove(policy: str, invariant: str, requests: int, **env):
    pol = load_policy(POLICIES / policy)
    inv, params = parse_invariant(invariant)
    return actions.prove(pol, inv, params, default_environment(pol, requests, 2, **env), 120)


@pytest.mark.parametrize("invariant", STATE)
def test_vllm_v1_state_invariants_are_proved_for_three_slots(invariant):
    result = prove("vllm_v1.yaml", invariant, 3)
    assert result.status == "proved", result.cti


@pytest.mark.parametrize(("policy", "invariant"), [("orca.yaml", "token_budget"),
                                                   ("sarathi_serve.yaml", "kv_never_overcommitted"),
                                                   ("static_batching.yaml", "seq_cap")])
def test_other_phase_modes_are_proved_too(policy, invariant):
    assert prove(policy, invariant, 2).status == "proved"


def test_a_violated_invariant_is_never_proved():
    """unchecked_growth over-commits KV (the solver's minimal counterexample is checked in): the
    invariant must be dropped, and the failure names the action that broke it."""
    result = prove("broken/unchecked_growth.yaml", "kv_never_overcommitted", 2)
    assert result.status == "cti"
    assert "not preserved by the round of pass 0 (RunningPass)" in result.cti[0]


def test_the_certificate_rechecks_and_a_tampered_one_does_not():
    result = prove("sarathi_serve.yaml", "seq_cap", 2)
    assert result.status == "proved"
    blocks = result.certificate.split(CERTIFICATE_BLOCK)[1:]
    assert [b.splitlines()[0] for b in blocks] == ["prefix", "round of pass 0 (RunningPass)", "pass 0 -> pass 1",
                                                   "round of pass 1 (WaitingPass)", "complete"]
    assert recheck_smt2(result.certificate) == "unsat"
    # drop the last assertion of the round's block (the query's literal): the block becomes satisfiable
    round_block = blocks[1]
    cut = round_block.rstrip().rsplit("(assert", 1)[0]
    tampered = result.certificate.replace(round_block, cut + "(check-sat)\n")
    assert recheck_smt2(tampered) == "sat"
