"""The liveness explorer finds the classic KV connector failures as lassos, and proves their fixes on the same
instance (docs/liveness.md, "KV connectors"). Each find explores a complete graph in well under a second here; the
test bounds each case at 60 s. Every lasso is replayed on the engine (prefix + two turns, whole keys with transfers
compared) and saved; the saved file replays to the same violation.
"""

from __future__ import annotations

import time

import pytest

from checker.api import apply_overrides, load_policy
from checker.liveness.canon import FIELDS_PER_REQUEST, RUNNING
from checker.liveness.check import PROVED, VIOLATED, check_liveness
from checker.liveness.explore import LivenessEnv
from checker.liveness.lasso import NO_HOLD_AND_WAIT, holds_outside
from checker.verify.replay import replay_counterexample
from tests.helpers import POLICIES

# (a) hold and wait behind a plain request: with the holders kept in the waiting queue (holders_first false) under
# strict head-of-line blocking, a request preempted for its growth is requeued at the front, ahead of a load that holds
# a block; it cannot fit while the load keeps that block, and the load is never scanned again: "Running: 0, Waiting: 2"
HOLD_AND_WAIT = ["connector.kind=offload", "connector.transfers_may_hang=false", "kv.num_blocks=3"]
HOLD_ENV = LivenessEnv(2, (32,), (1, 2))
# (b) an aborted load whose blocks wait for a report that never comes (release on_completion, a load that never
# completes, cancelled): its blocks are never reclaimed; fix: release by a deadline
LOST_ABORT = ["connector.kind=offload", "kv.num_blocks=3"]
ABORT_ENV = LivenessEnv(2, (32,), (1,), cancellations=True)
# (c) a prefill node whose decode side never reads: the finished request's blocks stay pinned; fix: a deadline
PINNED = ["connector.kind=prefill_node", "kv.num_blocks=3"]
PINNED_ENV = LivenessEnv(2, (32,), (1,))
DEADLINE = ["connector.release=deadline", "connector.release_deadline_steps=2"]
ALL = ["eventually_served", "no_livelock", "no_deadlock", NO_HOLD_AND_WAIT]

FINDS = [  # overrides, env, properties, the verdicts
    (HOLD_AND_WAIT + ["connector.holders_first=false"], HOLD_ENV, ALL, [VIOLATED, PROVED, VIOLATED, VIOLATED]),
    (HOLD_AND_WAIT + ["connector.holders_first=true"], HOLD_ENV, ALL, [PROVED] * 4),
    (LOST_ABORT + ["connector.release=on_completion"], ABORT_ENV, [NO_HOLD_AND_WAIT], [VIOLATED]),
    (LOST_ABORT + DEADLINE, ABORT_ENV, [NO_HOLD_AND_WAIT], [PROVED]),
    (LOST_ABORT + ["connector.release=immediate"], ABORT_ENV, [NO_HOLD_AND_WAIT], [PROVED]),
    (PINNED + ["connector.release=on_completion"], PINNED_ENV, ALL, [VIOLATED, PROVED, VIOLATED, VIOLATED]),
    (PINNED + DEADLINE, PINNED_ENV, ALL, [PROVED] * 4),
]
IDS = ["hold-and-wait", "hold-and-wait-fixed:holders-first", "lost-abort", "lost-abort-fixed:deadline",
       "lost-abort-fixed:immediate", "pinned", "pinned-fixed:deadline"]


def _policy(overrides):
    return apply_overrides(load_policy(POLICIES / "vllm_v1.yaml"), overrides)


@pytest.mark.parametrize("overrides,env,props,verdicts", FINDS, ids=IDS)
def test_finds_and_fixes(overrides, env, props, verdicts, tmp_path):
    started = time.monotonic()
    report = check_liveness(_policy(overrides), None, env, props, out_dir=tmp_path, overrides=overrides)
    assert time.monotonic() - started < 60
    assert report.graph.complete and report.graph.states > 30
    assert [r.verdict for r in report.results] == verdicts
    for r in report.results:
        if r.verdict == VIOLATED:  # the saved lasso replays to the same violation
            replayed = replay_counterexample(r.counterexample)
            assert replayed.violation == replayed.recorded_violation


def _cycle_keys(report, prop):
    result = next(r for r in report.results if r.prop == prop)
    return [report.graph.keys[u] for u, _ in result.lasso.cycle]


def test_the_hold_and_wait_cycle_has_nothing_running_and_a_load_holding_blocks_behind_a_plain_request():
    report = check_liveness(_policy(HOLD_AND_WAIT + ["connector.holders_first=false"]), None, HOLD_ENV,
                            ["no_deadlock"])
    for key in _cycle_keys(report, "no_deadlock"):
        fields = [key[1 + i * FIELDS_PER_REQUEST:1 + (i + 1) * FIELDS_PER_REQUEST] for i in range(key[0])]
        assert key[0] == 2 and RUNNING not in [f[1] for f in fields]  # Running: 0, Waiting: 2
        assert any(f[4] for f in fields) and any(not f[4] for f in fields)  # a holder, and a request holding nothing
        assert holds_outside(key, False)


def test_the_lost_abort_leaves_a_state_whose_held_blocks_no_continuation_frees():
    """With release on_completion, the graph has a reachable state in which a cancelled load holds blocks that are
    released never (its key's release code NEVER) and from which no state without a holder is reachable; with the
    deadline, no such state."""
    from checker.liveness.canon import NEVER_CODE, holding_count
    from checker.liveness.explore import explore
    from checker.liveness.lasso import _never_free

    for overrides, expected in ((["connector.release=on_completion"], True), (DEADLINE, False)):
        sg = explore(_policy(LOST_ABORT + overrides), ABORT_ENV)
        never = _never_free(sg)
        held_forever = []
        for u in never:
            key = sg.keys[u]
            pos = 1 + key[0] * FIELDS_PER_REQUEST
            releases = [key[pos + 2 + 2 * j] for j in range(holding_count(key, False))]
            if NEVER_CODE in releases:
                held_forever.append(u)
        assert bool(held_forever) is expected and bool(never) is expected


SHIPPED = POLICIES / "connector"
NO_HANG = ["kv.num_blocks=3", "connector.transfers_may_hang=false"]
SHIPPED_FINDS = [  # the shipped decode-node policies: vLLM 0.33 as imported, the planted in-queue scan, the fix
    ("decode_node_scan_in_queue", NO_HANG, HOLD_ENV, ["no_deadlock", NO_HOLD_AND_WAIT], [VIOLATED, VIOLATED]),
    ("decode_node_reclaim_deadline", NO_HANG, HOLD_ENV, ALL, [PROVED] * 4),
    ("vllm_v1_decode_node", ["kv.num_blocks=3"], ABORT_ENV, [NO_HOLD_AND_WAIT], [VIOLATED]),
    ("decode_node_reclaim_deadline", ["kv.num_blocks=3"], ABORT_ENV, [NO_HOLD_AND_WAIT], [PROVED]),
]


@pytest.mark.parametrize("name,overrides,env,props,verdicts", SHIPPED_FINDS,
                         ids=["scan-in-queue", "reclaim-deadline", "as-imported:lost-abort", "reclaim-deadline:aborts"])
def test_the_shipped_decode_node_policies(name, overrides, env, props, verdicts):
    started = time.monotonic()
    policy = apply_overrides(load_policy(SHIPPED / f"{name}.yaml"), overrides)
    report = check_liveness(policy, None, env, props)
    assert time.monotonic() - started < 60 and report.graph.complete
    assert [r.verdict for r in report.results] == verdicts
