"""The reference engine: a deterministic iteration-level simulator that iterates the one step.

Time comes from a service-curve profile: a step that schedules tokens takes ``profile.step_us``;
a step that schedules nothing takes no time, and when nothing at all can happen the clock jumps
to the next external event (arrival, cancel, timeout, aging boundary). A state in which requests
remain but no event is left is a deadlock: the run stops and reports the stuck requests.
"""

from __future__ import annotations

import gc
import time
from bisect import bisect_left
from dataclasses import dataclass, field
from itertools import accumulate

from checker.fastforward import (apply_stretch, arrivals_may_join, finish_stretch, finishing_step, joins_behind_head,
                                 may_finish_in_stretch, next_steps_are_quiet_decodes, stretch_durations)
from checker.metrics import RequestTimes, summarize
from checker.policy import Policy, QueueOrder
from checker.profile import Profile
from checker.semantics.decision import DecisionBuilder, StepDecision
from checker.semantics.kv import blocks_for
from checker.semantics.state import TERMINAL, Request, SchedulerState
from checker.semantics.step import arrive_phase, step
from checker.semantics.transfer import steps_pending
from checker.semantics.blocked import pending
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
    livelock: bool = False  # stopped: tokens kept being scheduled but no request made progress
    kv_peak_blocks: int = 0
    running_peak: int = 0
    waiting_peak: int = 0
    idle_slot_steps: int = 0  # steps that left a slot free while a request waited
    busy_us: int = 0
    request_steps: int = 0  # (request, step) pairs in which the request was scheduled

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

    def next_cancel_time(self) -> int | None:
        return self.cancels[self.ci].spec.cancel_us if self.ci < len(self.cancels) else None


def _next_timeout(s: SchedulerState, now_us: int) -> int | None:
    """When the next waiting request passes the queue timeout (now, if one has passed it and the next step's
    expire phase has yet to reject it: a quiet-decode stretch must not run past that step)."""
    if s.policy.timeouts.queue_timeout_ms is None:
        return None
    limit = s.policy.timeouts.queue_timeout_ms * 1000
    due = [r.arrival_us + limit + 1 for r in s.waiting if r.admitted_seq == 0]
    return max(min(due), now_us) if due else None


def _next_aging_boundary(s: SchedulerState, now_us: int) -> int | None:
    """When a waiting request's aged priority next changes (only then can the queue order change)."""
    if s.policy.queue.order is not QueueOrder.PRIORITY_AGING or len(s.waiting) < 2:
        return None
    interval = s.policy.queue.aging_interval_ms * 1000
    return min(now_us + interval - (now_us - r.arrival_us) % interval for r in s.waiting)


def _next_internal_event(s: SchedulerState, now_us: int) -> int | None:
    """Times at which a state can change without input: queue timeouts and aging boundaries."""
    times = [t for t in (_next_timeout(s, now_us), _next_aging_boundary(s, now_us)) if t is not None]
    return min(times) if times else None


def _wake_time(s: SchedulerState, clock: _Clock, now_us: int, quiet_since: int) -> int | None:
    """The next time a quiet state can change. Aging orders repeat with the aging interval, so after
    one full interval of quiet steps no further boundary can unblock anything (a deadlock)."""
    times = [t for t in (clock.next_time(), _next_timeout(s, now_us)) if t is not None]
    aging = _next_aging_boundary(s, now_us)
    if aging is not None and aging - quiet_since <= s.policy.queue.aging_interval_ms * 1000:
        times.append(aging)
    return min(times) if times else None


def simulate(policy: Policy, requests: RequestSet, profile: Profile, record: bool = False,
             max_steps: int = DEFAULT_MAX_STEPS, fast_forward: bool = True) -> SimResult:
    """Run the requests through the policy. ``record`` keeps every StepDecision (and turns
    fast-forward off, so each step has its record).

    Python's cyclic garbage collector is off while the engine runs: the loop makes no reference cycles
    (its garbage goes by reference counts), but with prefix caching the chain interning table holds
    millions of tuples, and every full collection walked them all (9.6 s of a 30 s replay of 3,000
    Mooncake requests)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        return _simulate(policy, requests, profile, record, max_steps, fast_forward)
    finally:
        if enabled:
            gc.enable()


def _simulate(policy: Policy, requests: RequestSet, profile: Profile, record: bool, max_steps: int,
              fast_forward: bool) -> SimResult:
    fast_forward = fast_forward and not record
    started = time.perf_counter()
    s = SchedulerState(policy, requests.specs, num_tenants=len(requests.tenant_names))
    reqs = s.requests
    clock = _Clock(reqs)
    times = RequestTimes(len(reqs))
    # async scheduling (policy.pipeline): a finish is processed in the step after the one computing the last token,
    # but the client has that token when the step computing it ends: the request is done at its last token
    done_at_last_token = policy.pipeline.enabled
    decisions: list[StepDecision] | None = [] if record else None
    result = SimResult(policy, requests, profile, s, times, decisions, 0, 0, 0.0)
    now = clock.arrivals[0].arrival_us if reqs else 0
    unfinished = len(reqs)
    max_seqs = policy.batch.max_num_seqs
    stall_tokens, stall_limit = 0, LIVELOCK_SLACK_TOKENS
    quiet_since: int | None = None
    while unfinished or s.holding:
        if result.steps >= max_steps:
            result.step_limit_hit = True
            break
        arrived, cancelled = clock.due(now)
        d = step(s, arrived, cancelled, now)
        result.steps += 1
        result.request_steps += len(d.scheduled)
        if decisions is not None:
            decisions.append(d)
        dt = profile.step_us(d) if d.scheduled else 0
        times.observe(d, reqs, now, now + dt)
        if done_at_last_token and d.finished:
            for rid in d.finished:
                times.done[rid] = times.last_token[rid]
        unfinished -= len(d.finished) + len(d.rejected) + len(d.cancelled)
        if d.produced or d.rejected or d.cancelled:
            stall_tokens = 0
        else:
            stall_tokens += max(1, d.num_scheduled_tokens)  # a step that schedules nothing counts as 1
            if stall_tokens > stall_limit:
                stall_limit = _livelock_limit(s)
                if stall_tokens > stall_limit:
                    result.livelock = True
                    break
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
            if fast_forward and next_steps_are_quiet_decodes(s, d):
                now, left = _skip_quiet_decodes(s, result, clock, now, max_steps)
                unfinished -= left
        if not d.is_quiet:
            quiet_since = None
        elif (not (s.holding or s.loads_in_flight) or not steps_pending(s)) and not (s.blocked and pending(s)):
            # (held blocks or loads whose release or report never comes do not keep the engine stepping; a grammar
            # still compiling does: checker.semantics.blocked)
            quiet_since = now if quiet_since is None else quiet_since
            wake = _wake_time(s, clock, now, quiet_since)
            if wake is None:
                break  # nothing can happen any more
            now = max(now, wake)
    result.end_us = now
    result.stuck = [r.rid for r in reqs if r.status not in TERMINAL]
    result.wall_s = time.perf_counter() - started
    return result


LIVELOCK_SLACK_TOKENS = 1000


def _livelock_limit(s: SchedulerState) -> int:
    """Work (tokens scheduled, or 1 for a step that schedules none) that may pass without any request
    producing a token: with no recompute, every live request's gap closes within this; twice that plus
    slack means work is thrown away over and over (recompute thrash, or admit-and-preempt ping-pong).
    The engine stops there and reports a suspected livelock."""
    live = sum(r.prompt_len + r.num_generated for r in s.requests if r.status not in TERMINAL)
    return 2 * live + LIVELOCK_SLACK_TOKENS


def quiet_stretch(s: SchedulerState, profile: Profile, clock: _Clock, now: int,
                  max_steps: int) -> tuple[list[int], bool, list[tuple[int, int]]]:
    """The quiet decode steps that follow a step ending at ``now`` (the engine's and check-log's lockstep engine's
    one plan): their durations (none: step plainly), whether the last of them is the step in which the first
    requests reach their last token (fastforward.may_finish_in_stretch: finish_stretch after apply_stretch), and the
    arrivals that joined the stretch behind the queue's head (fastforward.arrivals_may_join) and were rejected, with
    the start of their step. The arrivals that joined are taken from the clock, their arrive phase run."""
    join = arrivals_may_join(s)
    horizon = [t for t in (clock.next_cancel_time() if join else clock.next_time(), _next_internal_event(s, now))
               if t is not None]
    last = finishing_step(s) if may_finish_in_stretch(s) else None  # the stretch may end with that step
    durations = stretch_durations(s, profile, now, min(horizon) if horizon else None, max_steps, last)
    rejected = join_arrivals(s, clock, now, durations) if join and durations else []
    return durations, bool(durations) and len(durations) == last, rejected


def _skip_quiet_decodes(s: SchedulerState, result: SimResult, clock: _Clock, now: int,
                        max_steps: int) -> tuple[int, int]:
    """Apply the quiet decode steps that follow; return the time after them and how many requests ended in them:
    arrivals rejected (arrivals behind the queue's head join the stretch: fastforward.arrivals_may_join), and the
    requests finished by its last step when that is the step in which the first ones reach their last token
    (fastforward.may_finish_in_stretch)."""
    durations, finishing, rejects = quiet_stretch(s, result.profile, clock, now, max_steps - result.steps)
    for rid, start in rejects:
        result.times.done[rid] = start  # the start of their step, as RequestTimes.observe sets it
    rejected = len(rejects)
    if not durations:
        return now, rejected
    k, total = len(durations), sum(durations)
    running, max_seqs = len(s.running), s.policy.batch.max_num_seqs
    if finishing:  # the last step finishes requests (finish_stretch); the blocks used after the step before it (they
        # only grow until then): its decodes' takes
        size = s.policy.kv.block_size
        before_last = s.kv_used + sum(max(0, blocks_for(r.num_computed + k - 1, size) - r.blocks) for r in s.running)
        result.kv_peak_blocks = max(result.kv_peak_blocks, before_last)
    apply_stretch(s, k)
    t = result.times
    t.decoded(s.running, k, now + durations[0], max(durations), now + total)
    finished = 0
    if finishing:
        done = finish_stretch(s)
        for r in done:
            t.done[r.rid] = now + total
        finished = len(done)
        if s.waiting and len(s.running) < max_seqs:  # the last step's batch is the one after its finishes
            result.idle_slot_steps += 1
        k_before = k - 1
    else:
        k_before = k
    result.steps += k
    result.request_steps += k * running
    result.busy_us += total
    result.kv_peak_blocks = max(result.kv_peak_blocks, s.kv_used)
    if s.waiting and running < max_seqs:
        result.idle_slot_steps += k_before
    result.waiting_peak = max(result.waiting_peak, len(s.waiting))
    return now + total, rejected + finished


def join_arrivals(s: SchedulerState, clock: _Clock, now: int, durations: list[int]) -> list[tuple[int, int]]:
    """Run the arrive phase of each step of the stretch for the requests due then, as plain stepping would
    (step j, starting at starts[j], takes the arrivals after starts[j - 1] up to starts[j]); cut the stretch
    (``durations``, in place) before the first step with an arrival that would go ahead of the queue's head.
    Return the requests rejected, each with the start of its step."""
    starts = list(accumulate(durations, initial=now))
    arrivals, k = clock.arrivals, len(durations)
    rejected: list[tuple[int, int]] = []
    out = DecisionBuilder()
    while clock.ai < len(arrivals):
        j = bisect_left(starts, arrivals[clock.ai].arrival_us, 0, k)  # the first step starting at or after it
        if j == k:
            break
        due = clock.ai
        while due < len(arrivals) and arrivals[due].arrival_us <= starts[j]:
            due += 1
        batch = arrivals[clock.ai:due]
        if not all(joins_behind_head(s, r) for r in batch):
            del durations[j:]  # plain stepping takes this step
            break
        arrive_phase(s, batch, out)
        clock.ai = due
        rejected += [(rid, starts[j]) for rid, _ in out.rejected]
        out.rejected.clear()
    return rejected
