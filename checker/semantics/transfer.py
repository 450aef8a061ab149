"""KV held outside the running batch (policy.connector): asynchronous loads and pinned blocks.

An *asynchronous load* (connector kind offload or decode_node; vLLM 0.33 WAITING_FOR_REMOTE_KVS): a waiting
request whose prompt the external tier holds beyond its local prefix hit is admitted as a load. It adopts its
hit, takes the blocks of the tokens the load brings (not cached until the load is done) and holds them while
it is LOADING: not running, scheduled for no tokens. The connector reports the load done in the output of step
``start + load_steps - 1``; the next time the waiting scan reaches the request it is promoted (its loaded
blocks cached, a full-prompt load recomputing its last token) and admitted like any request, holding its
blocks meanwhile. The blocks of an aborted load are freed by the policy's release rule.

*Pinned blocks* (prefill_node, both): a request that finishes keeps its blocks until the decode side confirms
the transfer, in the output of step ``finish + 1 + send_steps`` (a worker learns of the finish from the next
step's scheduler output: docs/connector-harness.md), or the release rule frees them.

Each function is an ask-then-act pair or one transition; the step (checker.semantics.step) calls them.
"""

from __future__ import annotations

from bisect import insort

from checker.policy import QueueOrder, ReleaseRule
from checker.semantics import kv
from checker.semantics.decision import DecisionBuilder
from checker.semantics.order import key_function
from checker.semantics.state import NEVER, Reason, Request, SchedulerState, Status

LOADING, WAITING, RUNNING, CANCELLED = Status.LOADING, Status.WAITING, Status.RUNNING, Status.CANCELLED
SCAN_ORDERED = frozenset({QueueOrder.FCFS, QueueOrder.TENANT_FAIR})  # holders kept in the order their loads started


def uses_holders_queue(s: SchedulerState) -> bool:
    """Waiting requests holding blocks go to their own queue, scanned first (vLLM 0.33 kv_holding_waiting)."""
    c = s.policy.connector
    return c.loads and c.holders_first


def queue_of(s: SchedulerState, r: Request) -> list[Request]:
    """The queue a waiting request (WAITING, SWAPPED or LOADING) is in. A request whose failed load freed its
    blocks (load_failure recompute) stays in the holders' queue, holding nothing, until it is admitted (vLLM 0.33
    pops it from kv_holding_waiting only then)."""
    if uses_holders_queue(s) and (r.blocks or r in s.holders):
        return s.holders
    return s.waiting


def external_tokens(s: SchedulerState, r: Request) -> int:
    """Tokens an asynchronous load would bring, beyond what ``r.num_computed`` already counts (its local hit);
    0 without a loading connector, or once the request has had a transfer (only its first admission asks)."""
    if r.transfer_step != -1 or not r.spec.external_tokens or not s.policy.connector.loads:
        return 0
    return max(0, r.spec.external_tokens - r.num_computed)


def inflight_reserved(s: SchedulerState, out: DecisionBuilder) -> int:
    """Blocks the in-flight prefills still need to hold their whole sequence (vLLM 0.33's
    _inflight_prefill_reserved_blocks): loads in flight, and running requests whose prefill (or recompute) is
    not done after the tokens scheduled for them so far in this step."""
    size = s.policy.kv.block_size
    max_len = s.policy.max_model_len
    scheduled = out.scheduled
    total = 0
    for queue in (s.holders, s.waiting):
        for r in queue:
            if r.status is LOADING:
                total += max(0, kv.blocks_for(min(r.num_tokens, max_len), size) - r.blocks)
    for r in s.running:
        if r.in_prefill_after(scheduled.get(r.rid, 0)):
            total += max(0, kv.blocks_for(min(r.num_tokens, max_len), size) - r.blocks)
    return total


def can_start_load(s: SchedulerState, r: Request, hit: list[int], ext: int, out: DecisionBuilder) -> bool:
    """The load's blocks fit: with reserve_full_prompt its whole sequence must fit the free blocks (less the
    watermark when something runs), and the blocks it takes now must fit the free blocks less the watermark
    and, with reserve_inflight, less what the in-flight prefills still need."""
    p = s.policy
    size = p.kv.block_size
    free = kv.admission_free(s)
    held = kv.held_with_hit(s, r, hit)
    if p.admission.reserve_full_prompt and kv.blocks_for(r.num_tokens, size) - held > free:
        return False
    reserved = inflight_reserved(s, out) if p.connector.reserve_inflight else 0
    return kv.blocks_for(r.num_computed + ext, size) - held <= free - reserved


def start_load(s: SchedulerState, r: Request, hit: list[int], ext: int, out: DecisionBuilder) -> None:
    """Admit the request as a load: it adopts its hit, takes the loaded tokens' blocks (uncached) and holds
    them while LOADING; with the holders' queue it moves there, behind the loads already in it."""
    if hit:
        kv.adopt(s, r, hit)
    tokens = r.num_computed + ext
    kv.take(s, r, kv.blocks_for(tokens, s.policy.kv.block_size) - r.blocks)  # uncached: the load fills them
    r.num_computed = tokens
    steps = r.spec.load_steps
    r.transfer_step = NEVER if steps is None else s.step + steps - 1
    if uses_holders_queue(s):
        s.waiting.remove(r)
        if s.policy.queue.order in SCAN_ORDERED:
            # a deque in scan order (vLLM 0.33 kv_holding_waiting under fcfs); tenant_fair's key reads counters that
            # change while requests wait, so a list kept by it would not stay sorted: scan order there too
            s.holders.append(r)
        else:  # a priority heap in vLLM: the queue's key (priority_aging's as it is at time 0: no vLLM counterpart)
            insort(s.holders, r, key=key_function(s, 0))
    r.status = LOADING
    s.loads_in_flight += 1
    out.loads.append(r.rid)


def load_reported(s: SchedulerState, r: Request) -> bool:
    """The connector reported the request's load done in the output of an earlier step."""
    return r.transfer_step < s.step


def promote(s: SchedulerState, r: Request) -> None:
    """A load reported done: its blocks are cached and it waits again, holding them; a load that covered the
    whole sequence recomputes the last token (for its logits). A failed load (load_failure recompute: a failure
    under fail has ended the request at its report, fail_reported) frees its blocks, its local hit included, and
    the request starts again from no computed token (vLLM 0.33 _handle_failed_recving sets num_computed_tokens to
    0, _update_waiting_for_remote_kv then frees the request's blocks); it asks for no second load."""
    if r.spec.load_fails:
        kv.free(s, r)
        r.num_computed = 0
        r.status = WAITING
        s.loads_in_flight -= 1
        return
    if s.pool is not None:
        s.pool.cache(r, r.num_computed)
    if r.num_computed >= r.num_tokens:
        r.num_computed = r.num_tokens - 1
    r.status = WAITING
    s.loads_in_flight -= 1


def abort_load(s: SchedulerState, r: Request) -> bool:
    """A LOADING request was cancelled (it has left its queue; the caller marks it CANCELLED). Return whether
    its blocks are to be freed now; otherwise they are held (``s.holding``) until the release rule frees them:
    the load's report (release_phase never, report_phase frees it), or the deadline."""
    s.loads_in_flight -= 1
    c = s.policy.connector
    if c.release is ReleaseRule.IMMEDIATE or load_reported(s, r):
        return True
    r.release_step = s.step + c.release_deadline_steps if c.release is ReleaseRule.DEADLINE else NEVER
    s.holding.append(r)
    return False


def pin(s: SchedulerState, r: Request) -> None:
    """A request finished on a prefill node: its blocks stay pinned until the decode side confirms the transfer
    (reported in the output of step ``finish + 1 + send_steps``) or the deadline passes."""
    c = s.policy.connector
    steps = r.spec.send_steps
    r.transfer_step = NEVER if steps is None else s.step + 1 + steps
    r.release_step = s.step + c.release_deadline_steps if c.release is ReleaseRule.DEADLINE else NEVER
    s.holding.append(r)


def report_phase(s: SchedulerState, out: DecisionBuilder) -> None:
    """End of the step: the transfers the connector reports done in this step's output free the blocks held
    for them (an aborted load, a pinned request)."""
    now = s.step
    kv.release_held(s, out.released, lambda r: 0 <= r.transfer_step <= now)


def fail_reported(s: SchedulerState, out: DecisionBuilder) -> None:
    """End of the step, load_failure fail: a load the connector reports done and failed in this step's output ends
    its request with an error (vLLM 0.33: FINISHED_ERROR in update_from_output, its blocks freed as the same
    output's finished_recving is processed): it leaves its queue, frees its blocks and is listed as finished
    (status CANCELLED: it produced no output; reason LOAD_FAILED)."""
    now = s.step
    for queue in (s.holders, s.waiting):
        failed = [r for r in queue if r.status is LOADING and r.transfer_step == now and r.spec.load_fails]
        for r in failed:
            queue.remove(r)
            kv.free(s, r)
            r.status, r.reason = CANCELLED, Reason.LOAD_FAILED
            s.loads_in_flight -= 1
            out.finished.append(r.rid)


def steps_pending(s: SchedulerState) -> bool:
    """Something will change without input: a held request will be released, or a load will be reported."""
    for r in s.holding:
        if r.release_step < NEVER or 0 <= r.transfer_step < NEVER:
            return True
    if s.loads_in_flight:
        return any(r.status is LOADING and r.transfer_step < NEVER for q in (s.holders, s.waiting) for r in q)
    return False
