"""The liveness explorer with a KV connector (policy.connector): the environment's transfer choices and the canonical
key of connector states (checker/liveness/canon.py, explore.py; docs/liveness.md, "KV connectors")."""

from __future__ import annotations

import pytest

from checker.api import apply_overrides, load_policy
from checker.errors import InputError
from checker.liveness.canon import FIELDS_PER_REQUEST, NEVER_CODE, T_AT, T_NEVER, T_NONE, Canon
from checker.liveness.check import liveness_env, run_liveness
from checker.liveness.explore import EXTERNAL_ALL, EXTERNAL_BLOCK, LivenessEnv, explore, instance_env
from checker.requests import RequestSpec
from checker.semantics.state import NEVER, SchedulerState, Status
from checker.semantics.step import step
from tests.conformance.test_liveness_connector_conformance import CASES, IDS
from tests.helpers import POLICIES

OFFLOAD = ["connector.kind=offload", "kv.num_blocks=8"]


def _policy(overrides, name="vllm_v1"):
    return apply_overrides(load_policy(POLICIES / f"{name}.yaml"), list(overrides))


@pytest.mark.parametrize("name,overrides,env", CASES, ids=IDS)
def test_every_key_decodes_to_a_representative_with_the_same_key(name, overrides, env):
    policy = _policy(overrides, name)
    sg = explore(policy, env, max_states=3000)
    for key in sg.keys:
        s, now = sg.canon.decode(key)
        assert sg.canon.encode(s, now) == key
        assert s.loads_in_flight == sum(r.status is Status.LOADING for r in s.requests)
        if policy.connector.holders_first and policy.connector.loads:  # holders: not running, holding blocks
            assert all(r.blocks and r.status is not Status.RUNNING for r in s.holders)
            assert not any(r.blocks for r in s.waiting)


def test_arrivals_choose_external_hits_and_load_latencies_from_the_policy():
    policy = _policy(OFFLOAD + ["connector.max_load_steps=2"])
    env = liveness_env(policy, prompts=(32,), outputs=(1,))
    assert env.external == (0, 16, EXTERNAL_ALL) and env.load_steps == (1, 2, None) and env.send_steps is None
    transfers = [c[6] for c in env.classes()]
    assert transfers == [(0, 1, 0), (16, 1, 0), (16, 2, 0), (16, None, 0), (32, 1, 0), (32, 2, 0), (32, None, 0)]
    assert "load reported after {1, 2, never}" in env.describe()[-1]
    assert env.as_dict()["external_tokens"] == ["none", "16", "all"]
    no_hang = liveness_env(_policy(OFFLOAD + ["connector.transfers_may_hang=false"]), prompts=(16,), outputs=(1,),
                           external=(0, EXTERNAL_BLOCK))
    assert [c[6] for c in no_hang.classes()] == [(0, 1, 0)] + [(16, n, 0) for n in (1, 2, 3, 4)]
    prefill = liveness_env(_policy(["connector.kind=prefill_node", "connector.max_load_steps=2"]))
    assert prefill.external is None and prefill.send_steps == (0, 1, None)
    assert [c[6] for c in prefill.classes()] == [(0, 1, 0), (0, 1, 1), (0, 1, None)] * 2  # two outputs


def test_without_a_connector_nothing_changes_and_external_hits_are_refused():
    policy = _policy(["kv.num_blocks=8"])
    env = instance_env(policy, LivenessEnv(2, (16,), (2,)))
    assert env == LivenessEnv(2, (16,), (2,)) and all(len(c) == 6 for c in env.classes())
    s = SchedulerState(policy, [RequestSpec(0, 0, 16, 2, 2)])
    step(s, list(s.requests), [], 0)
    canon = Canon(policy, 10_000, classes=env.classes())
    assert canon.encode(s, 10_000) == (1, 0, int(Status.RUNNING), 16, 1, 1, 0, 1, 0, 0)  # no connector section
    with pytest.raises(InputError, match="--external"):
        run_liveness(POLICIES / "vllm_v1.yaml", external=(0, 16))


def _loading(policy, load_steps, start_step: int = 0, output: int = 1):
    """A request admitted as a load in step ``start_step`` (the steps before it: empty)."""
    s = SchedulerState(policy, [RequestSpec(0, start_step * 10_000, 32, output, output, external_tokens=16,
                                            load_steps=load_steps)])
    s.step = start_step
    step(s, list(s.requests), [], start_step * 10_000)
    assert s.requests[0].status is Status.LOADING
    return s, (start_step + 1) * 10_000


def _section(canon: Canon, key: tuple) -> tuple:
    """The connector section of a key without ages, tenants or pool: after the holding entries."""
    m = key[0]
    pos = 1 + m * FIELDS_PER_REQUEST
    return key[pos + 1 + 2 * key[pos]:]


def test_the_key_keeps_a_loads_remaining_latency_relative_to_the_clock_and_never_as_never():
    policy = _policy(OFFLOAD + ["connector.max_load_steps=3"])
    canon = Canon(policy, 10_000)
    keys = {n: canon.encode(*_loading(policy, n)) for n in (1, 2, 3, None)}
    assert [_section(canon, keys[n]) for n in (1, 2, 3, None)] == [(T_AT - 1, 1), (T_AT, 1), (T_AT + 1, 1), (T_NEVER, 1)]
    assert len(set(keys.values())) == 4
    assert canon.encode(*_loading(policy, 3, start_step=7)) == keys[3]  # the same load later: the same key
    s, now = canon.decode(keys[3])
    assert s.requests[0].transfer_step == 1 and s.holders == s.requests and s.loads_in_flight == 1
    assert canon.decode(keys[None])[0].requests[0].transfer_step == NEVER


def test_the_key_keeps_the_holders_queue_order():
    """Two loads in the holders' queue: which started first decides which the scan promotes first."""
    policy = _policy(OFFLOAD + ["connector.max_load_steps=3"])
    canon = Canon(policy, 10_000)
    specs = [RequestSpec(i, 0, 32, 1, 1, external_tokens=16, load_steps=2) for i in range(2)]
    s = SchedulerState(policy, specs)
    step(s, list(s.requests), [], 0)
    assert [r.rid for r in s.holders] == [0, 1]
    key = canon.encode(s, 10_000)
    s.holders.reverse()
    swapped = canon.encode(s, 10_000)
    assert key != swapped and _section(canon, key)[1::2] == (1, 2) and _section(canon, swapped)[1::2] == (2, 1)
    decoded, _ = canon.decode(swapped)
    assert [r.rid for r in decoded.holders] == [1, 0]


def test_the_key_keeps_cancelled_loads_and_pinned_requests_with_releases_that_never_come():
    policy = _policy(OFFLOAD)  # release on_completion
    canon = Canon(policy, 10_000)
    s, _ = _loading(policy, None)
    step(s, [], list(s.requests), 10_000)  # the client aborts the load: its block waits for a report that never comes
    r = s.requests[0]
    assert r.status is Status.CANCELLED and r.blocks == 1 and r.release_step == NEVER
    key = canon.encode(s, 20_000)
    assert key[:4] == (0, 1, 1, NEVER_CODE) and _section(canon, key) == (T_NEVER,)
    assert canon.encode(*_later(s, 5)) == key  # stepping on changes nothing
    held = canon.decode(key)[0].holding[0]
    assert (held.blocks, held.release_step, held.transfer_step) == (1, NEVER, NEVER)

    deadline = _policy(OFFLOAD + ["connector.release=deadline", "connector.release_deadline_steps=3"])
    s, _ = _loading(deadline, 3)
    step(s, [], list(s.requests), 10_000)  # aborted in step 1: freed at the report (end of step 2) or in step 4
    key = Canon(deadline, 10_000).encode(s, 20_000)
    assert s.holding and key[:4] == (0, 1, 1, 2) and _section(canon, key) == (T_AT,)  # report at the end of step 2

    pinned = _policy(["connector.kind=prefill_node", "kv.num_blocks=8"])
    s = SchedulerState(pinned, [RequestSpec(0, 0, 16, 1, 1, send_steps=None)])
    step(s, list(s.requests), [], 0)
    assert s.requests[0].status is Status.FINISHED and s.requests[0].blocks == 1
    key = Canon(pinned, 10_000).encode(s, 10_000)
    assert key == (0, 1, 1, NEVER_CODE, T_NEVER)  # a pinned holder: its place and block are taken forever
    assert holding_place_taken(pinned, key)


def holding_place_taken(policy, key) -> bool:
    """A holding request takes a place of the instance: with one place nothing more arrives."""
    from checker.liveness.explore import Transition

    env = LivenessEnv(1, (16,), (1,), send_steps=(None,))
    trans = Transition(Canon(policy, 10_000, classes=env.classes()), env)
    return trans.choices(key)[0] == [()]


def _later(s: SchedulerState, steps: int) -> tuple[SchedulerState, int]:
    for _ in range(steps):
        step(s, [], [], (s.step) * 10_000)
    return s, (s.step) * 10_000


def test_a_transfer_of_the_past_is_kept_only_as_had_one():
    """A request whose load is done and that runs: its load latency and external hit are no longer read, so its
    class forgets them (the key of a plain class with T_AT - 1, 'had a transfer', which decides it never loads
    again)."""
    policy = _policy(OFFLOAD)
    canon = Canon(policy, 10_000)
    keys = []
    for n in (1, 2):
        s, now = _loading(policy, n, output=4)
        s, now = _later(s, n)
        assert s.requests[0].status is Status.RUNNING
        keys.append(canon.encode(s, now))
    assert keys[0] == keys[1] and _section(canon, keys[0]) == (T_AT - 1, 0)
    s, _ = canon.decode(keys[0])
    assert s.requests[0].transfer_step not in (-1, NEVER) and s.requests[0].spec.external_tokens == 0
    assert _section(canon, canon.encode(SchedulerState(policy, [RequestSpec(0, 0, 16, 1, 1)]), 0)) == ()
    assert T_NONE == 0


def test_the_classes_loads_turn_into_are_registered_up_front_so_workers_name_them_alike():
    """With --external all only, a request whose load started has a class no arrival has (no external hit): the Canon
    registers it with the instance's classes, so every worker process gives it the same id."""
    policy = _policy(["connector.kind=offload", "kv.num_blocks=4", "connector.max_load_steps=2"])
    env = LivenessEnv(3, (32,), (1, 2), cancellations=True, arrivals_per_step=1, external=(EXTERNAL_ALL,))
    one = explore(policy, env)
    assert one.complete and one.keys == explore(policy, env, workers=2).keys
    assert len(one.canon.classes) == len(one.env.classes()) + 2  # and the two outputs with no external hit
