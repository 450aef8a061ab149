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
    """One batch in flight: the tokens each request was scheduled, which of them sample a token that is still
    pending (not made stale by a preemption), and the requests that reach their last token in it."""

    __slots__ = ("scheduled", "pending", "finishing")

    def __init__(self, scheduled: dict[int, int]):
        self.scheduled = scheduled
        self.pending: set[int] = set()
        self.finishing: list[int] = []

    def copy(self) -> Batch:
        c = Batch(dict(self.scheduled))
        c.pending, c.finishing = set(self.pending), list(self.finishing)
        return c

    def snapshot(self) -> tuple:
        return (tuple(self.scheduled.items()), tuple(sorted(self.pending)), tuple(self.finishing))


class PipeState:
    """What async scheduling keeps between steps: the batches in flight (oldest first) and the requests finishing in
    one of them."""

    __slots__ = ("depth", "batches", "finishing")

    def __init__(self, policy: Policy):
        self.depth = policy.pipeline.in_flight
        self.batches: deque[Batch] = deque()
        self.finishing: set[int] = set()

    def copy(self) -> PipeState:
        c = PipeState.__new__(PipeState)
        c.depth, c.batches, c.finishing = self.depth, deque(b.copy() for b in self.batches), set(self.finishing)
        return c

    def snapshot(self) -> tuple:
        return tuple(b.snapshot() for b in self.batches)


def pending(s: SchedulerState, r: Request) -> int:
    """Tokens r samples in batches still in flight (its output placeholders)."""
    return sum(1 for b in s.pipe.batches if r.rid in b.pending)


def known_tokens(s: SchedulerState, r: Request) -> int:
    """Prompt and output tokens the scheduler knows (vLLM's request.num_tokens: without the placeholders)."""
    return r.prompt_len + r.num_generated - pending(s, r)


def done(s: SchedulerState, r: Request) -> bool:
    """A running request not to schedule: its in-flight step samples its last token whatever it is (vLLM:
    num_output_placeholders > 0 and the step reaches max_tokens, or max_model_len leaves no position)."""
    if not any(r.rid in b.pending for b in s.pipe.batches):
        return False
    return r.num_generated >= r.max_output or r.prompt_len + r.num_generated >= s.policy.max_model_len


def dead(s: SchedulerState, rid: int) -> bool:
    """A request scheduled after the step that samples its last token (its output is dropped)."""
    return rid in s.pipe.finishing


def defer(s: SchedulerState, r: Request, out) -> None:
    """A request reaching its last token in the batch being launched: it finishes when the batch is resolved."""
    s.pipe.finishing.add(r.rid)


def launch(s: SchedulerState, scheduled: dict[int, int], produced: list[int]) -> None:
    """The step's batch goes in flight (after phase 6 advanced its requests): the tokens it samples are pending."""
    pipe = s.pipe
    batch = Batch(dict(scheduled))
    batch.pending.update(produced)
    by_rid = s.requests
    batch.finishing = [rid for rid in scheduled if rid in pipe.finishing and by_rid[rid].status is RUNNING
                       and not any(rid in b.finishing for b in pipe.batches)]
    pipe.batches.append(batch)


def preempt(s: SchedulerState, r: Request) -> None:
    """A preempted request's in-flight tokens become stale: delivered, no longer pending."""
    for b in s.pipe.batches:
        b.pending.discard(r.rid)


def resolve(s: SchedulerState, out, finish: Callable) -> None:
    """Phase 6: the oldest batch's output comes back once more than ``depth`` batches are in flight (the engine
    core's batch queue): caching of the blocks its tokens fill, then its finishing requests finish."""
    pipe = s.pipe
    if len(pipe.batches) <= pipe.depth:
        return
    batch = pipe.batches.popleft()
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
