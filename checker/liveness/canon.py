"""Canonical scheduler states: a flat tuple of ints per state, equal for states with the same future.

What the key keeps and what it forgets (docs/liveness.md, "Canonical states"):

- Requests are anonymous. The live requests (waiting, swapped or running) are listed in arrival order;
  finished, rejected and cancelled ones are dropped (a cancelled request still holding KV is kept, in a
  separate sorted list, as blocks and steps until release). Which request slot a request occupies, and
  its number, are forgotten: two states that differ only by a permutation of identical requests, or of
  free slots, have the same key (the symmetry reduction). The step breaks ties by (arrival, number), and
  the representative a key decodes to numbers requests in arrival order, as a replayed trace does.
- Sequence numbers become ranks: running requests by admission order, requeued requests by requeue
  order (only when the policy requeues preempted requests at the front: otherwise no rule reads it);
  ``admitted_seq`` of a request that is not running only says "was admitted once".
- Time becomes ages in iterations, and only when a rule reads the clock (priority aging, queue
  timeouts); otherwise the arrival order is all that matters. Ages are stored as the youngest age plus
  the differences between consecutive ages, each capped at ``age_cap`` while keeping its residue modulo
  the aging period: beyond the cap an older request wins every comparison with a younger one under
  aging, and has timed out under a queue timeout, so the cap changes no decision.
- ``num_preemptions`` and the reason of a live request are not read by any rule and are dropped; tenant
  counters (tenant_fair) are kept relative to the smallest.
"""

from __future__ import annotations

from checker.errors import InputError, Problem
from checker.policy import Policy, QueueOrder, Requeue
from checker.semantics.order import key_function
from checker.semantics.state import Request, SchedulerState, Status
from checker.requests import RequestSpec

WAITING, SWAPPED, RUNNING, CANCELLED = int(Status.WAITING), int(Status.SWAPPED), int(Status.RUNNING), int(Status.CANCELLED)
LIVE = frozenset({WAITING, SWAPPED, RUNNING})
STATUS_OF = {int(s): s for s in Status}
STATUS_INT = {s: int(s) for s in Status}
RUNNING_STATUS, CANCELLED_STATUS = Status.RUNNING, Status.CANCELLED  # bound once: ~0.2 us per Enum lookup

# A request class: what the environment chooses when a request arrives.
RequestClass = tuple[int, int, int, int, int]  # prompt, output, max_output, priority, tenant

# Fields per live request in a key: class id, status, computed, generated, blocks, swapped blocks,
# admission rank, requeue rank.
FIELDS_PER_REQUEST = 8
STATUS_AT, ADMITTED_AT = 1, 6  # offsets of the status and the admission rank among a live request's fields


def live_field(key: tuple, i: int, offset: int) -> int:
    """A field of the i-th live request (arrival order) of a key."""
    return key[1 + i * FIELDS_PER_REQUEST + offset]
FIELDS_PER_HOLDING = 2  # blocks, steps until release

class Canon:
    """Encodes states of one policy under one clock into keys, and keys back into representatives."""

    def __init__(self, policy: Policy, step_us: int, priorities: tuple[int, ...] = (0,), tenants: int = 1):
        if policy.kv.prefix_caching.enabled:  # the canonical key has no block identity yet
            raise InputError(Problem("kv.prefix_caching.enabled", True, "false for liveness: the state-graph "
                                     "explorer does not model block identity yet"))
        self.policy = policy
        self.step_us = step_us
        self.tenants = tenants
        q = policy.queue
        self.front = q.preempted_requeue is Requeue.FRONT
        self.fair = q.order is QueueOrder.TENANT_FAIR
        aging = q.order is QueueOrder.PRIORITY_AGING
        timeout_ms = policy.timeouts.queue_timeout_ms
        self.timed = aging or timeout_ms is not None
        self.period = 0  # iterations per aging level
        caps = [0]
        if aging:
            interval_us = q.aging_interval_ms * 1000
            if interval_us % step_us:
                raise InputError(Problem("--step-ms", step_us / 1000, f"a divisor of the aging interval "
                                         f"({q.aging_interval_ms} ms), so that ages are whole iterations"))
            self.period = interval_us // step_us
            caps.append((max(priorities) - min(priorities)) * self.period)
        if timeout_ms is not None:
            caps.append(timeout_ms * 1000 // step_us + 1)
        self.age_cap = max(caps)
        self.class_ids: dict[RequestClass, int] = {}
        self.classes: list[RequestClass] = []

    def class_id(self, cls: RequestClass) -> int:
        cid = self.class_ids.get(cls)
        if cid is None:
            cid = self.class_ids[cls] = len(self.classes)
            self.classes.append(cls)
        return cid

    def _cap(self, age: int) -> int:
        cap = self.age_cap
        if age < cap:
            return age
        return cap + (age - cap) % self.period if self.period else cap

    # ------------------------------------------------------------------------------------- encode
    def encode_requests(self, requests: list[Request], next_now_us: int, next_step: int,
                        counters: list[int] | tuple[int, ...] = ()) -> tuple:
        """The key of a state given its requests in arrival order (ties: by number). ``next_now_us`` is
        when the next iteration starts; ``next_step`` its index (for release lags)."""
        live = []
        holding = None  # (blocks, steps until release) of the cancelled requests still holding KV
        for r in requests:
            status = r.status
            if status in LIVE:
                live.append(r)
            elif status is CANCELLED_STATUS and r.blocks:
                if holding is None:
                    holding = []
                holding.append((r.blocks, max(r.release_step - next_step, 0)))
        out = [len(live)]
        if live:
            running = [r.admitted_seq for r in live if r.status is RUNNING_STATUS]
            if len(running) > 1:
                running.sort()
            admitted_rank = {seq: i for i, seq in enumerate(running, 1)}
            requeue_rank = None
            if self.front:
                requeued = [r.requeue_seq for r in live if r.requeue_seq]
                if requeued:
                    requeued.sort()
                    requeue_rank = {seq: i for i, seq in enumerate(requeued, 1)}
            class_ids = self.class_ids
            for r in live:
                cls = (r.prompt_len, r.output_len, r.max_output, r.priority, r.tenant)
                cid = class_ids.get(cls)
                if cid is None:
                    cid = self.class_id(cls)
                status = r.status
                out += (cid, STATUS_INT[status], r.num_computed, r.num_generated, r.blocks, r.swapped_blocks,
                        admitted_rank[r.admitted_seq] if status is RUNNING_STATUS else (1 if r.admitted_seq else 0),
                        requeue_rank[r.requeue_seq] if requeue_rank is not None and r.requeue_seq else 0)
            if self.timed:
                step_us = self.step_us
                ages = [(next_now_us - r.arrival_us) // step_us for r in live]
                out.append(self._cap(ages[-1]))
                out += (self._cap(ages[i] - ages[i + 1]) for i in range(len(ages) - 1))
        if holding is None:
            out.append(0)
        else:
            out.append(len(holding))
            for pair in sorted(holding):
                out += pair
        if self.fair:
            low = min(counters)
            out += (c - low for c in counters)
        return tuple(out)

    def encode(self, s: SchedulerState, next_now_us: int) -> tuple:
        """The key of a SchedulerState whose requests are numbered in arrival order."""
        return self.encode_requests(s.requests, next_now_us, s.step, s.tenant_counters)

    # ------------------------------------------------------------------------------------- decode
    def decode(self, key: tuple) -> tuple[SchedulerState, int]:
        """A representative state with this key, and the time its next iteration starts. Live requests are
        numbered 0..m-1 in arrival order; requests holding KV after a cancel come next."""
        m = key[0]
        pos = 1 + m * FIELDS_PER_REQUEST
        step_us = self.step_us
        if self.timed and m:
            ages = [0] * m
            ages[-1] = key[pos]
            for i in range(m - 2, -1, -1):
                ages[i] = ages[i + 1] + key[pos + 1 + i]
            pos += m
        else:
            ages = list(range(m, 0, -1))  # distinct, in arrival order: only the order is read
        now = (ages[0] if m else 0) * step_us
        s = SchedulerState.__new__(SchedulerState)
        s.policy = self.policy
        s.step = 0
        s.pool = None  # refused with prefix caching (Canon.__init__)
        requests: list[Request] = []
        running: list[tuple[int, Request]] = []
        waiting: list[Request] = []
        top_seq = 0
        kv_used = swap_used = 0
        classes = self.classes
        for i in range(m):
            base = 1 + i * FIELDS_PER_REQUEST
            cid, status, computed, generated, blocks, swapped, admitted, requeue = key[base:base + FIELDS_PER_REQUEST]
            prompt, output, max_output, priority, tenant = classes[cid]
            r = Request(RequestSpec(i, now - ages[i] * step_us, prompt, output, max_output, priority, tenant))
            r.status = STATUS_OF[status]
            r.num_computed, r.num_generated, r.blocks, r.swapped_blocks = computed, generated, blocks, swapped
            r.admitted_seq, r.requeue_seq = admitted, requeue
            top_seq = max(top_seq, admitted, requeue)
            kv_used += blocks
            swap_used += swapped
            requests.append(r)
            if status == RUNNING:
                running.append((admitted, r))
            else:
                waiting.append(r)
        holding = []
        h = key[pos]
        for j in range(h):
            blocks, release = key[pos + 1 + 2 * j], key[pos + 2 + 2 * j]
            r = Request(RequestSpec(m + j, 0, 1, 1, 1))
            r.status, r.blocks, r.release_step = Status.CANCELLED, blocks, release
            kv_used += blocks
            requests.append(r)
            holding.append(r)
        pos += 1 + FIELDS_PER_HOLDING * h
        s.requests = requests
        running.sort(key=lambda pair: pair[0])
        s.running = [r for _, r in running]
        s.holding = holding
        s.kv_used, s.swap_used = kv_used, swap_used
        s.next_seq = top_seq + 1
        s.tenant_counters = list(key[pos:pos + self.tenants]) if self.fair else [0] * self.tenants
        if len(waiting) > 1:
            waiting.sort(key=key_function(s, now))
        s.waiting = waiting
        return s, now
