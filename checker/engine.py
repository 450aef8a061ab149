"""The reference engine: a deterministic iteration-level simulator that iterates the one step.

Time comes from a service-curve profile: a step that schedules tokens takes ``profile.step_us``;
a step that schedules nothing takes no time, and when nothing at all can happen the clock jumps
to the next external event (arrival, cancel, timeout, aging boundary). A state in which requests
remain but no event is left is a deadlock: the run stops and reports the stuck requests.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from checker.fastforward import apply_stretch, is_quiet_decode_step, stretch_durations
from checker.metrics import RequestTimes, summarize
from checker.policy import Policy, QueueOrder
from checker.profile import Profile
from checker.semantics.decision import StepDecision
from checker.semantics.state import TERMINAL, Request, SchedulerState, Status
from checker.semantics.step import step
from checker.traces import RequestSet

DEFAULT_MAX_STEPS = 50_000_000


@dataclass
class SimResult:
    policy: Policy
    requests: RequestSet
    profile: Profile
    state: SchedulerState
    times: RequestTimes
    decisions: list[StepDecision] | None
    steps: int
    end_us: int
    wall_s: float
    stuck: list[int] = field(default_factory=list)  # rids left unfinished with no event to unblock them
    step_limit_hit: bool = False
    kv_peak_blocks: int = 0
    running_peak: int = 0
    waiting_peak: int = 0
    idle_slot_steps: int = 0  # steps that left a slot free while a request waited
    busy_us: int = 0

    def summary(self) -> dict:
        return summarize(self)


class _Clock:
    """External events the engine feeds into steps: arrivals and cancels, in time order."""

    def __init__(self, requests: list[Request]):
        self.arrivals = sorted(requests, key=lambda r: (r.arrival_us, r.rid))
        self.cancels = sorted((r for r in requests if r.spec.cancel_us is not None),
                              key=lambda r: (r.spec.cancel_us, r.rid))
        self.ai = 0
        self.ci = 0

    def due(self, now_us: int) -> tuple[list[Request], list[Request]]:
        arrived, cancelled = [], []
        arrivals, cancels = self.arrivals, self.cancels
        while self.ai < len(arrivals) and arrivals[self.ai].arrival_us <= now_us:
            arrived.append(arrivals[self.ai])
            self.ai += 1
        while self.ci < len(cancels) and cancels[self.ci].spec.cancel_us <= now_us:
            cancelled.append(cancels[self.ci])
            self.ci += 1
        return arrived, cancelled

    def next_time(self) -> int | None:
        times = []
        if self.ai < len(self.arrivals):
            times.append(self.arrivals[self.ai].arrival_us)
        if self.ci < len(self.cancels):
            times.append(self.cancels[self.ci].spec.cancel_us)
        return min(times) if times else None


def _next_internal_event(s: SchedulerState, now_us: int) -> int | None:
    """Times at which a quiet state can change without input: queue timeouts and aging boundaries."""
    p = s.policy
    times = []
    if p.timeouts.queue_timeout_ms is not None:
        limit = p.timeouts.queue_timeout_ms * 1000
        times.extend(r.arrival_us + limit + 1 for r in s.waiting if r.admitted_seq == 0)
    if p.queue.order is QueueOrder.PRIORITY_AGING and len(s.waiting) > 1:
        interval = p.queue.aging_interval_ms * 1000
        times.extend(now_us + interval - (now_us - r.arrival_us) % interval for r in s.waiting)
    later = [t for t in times if t > now_us]
    return min(later) if later else None


def simulate(policy: Policy, requests: RequestSet, profile: Profile, record: bool = False,
             max_steps: int = DEFAULT_MAX_STEPS, fast_forward: bool = True) -> SimResult:
    """Run the requests through the policy. ``record`` keeps every StepDecision (and turns
    fast-forward off, so each step has its record)."""
    fast_forward = fast_forward and not record
    started = time.perf_counter()
    s = SchedulerState(policy, requests.specs, num_tenants=len(requests.tenant_names))
    reqs = s.requests
    clock = _Clock(reqs)
    times = RequestTimes(len(reqs))
    decisions: list[StepDecision] | None = [] if record else None
    result = SimResult(policy, requests, profile, s, times, decisions, 0, 0, 0.0)
    now = clock.arrivals[0].arrival_us if reqs else 0
    unfinished = len(reqs)
    max_seqs = policy.batch.max_num_seqs
    while unfinished or s.holding:
        if result.steps >= max_steps:
            result.step_limit_hit = True
            break
        arrived, cancelled = clock.due(now)
        d = step(s, arrived, cancelled, now)
        result.steps += 1
        if decisions is not None:
            decisions.append(d)
        dt = profile.step_us(d) if d.scheduled else 0
        times.observe(d, reqs, now, now + dt)
        unfinished -= len(d.finished) + len(d.rejected) + len(d.cancelled)
        if d.kv_blocks_used > result.kv_peak_blocks:
            result.kv_peak_blocks = d.kv_blocks_used
        if d.num_running > result.running_peak:
            result.running_peak = d.num_running
        if d.num_waiting > result.waiting_peak:
            result.waiting_peak = d.num_waiting
        if d.num_waiting and d.num_running < max_seqs:
            result.idle_slot_steps += 1
        if dt:
            now += dt
            result.busy_us += dt
            if fast_forward and is_quiet_decode_step(s, d):
                now = _skip_quiet_decodes(s, result, clock, now, max_steps)
        elif d.is_quiet and not s.holding:
            nxt = [t for t in (clock.next_time(), _next_internal_event(s, now)) if t is not None]
            if not nxt:
                break  # nothing can happen any more
            now = max(now, min(nxt))
    result.end_us = now
    result.stuck = [r.rid for r in reqs if r.status not in TERMINAL]
    result.wall_s = time.perf_counter() - started
    return result


def _skip_quiet_decodes(s: SchedulerState, result: SimResult, clock: _Clock, now: int, max_steps: int) -> int:
    horizon = [t for t in (clock.next_time(), _next_internal_event(s, now)) if t is not None]
    durations = stretch_durations(s, result.profile, now, min(horizon) if horizon else None,
                                  max_steps - result.steps)
    if not durations:
        return now
    k, total = len(durations), sum(durations)
    apply_stretch(s, k)
    t = result.times
    longest = max(durations)
    for r in s.running:
        rid = r.rid
        t.tokens_scheduled[rid] += k
        t.last_token[rid] = now + total
        if longest > t.max_gap[rid]:
            t.max_gap[rid] = longest
    result.steps += k
    result.busy_us += total
    result.kv_peak_blocks = max(result.kv_peak_blocks, s.kv_used)
    if s.waiting and len(s.running) < s.policy.batch.max_num_seqs:
        result.idle_slot_steps += k
    return now + total


def check_conservation(s: SchedulerState) -> None:
    """Every request is in exactly one place; the KV counters equal the sums (used by tests)."""
    running = {r.rid for r in s.running}
    waiting = {r.rid for r in s.waiting}
    assert len(running) == len(s.running) and len(waiting) == len(s.waiting), "duplicate in a queue"
    assert not running & waiting, "request both running and waiting"
    for r in s.requests:
        in_running, in_waiting = r.rid in running, r.rid in waiting
        assert in_running == (r.status is Status.RUNNING), r
        assert in_waiting == (r.status in (Status.WAITING, Status.SWAPPED)), r
    assert s.kv_used == sum(r.blocks for r in s.requests), "kv_used is not the sum of blocks held"
    assert s.swap_used == sum(r.swapped_blocks for r in s.requests), "swap_used is not the sum"
