"""Queue order: the sort key of a waiting request, and the preemption victim order.

Smaller key = served first. Every key ends with (arrival_us, rid), so the order is total.
"""

from __future__ import annotations

from bisect import insort
from collections.abc import Callable

from checker.policy import Polarity, QueueOrder, Requeue, Victim
from checker.semantics.sglang import enter_queue
from checker.semantics.state import Request, SchedulerState

Key = tuple[int, ...]

# Orders whose key reads only the request and the policy (one key function per policy, built once); the
# others change while a request waits, so the queue is re-sorted every step. Sets, not Enum class
# attributes, on the hot path: an attribute lookup on an Enum class costs ~0.2 us per use.
_STATIC_ORDERS = frozenset({QueueOrder.FCFS, QueueOrder.PRIORITY, QueueOrder.SHORTEST_PROMPT_FIRST})
_TIME_VARYING = frozenset(QueueOrder) - _STATIC_ORDERS


def norm_priority(s: SchedulerState, r: Request) -> int:
    """The request's priority turned so that smaller is more urgent."""
    return r.priority if s.policy.queue.priority_polarity is Polarity.LOWER_FIRST else -r.priority


def time_varying(s: SchedulerState) -> bool:
    """Keys that change while a request waits (so the queue is re-sorted every step)."""
    return s.policy.queue.order in _TIME_VARYING


def key_function(s: SchedulerState, now_us: int) -> Callable[[Request], Key]:
    q = s.policy.queue
    order = q.order
    if order in _STATIC_ORDERS:
        return _static_key(s)
    front = q.preempted_requeue is Requeue.FRONT

    def requeue_part(r: Request) -> Key:
        # front: the most recently requeued request first, then the never-requeued ones
        return (0, -r.requeue_seq) if front and r.requeue_seq else (1, 0)

    if order is QueueOrder.PRIORITY_AGING:
        interval = q.aging_interval_ms * 1000
        return lambda r: (*requeue_part(r), norm_priority(s, r) - (now_us - r.arrival_us) // interval,
                          r.arrival_us, r.rid)
    counters = s.tenant_counters  # TENANT_FAIR
    return lambda r: (*requeue_part(r), counters[r.tenant], r.arrival_us, r.rid)


_STATIC_KEYS: dict[int, tuple[object, Callable[[Request], Key]]] = {}  # id(policy) -> (policy, key)


def _static_key(s: SchedulerState) -> Callable[[Request], Key]:
    p = s.policy
    cached = _STATIC_KEYS.get(id(p))
    if cached is not None and cached[0] is p:
        return cached[1]
    q = p.queue
    front = q.preempted_requeue is Requeue.FRONT
    order = q.order
    # the tuples key_function's requeue_part + order part + (arrival_us, rid) would build
    if order is QueueOrder.FCFS:
        def part(r: Request) -> Key:
            return (r.arrival_us, r.rid)
    elif order is QueueOrder.PRIORITY and q.priority_polarity is Polarity.LOWER_FIRST:
        def part(r: Request) -> Key:
            return (r.priority, r.arrival_us, r.rid)
    elif order is QueueOrder.PRIORITY:
        def part(r: Request) -> Key:
            return (-r.priority, r.arrival_us, r.rid)
    else:  # SHORTEST_PROMPT_FIRST
        def part(r: Request) -> Key:
            return (r.prompt_len, r.arrival_us, r.rid)
    if front:
        def key(r: Request) -> Key:
            seq = r.requeue_seq
            return (0, -seq, *part(r)) if seq else (1, 0, *part(r))
    else:
        def key(r: Request) -> Key:
            return (1, 0, *part(r))
    if len(_STATIC_KEYS) > 256:  # policies built by tests and fuzzing: keep the cache small
        _STATIC_KEYS.clear()
    _STATIC_KEYS[id(p)] = (p, key)
    return key


def enqueue(s: SchedulerState, r: Request) -> None:
    """Put a request into the waiting queue at its place in queue order. Keys that vary with time
    are sorted at the start of each step instead (sort_waiting); the others do not read the clock. Under SGLang's
    rules the queue is a list in entry order, sorted when a prefill batch is formed (checker.semantics.sglang)."""
    if s.sglang is not None:
        enter_queue(s, r)
    elif s.policy.queue.order in _STATIC_ORDERS:
        insort(s.waiting, r, key=_static_key(s))
    else:
        s.waiting.append(r)


def sort_waiting(s: SchedulerState, now_us: int) -> None:
    if time_varying(s) and len(s.waiting) > 1:
        s.waiting.sort(key=key_function(s, now_us))


def victim_key(s: SchedulerState) -> Callable[[Request], Key]:
    """The preemption victim is the running request with the largest key."""
    victim = s.policy.preemption.victim
    if victim is Victim.LAST_ADMITTED:
        return lambda r: (r.admitted_seq,)
    if victim is Victim.LOWEST_PRIORITY:
        return lambda r: (norm_priority(s, r), r.arrival_us, r.rid)
    return lambda r: (-r.num_generated, r.prompt_len, r.rid)  # FEWEST_GENERATED


def pick_victim(s: SchedulerState) -> Request:
    if s.policy.preemption.victim is Victim.LAST_ADMITTED:
        return s.running[-1]
    return max(s.running, key=victim_key(s))
