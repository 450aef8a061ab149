"""z3 finds the planted speculative failure (issue 17): verify's bounded search on a policy that leaves the drafter's
lookahead slots unreserved is VIOLATED on lookahead_fits with a minimal counterexample replayed on the engine, and
the verifier's choices it made (accepted drafts) travel with the counterexample so that the replay reproduces it."""

from __future__ import annotations

import json

from checker.api import run_verify
from checker.policy import Policy
from checker.verify.counterexample import specs_from_json
from checker.verify.replay import first_violation, replay_counterexample, replay_fixed_clock
from checker.verify.run import Verdict
from invariants.catalogue import CATALOGUE
from tests.helpers import POLICIES

UNRESERVED = POLICIES / "broken" / "eagle_unreserved_lookahead.yaml"

# A pool of 4 blocks of 4 tokens, EAGLE with 3 drafts, lookahead unreserved: with prompts of at most 4 tokens two
# requests fit their prefills and their lookahead (2 blocks each), and a decode that accepts no draft computes no
# further than its blocks reach; only accepted drafts carry a request past them.
TINY = """name: tiny_eagle_unreserved
max_model_len: 64
batch: {max_num_seqs: 4, max_num_batched_tokens: 32}
chunking: {enabled: true}
kv: {num_blocks: 4, block_size: 4}
speculative: {method: eagle, num_tokens: 3, reserve_lookahead: false}
"""


def test_z3_finds_the_unreserved_lookahead_with_a_minimal_replayed_counterexample(tmp_path):
    # one prompt that fills the 32-block pool: its blocks are allocated for the prompt alone, and the drafter's 4
    # lookahead slots after it need a 33rd block
    _, (result,) = run_verify(UNRESERVED, ["lookahead_fits"], 3, 5, timeout_s=60, out_dir=tmp_path)
    assert result.verdict is Verdict.VIOLATED
    assert (result.requests, result.violation_step) == (1, 0)
    assert not result.notes  # minimal: fewest requests, then fewest iterations
    report = replay_counterexample(result.counterexample)
    assert report.violation == report.recorded_violation == 0
    doc = json.loads(result.counterexample.read_text())
    assert doc["environment"]["speculative"] == {"accepted": [0, 4]}
    assert doc["states"][0]["requests"][0]["drafts"] == 4  # drafts proposed after its prefill


def test_the_verifiers_choices_travel_with_the_counterexample(tmp_path):
    policy = tmp_path / "tiny.yaml"
    policy.write_text(TINY)
    _, (result,) = run_verify(policy, ["lookahead_fits"], 2, 4, timeout_s=60, out_dir=tmp_path, prompt=(1, 4))
    assert result.verdict is Verdict.VIOLATED
    assert result.requests == 2 and not result.notes
    doc = json.loads(result.counterexample.read_text())
    accepted = [r.get("accepted", []) for r in doc["requests"]]
    assert any(a > 0 for row in accepted for a in row), accepted
    shown = [r["accepted"] for s in doc["states"] for r in s["requests"] if "accepted" in r]
    assert sorted(shown) == sorted(a for row in accepted for a in row)  # the states show the same choices
    assert replay_counterexample(result.counterexample).violation == result.violation_step
    # without the accepted lists (a file written before they were recorded loads unchanged: none accepted) the
    # engine's replay keeps the invariant at that iteration: the choices are what the violation needs
    rows = [{k: v for k, v in r.items() if k != "accepted"} for r in doc["requests"]]
    specs = specs_from_json(rows)
    assert all(s.accepted == () for s in specs)
    replay = replay_fixed_clock(Policy.model_validate(doc["policy"]["spec"]), specs, result.violation_step + 1, doc["clock"]["step_us"], 2)
    assert first_violation(CATALOGUE["lookahead_fits"], {}, replay) is None



def test_reserving_the_lookahead_is_proved_for_two_slots(tmp_path):
    # the fix (vLLM's reservation): whole-step induction, the verifier's choices free in every step, with the lemma
    # that a running request holds between the blocks of its computed tokens and those of its drafts and lookahead
    fixed = tmp_path / "reserved.yaml"
    fixed.write_text(UNRESERVED.read_text().replace("reserve_lookahead: false", "reserve_lookahead: true"))
    _, (result,) = run_verify(fixed, ["lookahead_fits"], 2, 3, timeout_s=120, out_dir=tmp_path, unbounded=True,
                              proof_dir=tmp_path)
    assert result.verdict is Verdict.PROVED, result.notes
    assert result.certificate is not None and result.certificate.exists()
