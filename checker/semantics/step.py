"""One scheduler step. The phases, in order (docs/semantics.md says the same in prose):

1. release   cancelled requests whose release lag has passed free their KV;
2. arrive    arriving requests pass admission control or are rejected;
3. cancel    cancelled requests leave the queues (KV freed now, or after the lag);
4. expire    requests waiting past the queue timeout are rejected;
5. schedule  the batch is composed under the phase mode: running pass, waiting pass, chunking,
             KV allocation and preemption;
6. complete  scheduled tokens are computed, output tokens produced, finished requests free their KV
             (on a prefill node they stay pinned); the transfers the connector reports done in this step's
             output free the blocks held for them (checker.semantics.transfer).

The step mutates a SchedulerState and returns a frozen StepDecision. It is the single definition of
the semantics: the engine iterates it, and the Z3 encoding (checker/smt) is pinned to it step by step.
"""

from __future__ import annotations

from checker.errors import InternalError
from checker.policy import HeadOfLine, LoadFailure, PhaseMode, PreemptMode, QueueOrder
from checker.semantics import blocked, inflight, kv, sglang, speculative, transfer
from checker.semantics.decision import DecisionBuilder, StepDecision
from checker.semantics.order import enqueue, key_function, norm_priority, pick_victim, sort_waiting, victim_key
from checker.semantics.state import PAST_TRANSFER, Reason, Request, SchedulerState, Status

# The enum members the step reads and writes, bound once: looking a member up on its Enum class costs about
# 0.2 us per use in CPython 3.11, and the step is the hot path of the engine, the fuzzer and the explorer.
WAITING, SWAPPED, RUNNING = Status.WAITING, Status.SWAPPED, Status.RUNNING
FINISHED, REJECTED, CANCELLED = Status.FINISHED, Status.REJECTED, Status.CANCELLED
LOADING = Status.LOADING
NO_REASON = Reason.NONE
TENANT_FAIR = QueueOrder.TENANT_FAIR
STRICT = HeadOfLine.STRICT


class Budget:
    """Tokens left in this step, prefill tokens left under the prefill share cap, and this step's
    per-request cap on new tokens (the long-prefill threshold as it applies to this step; 0: none). ``slot``:
    extra budget each scheduled request takes (speculative decoding's drafting slots; 0 otherwise): ``tokens``
    then starts one slot short, so that it is what the next request may still take (vLLM's input_budget -
    draft_slots)."""

    __slots__ = ("tokens", "prefill", "threshold", "slot")

    def __init__(self, tokens: int, prefill: int, threshold: int, slot: int = 0):
        self.tokens = tokens - slot
        self.prefill = prefill
        self.threshold = threshold
        self.slot = slot

    def charge(self, n: int, prefill: bool) -> None:
        self.tokens -= n + self.slot
        if prefill:
            self.prefill -= n

    def refund(self, n: int, prefill: bool) -> None:
        self.tokens += n + self.slot
        if prefill:
            self.prefill += n


def step(s: SchedulerState, arrivals: list[Request], cancels: list[Request], now_us: int) -> StepDecision:
    out = DecisionBuilder()
    step_events(s, arrivals, cancels, now_us, out)
    return step_schedule(s, now_us, out)


def step_events(s: SchedulerState, arrivals: list[Request], cancels: list[Request], now_us: int,
                out: DecisionBuilder) -> None:
    """Phases 1-4 of a step (release, arrive, cancel, expire). In three parts for the liveness explorer,
    which steps one state under many environment choices: phase 1 reads nothing the environment chooses,
    and phase 2 takes arrivals one at a time (arrive_phase(s, a + b) is arrive_phase(s, a) then
    arrive_phase(s, b))."""
    release_phase(s, out)
    arrive_phase(s, arrivals, out)
    leave_phase(s, cancels, now_us, out)


def step_schedule(s: SchedulerState, now_us: int, out: DecisionBuilder) -> StepDecision:
    """Phases 5-6 of a step (schedule, complete), after step_events filled ``out``. They read the state and
    what they write into ``out`` themselves, nothing that phases 1-4 wrote there: the same state after
    phases 1-4 is scheduled the same way whatever events led to it (the liveness explorer relies on it)."""
    if s.sglang is not None:  # SGLang's rules (checker.semantics.sglang)
        sglang.schedule(s, out)
        counts = _compute(s, out)
        sglang.end_aborted(s, out)
        sglang.after_step(s, out)
        decision = _decide(s, now_us, out, counts, check_kv=False)  # an over-commit is SGLang's own, not ours
    else:
        sort_waiting(s, now_us)
        batch = s.policy.batch
        budget = Budget(batch.max_num_batched_tokens, batch.prefill_token_cap, step_threshold(s),
                        0 if s.spec is None else s.spec.slot)
        _schedule(s, budget, now_us, out)
        decision = _decide(s, now_us, out, _compute(s, out))
    s.step += 1
    return decision


# ----------------------------------------------------------------------------------------- 1-4: events
def release_phase(s: SchedulerState, out: DecisionBuilder) -> None:
    """Phase 1 (release)."""
    if s.holding:
        now = s.step
        kv.release_held(s, out.released, lambda r: r.release_step <= now)


def arrive_phase(s: SchedulerState, arrivals: list[Request], out: DecisionBuilder) -> None:
    """Phase 2 (arrive), in arrival order."""
    p = s.policy
    adm = p.admission
    max_len, never_fits, max_inflight = p.max_model_len, adm.reject_never_fits, adm.max_inflight
    max_queue_len, max_queued_tokens = adm.max_queue_len, adm.max_queued_tokens
    fair = p.queue.order is TENANT_FAIR
    for r in arrivals:
        reason = NO_REASON
        if r.prompt_len >= max_len:
            reason = Reason.PROMPT_TOO_LONG
        elif s.sglang is not None and sglang.arrival(s, r) is not NO_REASON:
            reason = Reason.PROMPT_TOO_LONG
        elif never_fits and kv.blocks_for(kv.max_context(s, r), p.kv.block_size) > p.kv.num_blocks:
            reason = Reason.NEVER_FITS
        elif max_inflight is not None and len(s.waiting) + len(s.holders) + len(s.running) >= max_inflight:
            reason = Reason.OVERLOADED
        elif max_queue_len is not None and len(s.waiting) + len(s.holders) >= max_queue_len:
            reason = Reason.QUEUE_FULL
        elif (max_queued_tokens is not None
              and sum(w.prompt_len for w in s.waiting) + r.prompt_len > max_queued_tokens):
            reason = Reason.QUEUE_FULL
        if reason is not NO_REASON:
            r.status, r.reason = REJECTED, reason
            out.rejected.append((r.rid, reason))
            continue
        if fair:
            _lift_counter(s, r)
        r.status = WAITING
        enqueue(s, r)
        if s.blocked is not None:
            blocked.arrive(s, r)
        out.arrived.append(r.rid)


def _lift_counter(s: SchedulerState, r: Request) -> None:
    """VTC counter lift: a tenant that becomes backlogged starts at the smallest counter among the
    backlogged tenants, so it cannot bank credit while idle."""
    active = {q.tenant for q in s.waiting} | {q.tenant for q in s.running}
    if r.tenant in active or not active:
        return
    counters = s.tenant_counters
    counters[r.tenant] = max(counters[r.tenant], min(counters[t] for t in active))


def leave_phase(s: SchedulerState, cancels: list[Request], now_us: int, out: DecisionBuilder) -> None:
    """Phases 3-4 (cancel, expire)."""
    _cancel(s, cancels, out)
    _expire(s, now_us, out)


def _cancel(s: SchedulerState, cancels: list[Request], out: DecisionBuilder) -> None:
    lag = s.policy.cancellation.release_lag_steps
    for r in cancels:
        loading = r.status is LOADING
        if r.status in (WAITING, SWAPPED) or loading:
            transfer.queue_of(s, r).remove(r)
            kv.swap_in_release(s, r)
        elif r.status is RUNNING:
            if s.sglang is not None and not sglang.abort_running(s, r, out):
                continue  # marked: it leaves when its next row is computed
            s.running.remove(r)
        else:
            continue  # not arrived, or already finished / rejected / cancelled
        r.status, r.reason = CANCELLED, Reason.ABORTED
        out.cancelled.append(r.rid)
        if loading:
            if transfer.abort_load(s, r):
                kv.free(s, r)
                out.released.append(r.rid)
        elif r.blocks and lag > 0:
            if r.transfer_step >= 0:  # a load of its past: its report is no release (report_phase)
                r.transfer_step = PAST_TRANSFER
            r.release_step = s.step + lag
            s.holding.append(r)
        elif r.blocks:
            kv.free(s, r)
            out.released.append(r.rid)


def _expire(s: SchedulerState, now_us: int, out: DecisionBuilder) -> None:
    limit_ms = s.policy.timeouts.queue_timeout_ms
    if limit_ms is None or not s.waiting:
        return
    limit_us = limit_ms * 1000
    expired = [r for r in s.waiting if r.admitted_seq == 0 and not r.blocks and now_us - r.arrival_us > limit_us]
    for r in expired:
        s.waiting.remove(r)
        r.status, r.reason = REJECTED, Reason.TIMEOUT
        out.rejected.append((r.rid, Reason.TIMEOUT))


# ----------------------------------------------------------------------------------------- 5: schedule
def _schedule(s: SchedulerState, budget: Budget, now_us: int, out: DecisionBuilder) -> None:
    mode = s.policy.batch.phase_mode
    if mode is PhaseMode.DECODE_FIRST:
        _running_pass(s, budget, out)
        _waiting_pass(s, budget, now_us, out)
    elif mode is PhaseMode.STATIC:
        batch_done = not s.running
        _running_pass(s, budget, out)
        if batch_done:
            _waiting_pass(s, budget, now_us, out)
    elif mode is PhaseMode.PREFILL_FIRST:
        _running_pass(s, budget, out, prefill_only=True)
        _waiting_pass(s, budget, now_us, out)
        if not out.scheduled:  # no prefill work fitted: this is a decode step
            _running_pass(s, budget, out)
    else:  # MIXED
        _mixed_pass(s, budget, now_us, out)


def step_threshold(s: SchedulerState) -> int:
    """The long-prefill threshold of this step, from the requests running or waiting as it starts: off
    for a lone request unless ``threshold_when_alone`` (vLLM 0.33), floored at the budget's fair share
    with ``threshold_adaptive``."""
    chunking = s.policy.chunking
    threshold = chunking.long_prefill_token_threshold
    if not threshold or (chunking.threshold_when_alone and not chunking.threshold_adaptive):
        return threshold
    eligible = len(s.running) + len(s.waiting) + len(s.holders)
    if eligible <= 1 and not chunking.threshold_when_alone:
        return 0
    if chunking.threshold_adaptive:
        threshold = max(threshold, s.policy.batch.max_num_batched_tokens // max(eligible, 1))
    return threshold


def num_new_tokens(s: SchedulerState, r: Request, budget: Budget) -> int:
    """Tokens the request would compute now: its gap, capped by the step's long-prefill threshold, the
    budget and (for prefill) the prefill cap; 0 if chunking is off and the gap does not fit."""
    chunking = s.policy.chunking
    gap = r.prompt_len + r.num_generated - r.num_computed
    n = min(gap if s.spec is None else speculative.wanted(s, r, gap), budget.tokens)
    if budget.threshold:
        n = min(n, budget.threshold)
    if r.in_prefill:
        n = min(n, budget.prefill)
    if n < gap and not chunking.enabled:
        return 0
    if s.spec is not None:
        n = speculative.cap_len(s, r, n)
    return max(n, 0)


def _running_pass(s: SchedulerState, budget: Budget, out: DecisionBuilder, prefill_only: bool = False) -> None:
    """Serve running requests in admission order; preempt when one cannot grow (vLLM Phase A).

    A decode (one token behind) that fits its blocks, or needs one block the pool has, takes the
    fast path below (with block identity too: it takes the block from the pool and caches the block the
    token fills, as kv.allocate does); it gives the same result as _serve_running, which handles every
    other case.
    """
    running = s.running
    scheduled, grown = out.scheduled, out.grown
    block_size = s.policy.kv.block_size
    capacity = s.policy.kv.num_blocks if s.policy.kv.check_allocation else None
    pool = s.pool  # block identity (prefix caching): a decode's block comes from the pool and is cached when full
    # with speculative decoding a decode schedules its drafts too, and with a batch in flight a request may be one
    # not to schedule (inflight.done): the general path
    plain = s.spec is None and s.pipe is None
    synced = False  # s.kv_used known to equal pool.num_used (set below by the first decode, as before)
    i = 0
    while i < len(running) and budget.tokens > 0:
        r = running[i]
        if r.rid in scheduled:
            i += 1
            continue
        computed = r.num_computed
        if plain and r.num_generated and computed + 1 == r.prompt_len + r.num_generated:  # a decode
            if prefill_only:
                i += 1
                continue
            grow = computed + 1 > r.blocks * block_size  # it needs exactly one new block
            if capacity is not None and s.kv_used + grow > capacity:
                # not kv.can_grow (no free block, or a pool over-committed by uncounted hits): the general path
                i = _serve_running(s, r, i, budget, out)
                continue
            if grow:
                r.blocks += 1
                if pool is None:
                    s.kv_used += 1
                else:
                    pool.take(r, 1)
                grown[r.rid] = 1
            if pool is not None:  # kv.allocate(s, r, 1): the block the token fills is cached once full
                if (computed + 1) // block_size > r.num_cached_blocks:
                    pool.cache(r, computed + 1)
                if synced:  # a take of one block uses one free block, a cache none: pool.num_used, without the call
                    s.kv_used += grow
                else:
                    s.kv_used = pool.num_used
                    synced = True  # every pool operation after this one keeps s.kv_used equal to pool.num_used
            scheduled[r.rid] = 1
            budget.tokens -= 1
            i += 1
            continue
        if prefill_only and not r.in_prefill:
            i += 1
            continue
        i = _serve_running(s, r, i, budget, out)


def _serve_running(s: SchedulerState, r: Request, i: int, budget: Budget, out: DecisionBuilder) -> int:
    """Schedule running request r (at index i of the running list); return the next index."""
    if s.pipe is not None and inflight.done(s, r):
        return i + 1  # its in-flight step samples its last token
    n = num_new_tokens(s, r, budget)
    if n == 0:
        return i + 1
    while not kv.can_grow(s, r, n):
        if not s.policy.preempts_on_growth:
            return i + 1  # it cannot grow and nothing is preempted: it waits this step
        victim = pick_victim(s)
        victim_index = s.running.index(victim)
        _preempt(s, victim, budget, out)
        out.preempted_for_growth = True
        if victim is r:
            return i  # r left the list; index i now holds the next request
        if victim_index < i:
            i -= 1
    _admit_tokens(s, r, n, budget, out)
    return i + 1


def _admit_tokens(s: SchedulerState, r: Request, n: int, budget: Budget, out: DecisionBuilder) -> None:
    prefill = r.in_prefill
    out.schedule(r, n, kv.allocate(s, r, n))
    budget.charge(n, prefill)


def _preempt(s: SchedulerState, victim: Request, budget: Budget, out: DecisionBuilder) -> None:
    """Take a running request back to the queue: swap its KV out if the policy swaps and there is
    room, else free it for recompute. Tokens it was given this step are refunded."""
    tokens, grown = out.unschedule(victim)
    if tokens:
        budget.refund(tokens, victim.in_prefill)
    if s.spec is not None:
        speculative.drop(s, victim)
    if s.pipe is not None:
        inflight.preempt(s, victim)
    s.running.remove(victim)
    victim.num_preemptions += 1
    out.preempted.append(victim.rid)
    keep = victim.blocks - grown
    if s.policy.preemption.mode is PreemptMode.SWAP and kv.can_swap_out(s, keep):
        kv.swap_out(s, victim, keep)
        victim.status = SWAPPED
    else:
        kv.free(s, victim)
        victim.num_computed = 0
        victim.status = WAITING
    victim.requeue_seq = s.take_seq()
    enqueue(s, victim)


def _admission_blocked(s: SchedulerState, out: DecisionBuilder) -> bool:
    return out.preempted_for_growth and s.policy.preemption.block_admission_after_preempt


def _waiting_pass(s: SchedulerState, budget: Budget, now_us: int, out: DecisionBuilder) -> None:
    """Admit waiting requests in queue order while budget and slots last (vLLM Phase B). With a KV connector's
    holders' queue (checker.semantics.transfer), its requests are scanned first; if that scan stops, so does
    the pass (vLLM 0.33 drains kv_holding_waiting first)."""
    if (not s.waiting and not s.holders) or _admission_blocked(s, out):
        return
    if s.holders and not _scan(s, s.holders, budget, out):
        return
    if s.waiting:
        _scan(s, s.waiting, budget, out)


def _scan(s: SchedulerState, waiting: list[Request], budget: Budget, out: DecisionBuilder) -> bool:
    """Try the requests of one queue in order; return False if the pass stops here (budget or slots spent, or
    a request that does not fit under strict head-of-line blocking).

    The scan visits the queue as it was when it began (``for r in list(waiting)``), but walks ``waiting``
    itself: a copy costs O(queue) every step, and under strict head-of-line blocking the pass mostly stops at
    the head. The scan changes the queue only by removing the request it admits (or moves to the holders'
    queue) and by enqueueing the requests it preempts (which it skips: they are in ``out.preempted``), and
    neither moves the other requests relative to each other; so after trying r, the next request to visit is
    the one that followed r before, wherever it is now.
    """
    strict = s.policy.queue.head_of_line is STRICT
    max_seqs = s.policy.batch.max_num_seqs
    inversion = s.policy.preempts_on_inversion
    preempted = out.preempted
    i = 0
    while i < len(waiting):
        if budget.tokens <= 0 or (len(s.running) >= max_seqs and not inversion):
            return False
        r = waiting[i]
        if r.rid in preempted:
            i += 1
            continue  # preempted in this step: not re-admitted before the next one
        size, victims = len(waiting), len(preempted)
        after = waiting[i + 1] if i + 1 < size else None
        if not _try_admit(s, r, budget, out) and strict:
            return False
        if len(waiting) == size and len(preempted) == victims:
            i += 1  # the queue did not change
        elif after is None:
            return True  # r was the last request of the queue as the scan began
        else:
            i = waiting.index(after, i)  # r left (admitted) and victims came in; those before it are not visited
    return True


def _try_admit(s: SchedulerState, r: Request, budget: Budget, out: DecisionBuilder) -> bool:
    """Try to admit a waiting request; return False if it does not fit (a LOADING request whose load is not yet
    reported is passed over: True; so is a request in a blocked waiting state under blocked_waiting skip)."""
    if s.blocked:
        over = blocked.passes_over(s, r)
        if over is not None:
            return over
    if r.status is LOADING:
        if not transfer.load_reported(s, r):
            return True
        transfer.promote(s, r)
    max_seqs = s.policy.batch.max_num_seqs
    while True:
        hit = kv.prefix_hit(s, r)  # looked up again after each preemption (a victim's blocks may free hit blocks)
        if hit:
            r.num_computed = len(hit) * s.policy.kv.block_size  # the chunk starts after the hit
        ext = transfer.external_tokens(s, r)
        if ext:  # an asynchronous load: it takes no tokens, and preempts nobody
            if len(s.running) < max_seqs and transfer.can_start_load(s, r, hit, ext, out):
                transfer.start_load(s, r, hit, ext, out)
                return True
            if hit:
                r.num_computed = 0
            return False
        n = num_new_tokens(s, r, budget)
        if n and s.spec is not None:  # uniform-decode padding (vLLM pad_spec_decode)
            n = speculative.pad(s, r, n, budget.tokens, out.scheduled, out.admitted)
            if n < 0:
                return False
        if n and len(s.running) < max_seqs and kv.can_admit(s, r, n, hit):
            _admit(s, r, n, hit, budget, out)
            return True
        if hit:
            r.num_computed = 0
        if n == 0:
            return False
        victim = _inversion_victim(s, r, out)
        if victim is None:
            return False
        _preempt(s, victim, budget, out)


def _inversion_victim(s: SchedulerState, head: Request, out: DecisionBuilder) -> Request | None:
    """Priority inversion: the worst request that was already running when the step began, if the
    waiting head outranks it by more than the threshold (vLLM v0 and SGLang look at the running batch
    of the previous step, not at requests admitted in this one)."""
    if not s.policy.preempts_on_inversion:
        return None
    candidates = [r for r in s.running if r.rid not in out.admitted]  # admitted this step: not yet running
    if not candidates:
        return None
    worst = max(candidates, key=victim_key(s))
    margin = norm_priority(s, worst) - norm_priority(s, head)
    return worst if margin > s.policy.preemption.priority_inversion_threshold else None


def _admit(s: SchedulerState, r: Request, n: int, hit: list[int], budget: Budget, out: DecisionBuilder) -> None:
    transfer.queue_of(s, r).remove(r)
    kv.swap_in_release(s, r)
    r.status = RUNNING
    r.admitted_seq = s.take_seq()
    s.running.append(r)
    out.admitted.append(r.rid)
    if hit:
        kv.adopt(s, r, hit)
        out.hits.append((r.rid, r.num_computed))
    _admit_tokens(s, r, n, budget, out)


def _mixed_pass(s: SchedulerState, budget: Budget, now_us: int, out: DecisionBuilder) -> None:
    """Orca-style: running and waiting requests in one pass, in queue order. A running request that
    cannot grow may preempt; a waiting request that does not fit stops admissions (strict HOL) or is
    skipped; running requests later in the order are still served."""
    key = key_function(s, now_us)
    strict = s.policy.queue.head_of_line is STRICT
    max_seqs = s.policy.batch.max_num_seqs
    admitting = True
    for r in sorted(s.running + s.waiting, key=key):
        if budget.tokens <= 0:
            return
        if r.status is RUNNING:
            if r.rid not in out.scheduled:
                _serve_running(s, r, s.running.index(r), budget, out)
        elif admitting and r.rid not in out.preempted and not _admission_blocked(s, out):
            if len(s.running) >= max_seqs and not s.policy.preempts_on_inversion:
                admitting = False
            elif not _try_admit(s, r, budget, out) and strict:
                admitting = False


# ----------------------------------------------------------------------------------------- 6: complete
def _compute(s: SchedulerState, out: DecisionBuilder) -> tuple[int, int, int, int]:
    """Compute the scheduled rows: tokens, output tokens, finishes (KV freed, or pinned on a prefill node), then the
    connector's reports. Returns (prefill tokens, decode rows, prefill attention, decode KV tokens)."""
    p = s.policy
    max_len = p.max_model_len
    fair = p.queue.order is TENANT_FAIR
    weights = p.queue.vtc_weights if fair else None
    prefill_tokens = decode_seqs = prefill_attention = decode_kv = 0
    by_rid = s.requests
    produced = out.produced
    spec, pipe = s.spec, s.pipe
    # with a batch in flight a finish waits for the batch to be resolved: marked now, or (with speculative decoding,
    # whose accepted drafts are known only then) found then
    finish = _finish if pipe is None else inflight.defer if spec is None else _not_yet
    for rid, n in out.scheduled.items():
        r = by_rid[rid]
        computed, generated = r.num_computed, r.num_generated
        total = r.prompt_len + generated
        if pipe is not None and inflight.dead(s, rid):  # a step after the one sampling its last token: dropped
            decode_seqs += 1
            decode_kv += total
            r.num_computed = computed + n
            continue
        if spec is not None and n > total - computed:  # a decode verifying drafts (checker.semantics.speculative)
            drafts = n - (total - computed)
            decode_seqs += 1
            decode_kv += total
            prefill_tokens += drafts  # the verified positions are priced as the step's prefill tokens
            prefill_attention += drafts * (computed + n)
            if pipe is not None:
                inflight.verify_later(s, r, n, drafts, speculative.choose(s, r, drafts))
                produced.append(rid)
                continue
            m, done = speculative.verify(s, r, drafts)
            produced.append(rid)
            if fair:
                s.tenant_counters[r.tenant] += weights.output_weight * m
            if done:
                _finish(s, r, out)
            continue
        if generated and computed + 1 == total:  # a decode: one token, always closing the gap
            decode_seqs += 1
            decode_kv += total
            r.num_computed = total
            r.num_generated = generated = generated + 1
            produced.append(rid)
            if fair:
                s.tenant_counters[r.tenant] += weights.output_weight
            if generated >= r.output_len or total + 1 >= max_len:
                finish(s, r, out)
            continue
        prefill_tokens += n  # a prefill chunk (or a recompute)
        prefill_attention += n * (computed + n)
        if fair:
            s.tenant_counters[r.tenant] += weights.input_weight * n
        r.num_computed = computed = computed + n
        if computed == total:  # the gap is closed: an output token is sampled
            r.num_generated += 1
            produced.append(rid)
            if fair:
                s.tenant_counters[r.tenant] += weights.output_weight
            if r.num_generated >= r.output_len or total + 1 >= max_len:
                finish(s, r, out)
    if pipe is not None:
        inflight.launch(s, out.scheduled, produced)
        inflight.resolve(s, out, _finish)
    if out.finished:
        s.running = [r for r in s.running if r.status is RUNNING]
    if spec is not None:
        speculative.propose(s, out.scheduled, produced)
    if s.holding and p.connector.enabled:
        transfer.report_phase(s, out)
    if s.loads_in_flight and p.connector.load_failure is LoadFailure.FAIL:
        transfer.fail_reported(s, out)
    return prefill_tokens, decode_seqs, prefill_attention, decode_kv


def _decide(s: SchedulerState, now_us: int, out: DecisionBuilder, counts: tuple[int, int, int, int],
            check_kv: bool = True) -> StepDecision:
    """The budgets asserted, and the step's frozen record."""
    p = s.policy
    prefill_tokens, decode_seqs, prefill_attention, decode_kv = counts
    _assert_budgets(s, out, prefill_tokens + decode_seqs, check_kv)
    return StepDecision(  # positional, in field order (the hot path of explorers and fuzzing)
        s.step, now_us, tuple(out.scheduled.items()), tuple(out.produced), tuple(out.arrived), tuple(out.admitted),
        tuple(out.preempted), tuple(out.finished), tuple(out.rejected), tuple(out.cancelled), tuple(out.released),
        prefill_tokens, decode_seqs, prefill_attention, decode_kv, s.kv_used, p.kv.num_blocks - s.kv_used,
        len(s.running), len(s.waiting) + len(s.holders), tuple(out.hits), tuple(out.loads))


def _not_yet(s: SchedulerState, r: Request, out: DecisionBuilder) -> None:
    """A finish found when the batch is resolved (checker.semantics.inflight)."""


def _finish(s: SchedulerState, r: Request, out: DecisionBuilder) -> None:
    r.status = FINISHED
    r.reason = Reason.STOPPED if r.num_generated >= r.output_len else Reason.LENGTH_CAPPED
    if s.policy.connector.pins:
        transfer.pin(s, r)
    else:
        kv.free(s, r)
    out.finished.append(r.rid)


def _assert_budgets(s: SchedulerState, out: DecisionBuilder, total: int, check_kv: bool) -> None:
    """The end-of-step asserts of vLLM's scheduler; a failure is a bug in batchcheck."""
    p = s.policy
    problems = []
    if total > p.step_token_bound:
        problems.append(f"scheduled {total} tokens > the step's bound {p.step_token_bound} (max_num_batched_tokens="
                        f"{p.batch.max_num_batched_tokens})")
    if len(s.running) > p.batch.max_num_seqs:
        problems.append(f"{len(s.running)} running > max_num_seqs={p.batch.max_num_seqs}")
    if check_kv and p.kv.check_allocation and p.kv.prefix_caching.count_evictable_hits and s.kv_used > p.kv.num_blocks:
        problems.append(f"{s.kv_used} blocks used > num_blocks={p.kv.num_blocks}")
    if s.swap_used > p.kv.swap_blocks:
        problems.append(f"{s.swap_used} swap blocks used > swap_blocks={p.kv.swap_blocks}")
    if problems:
        raise InternalError(f"step {s.step}: asserted budget broken: " + "; ".join(problems))
