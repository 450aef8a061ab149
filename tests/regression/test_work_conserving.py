"""work_conserving judges capacity as the scheduler saw it (issue: blocks freed by a request finishing in the
step counted as idle capacity, and every step that preempted was excused)."""

from __future__ import annotations

from checker.policy import Policy
from checker.requests import RequestSpec
from checker.smt.ops import IntOps
from checker.verify.replay import replay_fixed_clock
from invariants.catalogue import CATALOGUE

WORK_CONSERVING = CATALOGUE["work_conserving"]


def policy(**sections) -> Policy:
    return Policy.model_validate({"max_model_len": 1000, "kv": {"num_blocks": 4, "block_size": 16}, **sections})


def failing_steps(p: Policy, specs: list[RequestSpec], steps: int) -> list[int]:
    replay = replay_fixed_clock(p, specs, steps, 1000)
    return [t for t in range(steps) if not WORK_CONSERVING.holds(IntOps, replay.ctx, t)]


def test_blocks_freed_by_a_request_finishing_in_the_step_were_not_free_when_it_was_scheduled():
    # A (3 blocks) computes its prompt and finishes in step 0; B (2 blocks) did not fit the 1 free block then
    specs = [RequestSpec(0, 0, 48, 1, 1), RequestSpec(1, 0, 32, 3, 3)]
    skip = policy(queue={"head_of_line": "skip"})
    assert failing_steps(skip, specs, 3) == []


def test_a_step_that_preempted_and_left_room_for_a_waiting_request_is_not_excused():
    # vLLM v1: no admissions in a step that preempted for KV growth. A and B (2 blocks each) run, C arrives;
    # in step 2 B's growth preempts B, which frees 2 blocks: C (1 block) would fit but is not admitted
    specs = [RequestSpec(0, 0, 17, 40, 40), RequestSpec(1, 0, 31, 40, 40), RequestSpec(2, 1000, 8, 1, 1)]
    blocked = policy(admission={"reserve_full_prompt": False})
    admits = blocked.model_copy(update={"preemption": blocked.preemption.model_copy(
        update={"block_admission_after_preempt": False})})
    assert replay_fixed_clock(blocked, specs, 3, 1000).decisions[2].preempted == (1,)
    assert failing_steps(blocked, specs, 3) == [2]  # (after it, C waits behind B at the strict queue head)
    assert failing_steps(admits, specs, 6) == []  # admitting in that step conserves the work
