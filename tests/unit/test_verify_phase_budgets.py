"""Every phase of ``verify --unbounded`` keeps to --timeout (issue 19: ``verify --unbounded --requests 16 --timeout
120`` ran 598 s). The action-wise proof asks z3 several queries per scheduler action (drop the candidates a model
breaks, ask again): each query was given the whole time left when the action began, and building the action's query
was not counted, so kv_never_overcommitted with 16 slots took 15.7 s for --timeout 8 (52.4 s for 30). Now the
building and every query count against one deadline (checker/verify/actions.py)."""

from __future__ import annotations

from checker.api import load_policy
from checker.verify.run import run_verify
from tests.helpers import POLICIES


def test_the_action_wise_proof_of_16_slots_stops_at_the_timeout():
    timeout_s = 8.0
    _, (checked,) = run_verify(load_policy(POLICIES / "vllm_v1.yaml"), ["kv_never_overcommitted"], requests=16,
                               unbounded=True, timeout_s=timeout_s, out_dir=None, proof_dir=None)
    assert checked.verdict.value in ("UNKNOWN", "PROVED", "VACUOUS"), checked.line()
    assert checked.seconds < timeout_s * 1.1 + 1.0, checked.seconds  # its tenth, and the environment's set-up
