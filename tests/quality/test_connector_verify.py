"""verify (z3 bounded model checking over the KV connector encoding) finds the classic failures of KV held outside
the running batch, with a minimal counterexample replayed on the engine, and their fixes hold within the bounds
(issue 16, item 3; the engine-trace finds are in test_connector_engine_finds.py, the explorer's in
test_liveness_connector_finds.py)."""

from __future__ import annotations

import json

import pytest

from checker.errors import InputError
from checker.inputfiles import load_policy
from checker.policy import Policy
from checker.verify.replay import replay_counterexample
from checker.verify.run import Verdict, run_verify
from tests.helpers import POLICIES

CONNECTOR = POLICIES / "connector"


def _verify(policy, invariant: str, requests: int, depth: int, **kw):
    env, results = run_verify(policy, [invariant], requests=requests, depth=depth, timeout_s=120, **kw)
    return env, results[0]


def _small(tmp_path, name: str, **connector):
    """A prefill-node policy on a small pool (sends confirmed 1..2 steps after the finish, or never)."""
    data = {"name": name, "max_model_len": 64, "batch": {"max_num_seqs": 2, "max_num_batched_tokens": 32},
            "kv": {"num_blocks": 8, "block_size": 4}, "connector": {"kind": "prefill_node", "max_load_steps": 2,
                                                                     **connector}}
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(data))
    return path


def test_an_aborted_load_whose_transfer_is_lost_keeps_its_blocks(tmp_path):
    """vLLM 0.33 on a decode node (release on_completion): a request admitted as a load that never completes, then
    cancelled, keeps its blocks for good: cancellation_releases(3) fails with one request; the counterexample is
    replayed on the engine (by verify) and again from its file."""
    env, r = _verify(CONNECTOR / "vllm_v1_decode_node.yaml", "cancellation_releases:steps=3", 1, 5,
                     prompt=(1, 64), output=(1, 2), out_dir=tmp_path)
    assert r.verdict is Verdict.VIOLATED and r.requests == 1 and r.violation_step == 4
    (spec,) = r.specs
    assert spec.external_tokens > 0 and spec.load_steps is None and spec.cancel_us is not None
    assert "KV connector" in env.describe()[-1]
    report = replay_counterexample(r.counterexample)
    assert report.violation == report.recorded_violation == 4


def test_the_reclaim_deadline_frees_them_within_its_steps():
    _, r = _verify(CONNECTOR / "decode_node_reclaim_deadline.yaml", "cancellation_releases:steps=8", 2, 10,
                   prompt=(1, 64), output=(1, 2), out_dir=None)
    assert r.verdict is Verdict.HOLDS_UP_TO, r.line()


def test_a_pinned_request_whose_send_is_never_confirmed_keeps_its_blocks(tmp_path):
    """A prefill node (release on_completion): a finished request's blocks stay pinned while the decode side never
    reads them: finished_releases(3) fails with one request; a deadline of one step frees them in time."""
    _, r = _verify(_small(tmp_path, "prefill_pins"), "finished_releases:steps=3", 1, 6, prompt=(1, 16),
                   output=(1, 2), out_dir=tmp_path)
    assert r.verdict is Verdict.VIOLATED and r.requests == 1, r.line()
    assert r.specs[0].send_steps is None
    _, fixed = _verify(_small(tmp_path, "prefill_deadline", release="deadline", release_deadline_steps=1),
                       "finished_releases:steps=1", 2, 6, prompt=(1, 16), output=(1, 2), out_dir=None)
    assert fixed.verdict is Verdict.HOLDS_UP_TO, fixed.line()


def test_holders_waiting_in_the_queue_order_hold_and_wait(tmp_path):
    """The planted pre-0.33 scan (decode_node_scan_in_queue.yaml: holders_first false, priority order) on a pool of
    10 blocks, loads that always complete: a loaded request blocks another one that does not fit because the loaded
    one holds the blocks: no_hold_and_wait(8) fails with two requests, replayed on the engine; the same trace passes
    with holders_first."""
    pol = load_policy(CONNECTOR / "decode_node_scan_in_queue.yaml").model_dump(mode="json")
    pol.update(max_model_len=1024)
    pol["kv"]["num_blocks"] = 10
    pol["batch"].update(max_num_seqs=4, max_num_batched_tokens=256)
    pol["connector"].update(transfers_may_hang=False, max_load_steps=2)
    path = tmp_path / "scan_in_queue_small.json"
    path.write_text(json.dumps(pol))
    _, r = _verify(path, "no_hold_and_wait:steps=8", 2, 10, prompt=(16, 160), output=(1, 4), cancellations=False,
                   out_dir=tmp_path)
    assert r.verdict is Verdict.VIOLATED and r.requests == 2 and r.violation_step == 8, r.line()
    assert any(s.external_tokens > 0 for s in r.specs)
    # the scan order is the cause: z3 may pick another trace (a more urgent request, or two loads of equal
    # priority), but every one of them passes once holders are scanned first
    pol["connector"]["holders_first"] = True
    fixed = replay_counterexample(r.counterexample, Policy.model_validate(pol))
    assert fixed.violation is None


def test_the_default_invariants_hold_on_a_small_offload_node(tmp_path):
    """Loads, holders, in-flight reservations and pinning (kind both) within the bounds: no over-commitment, the
    budgets and request conservation."""
    pol = load_policy(CONNECTOR / "vllm_v1_decode_node.yaml").model_dump(mode="json")
    pol.update(name="small_both", max_model_len=64)
    pol["kv"]["num_blocks"] = 6
    pol["kv"]["block_size"] = 4
    pol["connector"].update(kind="both", max_load_steps=2)
    path = tmp_path / "small_both.json"
    path.write_text(json.dumps(pol))
    env, results = run_verify(path, ["kv_never_overcommitted", "seq_cap", "request_conservation"], requests=2,
                              depth=3, timeout_s=120, prompt=(1, 16), output=(1, 2), out_dir=None)
    assert [r.verdict for r in results] == [Verdict.HOLDS_UP_TO] * 3, [r.line() for r in results]
    assert env.as_dict()["connector"] == {"max_load_steps": 2, "transfers_may_hang": True, "loads": True,
                                          "sends": True}


def test_unbounded_proofs_of_connector_states_are_refused_by_name():
    with pytest.raises(InputError, match="--unbounded"):
        run_verify(CONNECTOR / "vllm_v1_decode_node.yaml", ["kv_never_overcommitted"], requests=1, depth=2,
                   timeout_s=30, prompt=(1, 16), output=(1, 2), out_dir=None, unbounded=True)
