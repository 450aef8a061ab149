"""Async scheduling (policy.pipeline), the step's only pipeline code besides its hooks in step.py and kv.py
(docs/speculative.md, "Async scheduling"; vLLM 0.33's AsyncScheduler stepped by EngineCore.step_with_batch_queue is
the reference).

Step t schedules while the batch of step t - 1 is in flight, then resolves that batch (phase 6):

- Scheduling a batch (``launch``, in phase 6 of the step that schedules it) advances each request as the
  synchronous step does: its computed tokens, and the token it samples when the step closes its gap. That token is
  vLLM's output placeholder: ``num_generated`` counts it from here on (vLLM schedules from num_tokens +
  num_output_placeholders), but the scheduler learns it only when the batch is resolved. A request that reaches its
  last token in the batch is *finishing*: it stays running, holding its blocks and its seat, until then.
- The running pass skips a request whose in-flight step samples its last token for sure: its max output length or
  max_model_len (``done``; vLLM's check before a running request is scheduled, and its max_model_len cap). One that
  stops earlier (a stop token) is scheduled once more: vLLM cannot know, and that step's output is dropped (``dead``).
- Resolving the batch (``resolve``, phase 6 of the next step): its finishing requests finish (the blocks of a
  running one are freed now); one preempted since (its output was stale: it was still delivered) finishes from the
  waiting queue. With prefix caching, the blocks a running request's resolved tokens fill are cached then (vLLM's
  cache_blocks after the output; before, only the blocks of known tokens are: ``known_tokens``).
- A preempted request's in-flight token is not pending any more (vLLM marks it stale: delivered, but its counters are
  reset), and its recompute covers it, as vLLM's does once the token is delivered (before its next admission).
- With speculative decoding a verifying row counts all its drafts as output until the batch is resolved
  (``verify_later``: vLLM's placeholders are 1 + drafts), when the rejected ones are rolled back and a stop is found
  (``_resolve_verified``); every row that samples gets k placeholder drafts for its next step.

Frees are not fenced: vLLM defers a freed request's blocks to the completion of its in-flight step only with a KV
consumer connector (Scheduler.defer_block_free), which the policy refuses with a pipeline.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from checker.policy import Policy
from checker.semantics.state import Request, SchedulerState, Status

RUNNING, WAITING = Status.RUNNING, Status.WAITING


class Batch:
    """One batch in flight: the tokens each request was scheduled, the output placeholders of those that sample
    (1 + their drafts) while still pending (not made stale by a preemption), and the requests that reach their last
    token in it. With speculative decoding: each sampling request's drafts and how many the verifier accepts
    (``verified``), and the requests preempted since (``stale``): their output is still delivered."""

    __slots__ = ("scheduled", "pending", "finishing", "verified", "stale")

    def __init__(self, scheduled: dict[int, int]):
        self.scheduled = scheduled
        self.pending: dict[int, int] = {}
        self.finishing: list[int] = []
        self.verified: dict[int, tuple[int, int]] = {}
        self.stale: set[int] = set()

    def copy(self) -> Batch:
        c = Batch(dict(self.scheduled))
        c.pending, c.finishing, c.verified, c.stale = (dict(self.pending), list(self.finishing), dict(self.verified),
                                                       set(self.stale))
        return c

    def snapshot(self) -> tuple:
        return (tuple(self.scheduled.items()), tuple(sorted(self.pending.items())), tuple(self.finishing),
                tuple(sorted(self.verified.items())), tuple(sorted(self.stale)))


class PipeState:
    """What async scheduling keeps between steps: the batches in flight (oldest first) and the requests finishing in
    one of them."""

    __slots__ = ("depth", "batches", "finishing", "verified")

    def __init__(self, policy: Policy):
        self.depth = policy.pipeline.in_flight
        self.batches: deque[Batch] = deque()
        self.finishing: set[int] = set()
        self.verified: dict[int, tuple[int, int]] = {}  # within a step: the rows of the batch being launched

    def copy(self) -> PipeState:
        c = PipeState.__new__(PipeState)
        c.depth, c.batches, c.finishing = self.depth, deque(b.copy() for b in self.batches), set(self.finishing)
        c.verified = dict(self.verified)
        return c

    def snapshot(self) -> tuple:
        return tuple(b.snapshot() for b in self.batches)


def pending(s: SchedulerState, r: Request) -> int:
    """r's output placeholders: the tokens it samples in batches still in flight, drafts included."""
    rid = r.rid
    return sum(b.pending.get(rid, 0) for b in s.pipe.batches)


def known_tokens(s: SchedulerState, r: Request) -> int:
    """Prompt and output tokens the scheduler knows (vLLM's request.num_tokens: without the placeholders)."""
    return r.prompt_len + r.num_generated - pending(s, r)


def done(s: SchedulerState, r: Request) -> bool:
    """A running request not to schedule: its in-flight step samples its last token whatever it is, even with every
    draft rejected (vLLM: num_output_placeholders > 0 and num_computed + 2 - placeholders >= prompt + max_tokens), or
    max_model_len leaves no position (its cap max_model_len - num_computed - 1)."""
    ph = pending(s, r)
    if not ph:
        return False
    c = r.num_computed
    return c + 2 - ph >= r.prompt_len + r.max_output or c + 1 >= s.policy.max_model_len


def dead(s: SchedulerState, rid: int) -> bool:
    """A request scheduled after the step that samples its last token (its output is dropped). With speculative
    decoding that is known only when the batch is resolved (``_resolve_verified``)."""
    return rid in s.pipe.finishing


def defer(s: SchedulerState, r: Request, out) -> None:
    """A request reaching its last token in the batch being launched: it finishes when the batch is resolved."""
    s.pipe.finishing.add(r.rid)


def verify_later(s: SchedulerState, r: Request, n: int, d: int, a: int) -> None:
    """Phase 6 of a row that verifies d drafts under async scheduling: every draft counts as accepted until the batch
    is resolved (vLLM's placeholders: 1 + d), the verifier's choice ``a`` is kept for then."""
    r.num_computed += n
    r.num_generated += 1 + d
    s.pipe.verified[r.rid] = (d, a)


def launch(s: SchedulerState, scheduled: dict[int, int], produced: list[int]) -> None:
    """The step's batch goes in flight (after phase 6 advanced its requests): the tokens it samples are pending."""
    pipe = s.pipe
    batch = Batch(dict(scheduled))
    if s.spec is not None:
        batch.verified, pipe.verified = pipe.verified, {}
    verified = batch.verified
    for rid in produced:
        batch.pending[rid] = 1 + verified[rid][0] if rid in verified else 1
    by_rid = s.requests
    batch.finishing = [rid for rid in scheduled if rid in pipe.finishing and by_rid[rid].status is RUNNING
                       and not any(rid in b.finishing for b in pipe.batches)]
    pipe.batches.append(batch)


def preempt(s: SchedulerState, r: Request) -> None:
    """A preempted request's in-flight tokens become stale: delivered, no longer pending. With speculative decoding
    its placeholders are dropped now (vLLM resets them) and the tokens delivered counted when the batch resolves."""
    rid = r.rid
    for b in s.pipe.batches:
        ph = b.pending.pop(rid, 0)
        if ph and s.spec is not None:
            r.num_generated -= ph
            b.stale.add(rid)


def resolve(s: SchedulerState, out, finish: Callable) -> None:
    """Phase 6: the oldest batch's output comes back once more than ``depth`` batches are in flight (the engine
    core's batch queue): caching of the blocks its tokens fill, then its finishing requests finish."""
    pipe = s.pipe
    if len(pipe.batches) <= pipe.depth:
        return
    batch = pipe.batches.popleft()
    if s.spec is not None:
        _resolve_verified(s, batch, out, finish)
        return
    by_rid, pool, newer = s.requests, s.pool, pipe.batches
    finishing = batch.finishing
    for rid in batch.scheduled:  # in the batch's order, as update_from_output goes
        r = by_rid[rid]
        if pool is not None and rid in batch.pending and r.status is RUNNING:
            pool.cache(r, r.num_computed - sum(b.scheduled.get(rid, 0) for b in newer))
            s.kv_used = pool.num_used
        if finishing and rid in finishing:
            pipe.finishing.discard(rid)
            if r.status is WAITING:  # preempted while its last step was in flight: it finishes from the queue
                s.waiting.remove(r)
                finish(s, r, out)
            elif r.status is RUNNING:
                finish(s, r, out)
            else:  # cancelled meanwhile
                continue


def _resolve_verified(s: SchedulerState, batch: Batch, out, finish: Callable) -> None:
    """Resolution with speculative decoding (vLLM update_from_output): each sampling row's d - a rejected drafts are
    rolled back, its 1 + a tokens delivered up to a stop (the tokens past it trimmed); a request that stops finishes
    (its later in-flight outputs dropped). A row made stale by a preemption delivers its tokens only (the request's
    counters were reset), and may finish the request from the waiting queue."""
    pipe, by_rid, pool = s.pipe, s.requests, s.pool
    max_len = s.policy.max_model_len
    for rid in batch.scheduled:
        ph = batch.pending.get(rid, 0)
        stale = rid in batch.stale
        if not ph and not stale:
            continue
        r = by_rid[rid]
        d, a = batch.verified.get(rid, (0, 0))
        later = sum(b.pending.get(rid, 0) for b in pipe.batches)
        if stale:
            if r.status is not WAITING:
                continue
            before = r.num_generated - later
        else:
            if r.status is not RUNNING:
                continue
            r.num_computed -= d - a
            r.num_generated -= d - a
            before = r.num_generated - later - (1 + a)
        room = min(r.output_len - before, max_len - r.prompt_len - before)
        m = min(1 + a, room)
        stopped = m >= room
        if stale:
            r.num_generated += m
        elif stopped:
            r.num_computed -= 1 + a - m
            r.num_generated -= 1 + a - m
        if pool is not None and not stale:
            pool.cache(r, r.num_computed - sum(b.scheduled.get(rid, 0) for b in pipe.batches))
            s.kv_used = pool.num_used
        if not stopped:
            continue
        r.num_generated = before + m
        if r.status is WAITING:
            s.waiting.remove(r)
        finish(s, r, out)
