"""Fast-forward over quiet decode stretches: the closed form of iterating the step.

After a step in which every running request decoded one token and nothing else happened to the batch,
the next steps do the same until an event: a request reaches its last token, the pool runs out of
blocks, or an external or internal event is due. Those steps change the state in a way that has a
closed form (every running request gains k tokens; block counts follow), so the engine applies them
at once.

Why the waiting queue stays blocked: in the quiet step the waiting pass admitted nothing, and during
the stretch every admission condition can only get harder (free blocks fall, the budget left and the
running count stay the same). Arrivals, rejections, cancellations and releases in that step do not
matter: they happen before its schedule phase, so its waiting pass already saw the queue and the pool
they left. Admissions, preemptions and finishes do (the batch or the pool changes after the waiting pass).
Orders whose keys change while requests wait (aging, tenant counters) are excluded when anyone waits.
With nobody waiting and every running request one token behind, the stretch can start right after any
step.

With prefix caching (block identity, ``s.pool``) the decodes also take blocks from the head of the free
queue (evicting cached free blocks) and cache each block as it fills; the stretch replays exactly those
pool operations, in the order plain stepping does them (step by step, in the order the batch is served,
take before cache; under the mixed pass that is queue order, so time-varying orders are left to plain
stepping there).
A waiting request's admission then also depends on its prefix-cache hit, which the stretch could change
in two ways: a take evicts one of the hit's blocks, or a decode caches the block that extends the hit.
The stretch stops before the first step that would do either (the hit stays as the quiet step saw it,
and the argument above holds again); under reserve_full_prompt, only before the extension: an eviction can
only shorten the hit, which keeps the request out (evictions_keep_blocked). That needs the quiet step's waiting pass to have run after its
decodes (decode-first); under prefill-first and mixed passes, with someone waiting, plain stepping goes on.

Arrivals during a stretch (``arrivals_may_join``, ``joins_behind_head``): with someone waiting, strict
head-of-line blocking, a queue order that does not change while requests wait, no queue timeout and a
long-prefill threshold that does not read the queue's length, a request that arrives and goes behind the
queue's head changes nothing the stretch's steps do: every waiting pass tries the head only, with the same
budget, slots and (falling) free blocks as the quiet step's, and stops there; the arrival's own admission
control reads the queue's and the batch's lengths and the policy, not the tokens the batch has decoded. So
the engine lets such arrivals join (or be rejected) at the step they are due and goes on; the stretch stops
before the first step with an arrival that would go ahead of the head.
The step in which the first requests reach their last token may be a stretch's last step (``finish_at``,
``finish_stretch``; the engine and check-log's lockstep engine do this, both through engine.quiet_stretch): its
waiting pass runs before its decodes finish, so it sees what the other steps of the stretch see; its finishes
change the batch and the pool for the step after it, which is stepped plainly.
tests/conformance/test_fastforward.py pins this module to plain
stepping: same final state, same pool, same metrics.
"""

from __future__ import annotations

from checker.policy import HeadOfLine, PhaseMode, QueueOrder
from checker.profile import Profile
from checker.semantics.blockpool import NO_PARENT, BlockPool
from checker.semantics.blocked import pending as blocked_pending
from checker.semantics.decision import DecisionBuilder, StepDecision
from checker.semantics.kv import blocks_for
from checker.semantics.order import key_function, time_varying
from checker.semantics.state import Request, SchedulerState, Status
from checker.semantics.step import _finish as finish_request  # the one definition of a finish


# Passes that try waiting requests before (some of) the step's decodes take and cache their blocks: the
# quiet step's waiting pass then saw a hit that its own decodes may have changed since (a block cached that
# extends it, one evicted that shortens it), so with block identity only plain stepping knows the next step.
_TRY_BEFORE_DECODES = frozenset({PhaseMode.PREFILL_FIRST, PhaseMode.MIXED})


def next_steps_are_quiet_decodes(s: SchedulerState, d: StepDecision) -> bool:
    """Whether the steps after d (until an event) only decode one token per running request.

    Either d itself was such a step (then the waiting queue is blocked and stays blocked), or nobody
    waits and every running request is one token behind (then there is nothing else to schedule).
    """
    if not s.running or s.holding or s.holders or s.loads_in_flight:
        return False  # a release, or a transfer report, may come in the middle of a stretch
    if s.blocked and blocked_pending(s):
        return False  # a grammar may become ready in the middle of a stretch (checker.semantics.blocked)
    if s.pipe is not None:
        return False  # async scheduling: finishes and frees come a step after the last token (not modelled here)
    if s.spec is not None:
        return False  # speculative decoding: a decode takes 1 + drafts tokens and 1..k+1 outputs (not a quiet stretch)
    if s.sglang is not None:
        return _sglang_quiet(s)
    if s.pool is not None and s.policy.batch.phase_mode is PhaseMode.MIXED and time_varying(s):
        return False  # the mixed pass serves the batch in queue order, which such orders change: so does the pool's
    if not s.waiting:
        return all(r.num_generated and r.num_computed + 1 == r.prompt_len + r.num_generated for r in s.running)
    pool = s.pool
    if pool is not None and (not pool.chained or s.policy.batch.phase_mode in _TRY_BEFORE_DECODES):
        return False  # unchained hashes (a planted bug): hits are not prefixes; see _TRY_BEFORE_DECODES
    return bool(
        len(d.scheduled) == len(s.running) and not d.num_prefill_tokens
        and not (d.admitted or d.preempted or d.finished) and not time_varying(s))


def _sglang_quiet(s: SchedulerState) -> bool:
    """Under SGLang's rules: the next steps only decode while every running request is one token behind, no
    request is chunked or marked aborted, the next step's filters keep batch_is_full, and no prefill batch is
    tried (nobody waits, or batch_is_full holds without priority preemption). The stretch stops before a
    finish and before the decode whose pages are not free (a retraction), as under the vLLM rules; each of
    its steps decays the new-token ratio (apply_stretch). Not with the radix cache: its decodes evict the tree when
    the free pages run short of a page per request, which the stretch's closed form does not do."""
    g = s.sglang
    if g.chunked is not None or g.shrunk or g.remade or g.aborting or g.tree is not None:
        return False
    if s.waiting and not (g.batch_is_full and not s.policy.preempts_on_inversion):
        return False
    return all(r.num_generated and r.num_computed + 1 == r.prompt_len + r.num_generated for r in s.running)


def arrivals_may_join(s: SchedulerState) -> bool:
    """Whether requests may arrive during a quiet stretch (behind the queue's head: joins_behind_head) without
    changing its steps: someone waits, only the head is tried (strict head-of-line blocking) in a static
    queue order, no queue timeout (an arrival would bring one), and the step's long-prefill threshold does not
    read the queue's length (threshold_adaptive divides the budget by it)."""
    p = s.policy
    chunking = p.chunking
    return bool(s.waiting and p.queue.head_of_line is HeadOfLine.STRICT and not time_varying(s)
                and p.timeouts.queue_timeout_ms is None
                and not (chunking.long_prefill_token_threshold and chunking.threshold_adaptive))


def joins_behind_head(s: SchedulerState, r: Request) -> bool:
    """Whether the arriving request, if admission control lets it in, is enqueued behind the queue's head."""
    key = key_function(s, 0)  # a static order (arrivals_may_join): the clock is not read
    return bool(s.waiting) and key(r) > key(s.waiting[0])


def stretch_durations(s: SchedulerState, profile: Profile, start_us: int, horizon_us: int | None,
                      max_steps: int, finish_at: int | None = None) -> list[int]:
    """Durations of the quiet decode steps that follow, each starting before horizon_us, while no
    request reaches its last token, the pool has the blocks the decodes need and (with prefix caching)
    the prefix-cache hits of the waiting requests the step would try stay as they are.

    ``finish_at`` (``finishing_step(s)``, where ``may_finish_in_stretch``): the step in which the first requests
    reach their last token may be the stretch's last step."""
    p = s.policy
    running = s.running
    k = finishing_step(s) - 1 if finish_at is None else finish_at
    k = min(k, max_steps)
    if k <= 0:
        return []
    durations = profile.decode_steps_us(len(running), sum(r.num_computed for r in running), k, start_us, horizon_us)
    k = len(durations)
    if k and p.kv.check_allocation:
        size = p.kv.block_size
        free = p.kv.num_blocks - s.kv_used
        pool = s.pool
        if pool is not None and s.waiting:
            tried = _tried(s)
            if tried:
                k = min(k, _steps_before_extension(pool, s, tried, k))
                if k and free > 0 and not evictions_keep_blocked(p):
                    free = min(free, _takes_before_eviction(pool, s, tried, k))
                del durations[k:]
        room = [r.blocks * size - r.num_computed for r in running]  # tokens each can take before its next block

        def need(j: int) -> int:  # blocks the first j steps take: sum(max(0, blocks_for(c + j) - blocks)), per room
            return sum((j - left - 1) // size + 1 for left in room if left < j)

        if k and need(k) > free:
            lo, hi = 0, k  # need(lo) <= free < need(hi)
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if need(mid) <= free:
                    lo = mid
                else:
                    hi = mid
            del durations[lo:]
    return durations


def finishing_step(s: SchedulerState) -> int:
    """The first of the next decode steps (1, 2, ...) in which some running request reaches its last token
    (its output length, or the model's context: what _compute finishes after a decode)."""
    max_len = s.policy.max_model_len
    return min(min(r.output_len, max_len - r.prompt_len) - r.num_generated for r in s.running)


def may_finish_in_stretch(s: SchedulerState) -> bool:
    """Whether a stretch may end with the step in which requests finish (finish_stretch): under the vLLM rules,
    without pinning finished requests' blocks (a connector's prefill node). That step's waiting pass runs before
    its decodes finish (the complete phase), so it sees the blocked queue the other steps of the stretch see; the
    finishes change the batch and the pool for the step after it, which the engine steps plainly."""
    return s.sglang is None and not s.policy.connector.pins


def finish_stretch(s: SchedulerState) -> list[Request]:
    """After the stretch's last step applied (apply_stretch), finish the requests that reached their last token
    in it, in the order the step served them (as _compute does: status, reason, KV freed); return them."""
    max_len = s.policy.max_model_len
    served = s.running
    if s.policy.batch.phase_mode is PhaseMode.MIXED:
        served = sorted(served, key=key_function(s, 0))
    out = DecisionBuilder()
    done = [r for r in served if r.num_generated >= r.output_len or r.prompt_len + r.num_generated >= max_len]
    for r in done:
        finish_request(s, r, out)
    s.running = [r for r in s.running if r.status is Status.RUNNING]
    return done


def apply_stretch(s: SchedulerState, k: int) -> None:
    """The state after k quiet decode steps."""
    p = s.policy
    size = p.kv.block_size
    if s.pool is not None:
        _apply_pool(s, s.pool, k)
    else:
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
    g = s.sglang
    if g is not None:  # each decode step without a retraction decays the ratio (the same float operations)
        rules = p.sglang
        decay, floor, ratio = rules.ratio_decay, rules.min_ratio, g.ratio
        for _ in range(k):
            if ratio == floor:
                break
            ratio = max(ratio - decay, floor)
        g.ratio = ratio
        g.ran_batch = True
    s.step += k


# ----------------------------------------------------------------------------------------- prefix caching
def _apply_pool(s: SchedulerState, pool: BlockPool, k: int) -> None:
    """k decode steps with block identity: what kv.allocate does for each decode, step by step."""
    size = pool.block_size
    running = s.running
    if s.policy.batch.phase_mode is PhaseMode.MIXED:  # served in queue order (a static one: see above)
        running = sorted(running, key=key_function(s, 0))
    events: list[tuple[int, int, int]] = []  # (step, place in serving order, 0 take / 1 cache), as plain stepping
    for m, r in enumerate(running):
        c0 = r.num_computed  # step j computes token c0 + j - 1: it needs blocks_for(c0 + j) blocks and caches
        j = r.blocks * size - c0 + 1  # the full blocks among the first c0 + j tokens
        while j <= k:
            events.append((j, m, 0))
            j += size
        j = max(1, (r.num_cached_blocks + 1) * size - c0)
        while j <= k:
            events.append((j, m, 1))
            j = ((c0 + j) // size + 1) * size - c0
    events.sort()
    for j, m, kind in events:
        r = running[m]
        if kind:
            pool.cache(r, r.num_computed + j)
        else:
            pool.take(r, 1)
            r.blocks += 1
    for r in running:
        r.num_computed += k
        r.num_generated += k
    s.kv_used = pool.num_used


def _tried(s: SchedulerState) -> list[Request]:
    """The waiting requests whose prefix-cache hit the next steps' waiting pass reads: every waiting request
    (the head only under strict head-of-line blocking, where the pass stops at the first that does not fit),
    none under static batching while a batch runs. Only those with a hit to look up (nothing computed), and
    only those the quiet step itself tried: a request the waiting pass reached has its chain computed to its
    hit limit (BlockPool.hit), and the passes of the stretch reach the same requests as the quiet step's."""
    p = s.policy
    if p.batch.phase_mode is PhaseMode.STATIC:
        return []
    candidates = s.waiting[:1] if p.queue.head_of_line is HeadOfLine.STRICT else s.waiting
    pool = s.pool
    return [r for r in candidates if not r.num_computed and 0 < pool.hit_limit(r) <= len(r.chain)]


def _steps_before_extension(pool: BlockPool, s: SchedulerState, tried: list[Request], k: int) -> int:
    """The most steps (<= k) before a decode caches a block with the chain that would extend a tried
    request's hit. Running requests with their own tokens (no content) never do (their chains are theirs);
    for the others, the chains of the blocks they will cache are read from their chain, or looked up in the
    interning table without adding to it (a chain not there yet is new, and so are its children)."""
    wanted = set()
    for r in tried:
        if r.spec.content is not None:
            nxt = pool.cached_prefix(r.chain, pool.hit_limit(r))[1]
            if nxt >= 0:
                wanted.add(nxt)
    if not wanted:
        return k
    size = pool.block_size
    limit = k
    for q in s.running:
        content = q.spec.content
        if content is None:
            continue
        c0 = q.num_computed
        last = (c0 + limit) // size  # blocks [num_cached_blocks, last) get cached within the steps left
        chain = q.chain
        i = q.num_cached_blocks
        parent = chain[i - 1] if i else NO_PARENT
        while i < last:
            if i < len(chain):
                h = chain[i]
            else:
                h = pool.known_chain(q, i, parent)
                if h is None:
                    break  # a new chain: not one a waiting request has
            if h in wanted:
                limit = min(limit, max(1, (i + 1) * size - c0) - 1)  # stop before the step that caches it
                break
            parent = h
            i += 1
    return max(0, limit)


def evictions_keep_blocked(p) -> bool:
    """Whether evictions of a tried request's hit blocks during a stretch keep it blocked, so that the stretch
    need not stop before them: with ``reserve_full_prompt`` and no connector loading KV (then an external load,
    not the pool, decides).

    Why. Under reserve_full_prompt the request is admitted iff a chunk is due (n > 0) and the blocks of its whole
    sequence fit: W - held <= F, with W = max(target_blocks(r, 0), blocks_for(num_tokens)) (W >= the hit's
    length, and the hit's length does not change W otherwise), held = its hit blocks less the free ones (less
    none without count_evictable_hits), F = admission_free; the chunk's own condition, blocks_for(hit + n) <= W
    blocks, follows from it. The quiet step tried it and it stayed (W - held > F, or n = 0). During the stretch
    nothing is freed or adopted: held blocks stay held, a free cached block stays free or is evicted by a take,
    and each of the t takes lowers F by one. The hit never grows (_steps_before_extension stops before the step
    that would cache the chain extending it). A position of the hit whose first cached block is still there keeps
    its held or free state; one whose first block was evicted either ends the hit or is now named by another block
    of the same chain (perhaps held: one cached by a decode). So held' <= held + evictions <= held + t, and
    W - held' >= W - held - t > F - t = F'. n stays 0 if it was: a shorter hit only widens the gap (>= 1) that
    the budget, threshold and prefill caps cut, which do not read the hit. Nothing of a failed try is kept (its
    chain is computed to the hit's limit already: _tried). tests/conformance/test_fastforward.py
    ::test_stretches_run_through_evictions_of_a_blocked_hit pins it."""
    return bool(p.admission.reserve_full_prompt and not p.connector.loads)


def _takes_before_eviction(pool: BlockPool, s: SchedulerState, tried: list[Request], k: int) -> int:
    """How many blocks the decodes may take before one of them evicts a block of a tried request's hit:
    takes use the uncached free blocks first, then the cached free ones in LRU order."""
    protected = set()
    for r in tried:
        protected.update(pool.cached_prefix(r.chain, pool.hit_limit(r))[0])
    fresh = max(0, pool.uncached_free)
    if not protected:
        return fresh + len(pool.lru)
    size = pool.block_size
    evictions = sum(max(0, blocks_for(r.num_computed + k, size) - r.blocks) for r in s.running) - fresh
    for position, b in enumerate(pool.lru):
        if position >= evictions:
            break
        if b in protected:
            return fresh + position
    return fresh + len(pool.lru)
