"""verify's bounded z3 search with blocked waiting states (checker/smt/encode.py; the environment chooses each
request's grammar_steps in 0..MAX_GRAMMAR_STEPS): the planted `stop` scan (tests/data/blocked/vllm_v1_blocked_stop.yaml)
is VIOLATED for no_deadlock:2 and work_conserving with 2 requests, by a counterexample whose blocked request's
grammar_steps the replay on the engine reads back; vLLM 0.33's `skip` holds both within the same bounds (no_deadlock:2
with 3 requests too), and fixes the counterexamples. Any-N and the proofs still refuse blocked states by name.

(work_conserving with 3 requests fails under skip too, and with blocked_waiting off: strict head of line behind a
prompt that does not fit is not work-conserving; no_deadlock is the invariant that tells the two rules apart.)
"""

from __future__ import annotations

import json

import pytest

from checker.api import run_replay
from checker.errors import InputError
from checker.verify.counterexample import specs_from_json
from checker.verify.run import Verdict, run_verify
from tests.helpers import ROOT

DATA = ROOT / "tests" / "data" / "blocked"
STOP, SKIP = DATA / "vllm_v1_blocked_stop.yaml", DATA / "vllm_v1_blocked_skip.yaml"
INVARIANTS = ["no_deadlock:2", "work_conserving"]


def _verify(policy, invariants, requests, out=None, **kw):
    env, results = run_verify(str(policy), invariants, requests=requests, depth=3, out_dir=out, proof_dir=None, **kw)
    return env, results


def test_the_stop_scan_is_violated_with_a_replayed_blocked_counterexample(tmp_path):
    env, results = _verify(STOP, INVARIANTS, 2, tmp_path)
    assert env.max_grammar_steps == 2 and any("grammar" in line for line in env.describe())
    for checked in results:
        assert checked.verdict is Verdict.VIOLATED, checked
        assert checked.requests == 2 and any(spec.grammar_steps for spec in checked.specs), checked.specs
        path = checked.counterexample
        text = path.read_text()
        assert '"grammar_steps"' in text
        assert any(s.grammar_steps for s in specs_from_json(json.loads(text)["requests"]))
        assert run_replay(path)[1]  # the engine reproduces it under stop
        replayed, violated = run_replay(path, SKIP)  # and vLLM 0.33's rule does not fail it
        assert not violated, replayed


def test_the_skip_scan_holds_up_to_the_bounds():
    _, results = _verify(SKIP, INVARIANTS, 2)
    _, more = _verify(SKIP, ["no_deadlock:2"], 3)
    for checked in results + more:
        assert checked.verdict is Verdict.HOLDS_UP_TO, checked


@pytest.mark.parametrize("kw, words", [({"any_n": True}, "any-N"), ({"unbounded": True}, "induction"),
                                       ({"temporal_induction": True}, "induction")])
def test_any_n_and_the_proofs_refuse_blocked_states_by_name(kw, words):
    with pytest.raises(InputError) as err:
        _verify(SKIP, ["no_deadlock:2"], 2, **kw)
    assert "queue.blocked_waiting" in str(err.value) and words in str(err.value)
