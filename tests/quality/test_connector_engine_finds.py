"""The classic failures of KV held outside the running batch, found by the connector invariants on engine traces,
and their fixes holding on the same traces (issue 16, item 3; the solver and explorer finds are in
test_connector_verify.py and test_liveness_connector_finds.py)."""

from __future__ import annotations

from checker.policy import Policy
from checker.requests import RequestSpec
from checker.verify.replay import first_violation, replay_fixed_clock
from invariants.catalogue import CATALOGUE

STEP_US = 1000


def _policy(**connector) -> Policy:
    return Policy.model_validate({
        "max_model_len": 1024, "kv": {"num_blocks": 10, "block_size": 16},
        "queue": {"order": "priority"}, "batch": {"max_num_seqs": 4, "max_num_batched_tokens": 256},
        "connector": {"kind": "decode_node", **connector}})


# A (priority 1, worse) loads 4 of its 6 blocks; B (priority 0) arrives and needs 7 of the 6 blocks left.
HOLD_AND_WAIT = [RequestSpec(0, 0, 96, 4, 4, priority=1, external_tokens=64, load_steps=2),
                 RequestSpec(1, STEP_US, 112, 4, 4, priority=0)]


def test_a_loaded_request_behind_a_request_that_cannot_fit_holds_its_blocks_for_good():
    """holders_first false (the pre-0.33 scan: holders stay in the waiting queue, in its order): B heads the queue
    and does not fit because A holds blocks; strict head-of-line blocking never reaches A: Running 0, Waiting 2."""
    replay = replay_fixed_clock(_policy(holders_first=False), HOLD_AND_WAIT, 20, STEP_US)
    assert first_violation(CATALOGUE["no_hold_and_wait"], {"steps": 8}, replay) == 8
    assert first_violation(CATALOGUE["no_deadlock"], {"steps": 2}, replay) is not None
    last = replay.decisions[-1]
    assert (last.num_running, last.num_waiting, last.kv_blocks_used) == (0, 2, 4)


def test_scanning_the_holders_first_lets_the_loaded_request_run_and_release():
    replay = replay_fixed_clock(_policy(holders_first=True), HOLD_AND_WAIT, 40, STEP_US)
    for name, params in (("no_hold_and_wait", {"steps": 8}), ("no_deadlock", {"steps": 2}),
                         ("request_conservation", {})):
        assert first_violation(CATALOGUE[name], params, replay) is None, name
    assert all(r.status.name == "FINISHED" for r in replay.state.requests)


# A load that is never reported, aborted at step 2.
LOST_LOAD = [RequestSpec(0, 0, 64, 4, 4, external_tokens=64, load_steps=None, cancel_us=2 * STEP_US),
             RequestSpec(1, 0, 32, 4, 4)]


def test_an_aborted_load_whose_report_never_comes_keeps_its_blocks_forever():
    """release on_completion (vLLM 0.33): the blocks wait for finished_recving, which a lost load never sends."""
    replay = replay_fixed_clock(_policy(), LOST_LOAD, 12, STEP_US)
    assert first_violation(CATALOGUE["cancellation_releases"], {"steps": 3}, replay) == 5
    assert first_violation(CATALOGUE["request_conservation"], {}, replay) is None  # held, not lost
    assert replay.decisions[-1].kv_blocks_used == 4


def test_a_release_deadline_reclaims_the_aborted_loads_blocks():
    replay = replay_fixed_clock(_policy(release="deadline", release_deadline_steps=3), LOST_LOAD, 12, STEP_US)
    assert first_violation(CATALOGUE["cancellation_releases"], {"steps": 3}, replay) is None
    assert replay.decisions[-1].kv_blocks_used == 0


def test_a_prefill_node_whose_decode_side_never_reads_pins_blocks_until_the_deadline():
    specs = [RequestSpec(0, 0, 48, 1, 1, send_steps=None), RequestSpec(1, 0, 48, 1, 1, send_steps=0)]
    pinned = replay_fixed_clock(_policy(kind="prefill_node"), specs, 10, STEP_US)
    assert first_violation(CATALOGUE["finished_releases"], {"steps": 4}, pinned) == 4
    fixed = replay_fixed_clock(_policy(kind="prefill_node", release="deadline", release_deadline_steps=2), specs, 10,
                               STEP_US)
    assert first_violation(CATALOGUE["finished_releases"], {"steps": 4}, fixed) is None
    assert [d.kv_blocks_used for d in fixed.decisions[:4]] == [6, 3, 0, 0]
