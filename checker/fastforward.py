"""Fast-forward over quiet decode stretches: the closed form of iterating the step.

After a step in which every running request decoded one token and nothing else happened, the next
steps do the same until an event: a request reaches its last token, the pool runs out of blocks, or
an external or internal event is due. Those steps change the state in a way that has a closed form
(every running request gains k tokens; block counts follow), so the engine applies them at once.

Why the waiting queue stays blocked: in the quiet step the waiting pass admitted nothing, and during
the stretch every admission condition can only get harder (free blocks fall, the budget left and the
running count stay the same). Orders whose keys change while requests wait (aging, tenant counters)
are excluded when anyone waits. With nobody waiting and every running request one token behind, the
stretch can start right after any step. tests/conformance/test_fastforward.py pins this module to plain
stepping: same final state, same metrics.
"""

from __future__ import annotations

from checker.profile import Profile
from checker.semantics.decision import StepDecision
from checker.semantics.kv import blocks_for
from checker.semantics.order import time_varying
from checker.semantics.state import SchedulerState
from checker.policy import QueueOrder


def next_steps_are_quiet_decodes(s: SchedulerState, d: StepDecision) -> bool:
    """Whether the steps after d (until an event) only decode one token per running request.

    Either d itself was such a step (then the waiting queue is blocked and stays blocked), or nobody
    waits and every running request is one token behind (then there is nothing else to schedule).
    """
    if not s.running or s.holding or s.pool is not None:  # with block identity decodes cache and evict blocks
        return False
    if not s.waiting:
        return all(r.num_generated and r.num_computed + 1 == r.prompt_len + r.num_generated for r in s.running)
    return bool(
        len(d.scheduled) == len(s.running) and not d.num_prefill_tokens
        and not (d.arrived or d.admitted or d.preempted or d.finished or d.rejected or d.cancelled or d.released)
        and not time_varying(s))


def stretch_durations(s: SchedulerState, profile: Profile, start_us: int, horizon_us: int | None,
                      max_steps: int) -> list[int]:
    """Durations of the quiet decode steps that follow, each starting before horizon_us, while no
    request reaches its last token and the pool has the blocks the decodes need."""
    p = s.policy
    running = s.running
    max_len = p.max_model_len
    k = min(min(r.output_len, max_len - r.prompt_len) - r.num_generated for r in running) - 1
    k = min(k, max_steps)
    if k <= 0:
        return []
    durations = profile.decode_steps_us(len(running), sum(r.num_computed for r in running), k, start_us, horizon_us)
    k = len(durations)
    if k and p.kv.check_allocation:
        free = p.kv.num_blocks - s.kv_used
        size = p.kv.block_size

        def need(j: int) -> int:
            return sum(max(0, blocks_for(r.num_computed + j, size) - r.blocks) for r in running)

        if need(k) > free:
            lo, hi = 0, k  # need(lo) <= free < need(hi)
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if need(mid) <= free:
                    lo = mid
                else:
                    hi = mid
            del durations[lo:]
    return durations


def apply_stretch(s: SchedulerState, k: int) -> None:
    """The state after k quiet decode steps."""
    p = s.policy
    size = p.kv.block_size
    added = 0
    for r in s.running:
        r.num_computed += k
        r.num_generated += k
        target = blocks_for(r.num_computed, size)
        if target > r.blocks:
            added += target - r.blocks
            r.blocks = target
    s.kv_used += added
    if p.queue.order is QueueOrder.TENANT_FAIR:
        weight = p.queue.vtc_weights.output_weight
        for r in s.running:
            s.tenant_counters[r.tenant] += weight * k
    s.step += k
