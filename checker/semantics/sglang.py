"""SGLang's scheduling rules (policy ``scheduler: sglang``): phase 5 of the step as SGLang 0.5.23's scheduler
does it, over the same requests, KV pool and lifecycle as the vLLM rules (docs/sglang-harness.md, section 3,
derives each rule from SGLang's code; docs/semantics.md, "SGLang's rules", says it in prose).

One step is one iteration of SGLang's normal event loop (``get_next_batch_to_run``, then the batch's result):

1. the running batch: every running request but the chunked one, in SGLang's batch order; the flag
   ``batch_is_full`` is cleared when a request of the last batch ended, or left it as the chunked request;
2. a prefill batch is formed whenever one can be (the prefill adder below), and runs instead of decode; with
   mixed chunk the running requests decode inside it when their next pages fit;
3. otherwise the running batch decodes: if its next pages do not fit, ``retract_decode`` frees requests (fewest
   output tokens first, longest prompt among equals) until they do, aborting the last one if even it does not
   fit, and the new-token ratio is re-estimated; else the ratio decays by one step.

The prefill adder admits against a float budget: free tokens minus, for each running request, its clipped
remaining output times the new-token ratio, minus for each admitted request its page-ceiled extend, one page and
its clipped max_new_tokens. Allocation is page-granular (kv.block_size is the page): a request holds
ceil(tokens / page) pages.

With the radix cache (policy.sglang.radix_cache; checker.semantics.radix) the free tokens the adder sees include the
tree's evictable ones; a waiting request starts from its longest cached page-aligned prefix (locked while it runs:
``r.blocks`` counts only the pages it holds beyond the tree's); prefilled requests (the chunked one at the next
step's start), finished and aborted ones insert their page-aligned tokens; allocation, decode and retraction evict
the shortfall from the tree, least recently used leaves first; and the cache-aware queue orders lpm and dfs-weight
read the tree (docs/semantics.md, "SGLang's radix cache").
"""

from __future__ import annotations

from collections.abc import Callable
from enum import IntEnum

from checker.policy import Polarity, Policy, QueueOrder, SGLangQueue, Victim
from checker.requests import GREEDY_OUTPUT_TOKEN, TOKEN_ID_SPAN
from checker.semantics import kv
from checker.semantics.decision import DecisionBuilder
from checker.semantics.radix import Node
from checker.semantics.state import Reason, Request, SchedulerState, SGLangState, Status

WAITING, RUNNING, CANCELLED, FINISHED = Status.WAITING, Status.RUNNING, Status.CANCELLED, Status.FINISHED
# SGLang's WAITING_QUEUE_PREFIX_MATCH_MAX (lpm runs as fcfs above it; the waiting-prefix refresh touches this many),
# IN_BATCH_PREFIX_CACHING_CHECK_THRESHOLD / _DEPRIORITIZE_THRESHOLD, WAITING_PREFIX_REFRESH_INTERVAL.
PREFIX_MATCH_MAX = 128
IN_BATCH_CHECK = 32
IN_BATCH_DEPRIORITIZE = 32
REFRESH_INTERVAL = 32


def enter_queue(s: SchedulerState, r: Request) -> None:
    """_add_request_to_queue: appended to the waiting queue, its entry time stamped."""
    g = s.sglang
    g.next_entry += 1
    g.entry[r.rid] = g.next_entry
    s.waiting.append(r)


class Verdict(IntEnum):  # AddReqResult
    CONTINUE = 0
    NO_TOKEN = 1
    OTHER = 2


class Adder:
    """One prefill pass's budgets (PrefillAdder and PrefillBudget): tokens are floats where SGLang's are."""

    __slots__ = ("s", "page", "clip", "ratio", "rem_input", "rem_chunk", "total_offset", "current_offset",
                 "can_run", "new_chunked", "preempted", "batch", "req_states", "hits")

    def __init__(self, s: SchedulerState, batch: list[Request], mixed_rows: int):
        p = s.policy
        rules = p.sglang
        self.s = s
        self.page = p.kv.block_size
        self.clip = rules.clip_max_new_tokens
        self.ratio = s.sglang.ratio
        self.rem_input = rules.max_prefill_tokens - mixed_rows
        self.rem_chunk = p.batch.max_num_batched_tokens - mixed_rows if p.chunking.enabled else None
        self.current_offset = mixed_rows
        self.total_offset = mixed_rows + sum([self.reservation(r) for r in batch])
        self.can_run: list[tuple[Request, int]] = []  # (request, extend tokens) in admission order
        self.new_chunked: Request | None = None
        self.preempted: list[Request] = []
        self.batch = batch  # the running batch (priority preemption shrinks it in place)
        self.req_states: list[tuple[float, int]] | None = None  # add_one_req_ignore_eos's simulation, once built
        self.hits: dict[int, tuple[int, Node]] = {}  # radix cache: an admitted request's (prefix, locked node)

    def ratio_of(self, r: Request) -> float:
        """The new-token ratio SGLang applies to a request: 1.0 for a fixed-length one (ignore_eos)."""
        return 1.0 if r.spec.ignore_eos else self.ratio

    def reservation(self, r: Request) -> float:
        """A running request's estimated future tokens (_get_running_request_total_token_offset)."""
        return min(r.max_output - r.num_generated, self.clip) * self.ratio_of(r)

    def available(self) -> int:
        """Free tokens: free pages times the page (the allocator's available_size; with the radix cache, plus the
        tree's evictable tokens, PrefillBudget._available_and_evictable, which kv.free_blocks counts free)."""
        return kv.free_blocks(self.s) * self.page

    def remaining_total(self) -> float:
        return self.available() - self.total_offset

    def ceil_page(self, tokens: int) -> int:
        return -(-tokens // self.page) * self.page

    def reserve(self, extend: int, max_new: int) -> None:
        """_update_prefill_budget: the page-ceiled extend and one page now, max_new later."""
        e = self.ceil_page(extend)
        self.total_offset += e + self.page + max_new
        self.current_offset += e + self.page
        self.rem_input -= e
        if self.rem_chunk is not None:
            self.rem_chunk -= e

    def state(self) -> Verdict:
        """budget_state()."""
        available = self.available()
        if not (available - self.total_offset > 0 and available - self.current_offset > 0):
            return Verdict.NO_TOKEN
        if self.rem_input <= 0 or (self.rem_chunk is not None and self.rem_chunk <= 0):
            return Verdict.OTHER
        return Verdict.CONTINUE

    def add_chunked(self, r: Request) -> bool:
        """add_chunked_req: the next chunk of the chunked request (a continuation always makes progress); whether it
        is still chunked after it."""
        limit = min(self.rem_chunk, int(self.remaining_total()))
        if limit <= 0:
            limit = self.rem_chunk
        self.s.sglang.fill[r.rid] = r.prompt_len + r.num_generated
        extend = r.gap
        truncated = extend > limit
        n = min(extend, limit)
        self.can_run.append((r, n))
        self.reserve(n, 0 if truncated else min(r.max_output, self.clip))
        return truncated

    def add_one(self, r: Request) -> Verdict:
        """add_one_req. With the radix cache, init_next_round_input matches the request (at most all its tokens but
        the last) and the matched node is locked while it is checked (its tokens protected, no longer evictable) and
        from its admission on."""
        g = self.s.sglang
        tree = g.tree
        if tree is None:
            if r.spec.ignore_eos:
                return self.add_one_ignore_eos(r)
            g.fill[r.rid] = r.prompt_len + r.num_generated  # init_next_round_input
            return self._add_one(r, 0)
        fill = r.prompt_len + r.num_generated
        g.fill[r.rid] = fill
        prefix, node = tree.match(fill_tokens(self.s, r), fill - 1)
        g.prefix[r.rid] = prefix
        lock(self.s, node)  # _lock_node, for the check
        admitted = len(self.can_run)
        verdict = self._add_one(r, prefix)
        if len(self.can_run) > admitted:
            lock(self.s, node)  # _commit_prefill_admission: req.lock
            self.hits[r.rid] = (prefix, node)
        unlock_node(self.s, node)
        return verdict

    def _add_one(self, r: Request, prefix: int) -> Verdict:
        """add_one_req's budget checks and commit, for a request whose first prefix tokens are cached."""
        max_new = min(max(r.max_output - r.num_generated, 0), self.clip)
        extend = r.prompt_len + r.num_generated - prefix
        if not extend + max_new + self.page < self.remaining_total():  # PrefillBudget.check_prefill
            return Verdict.NO_TOKEN
        whole = self.ceil_page(extend)
        if self.rem_chunk is None and self.can_run and whole >= self.rem_input:
            return Verdict.OTHER  # without chunking only the first request may exceed the input cap
        max_new = min(r.max_output, self.clip)  # admitted whole: the full clipped budget, not the remaining one
        if self.rem_chunk is not None and whole > self.rem_chunk:
            extend = self.rem_chunk // self.page * self.page
            if extend <= 0:
                return Verdict.OTHER
            self.new_chunked = r
            max_new = 0
        self.can_run.append((r, extend))
        self.reserve(extend, max_new)
        return self.state()


    def add_one_ignore_eos(self, r: Request) -> Verdict:
        """add_one_req_ignore_eos (a fixed-length request with the radix cache disabled): its page-ceiled extend and
        a page must fit now, and a simulation in which the requests finish in order of tokens left (each then
        freeing its prompt and output) must keep a token per live request free at every point."""
        extend = r.prompt_len + r.num_generated
        self.s.sglang.fill[r.rid] = extend  # init_next_round_input
        paged = self.ceil_page(extend) + self.page
        available = self.available()
        current = available - self.current_offset
        if not paged <= min(current, available - self.total_offset):
            return Verdict.NO_TOKEN
        states = self.req_states
        if states is None:
            states = self.req_states = []
            for q in [r, *self.batch, *(x for x, _ in self.can_run)]:
                self._add_state(q, False)
            states.sort(key=lambda x: x[0])
        else:
            self._add_state(r, True)
        rem, freed = current - paged, 0
        n = len(states)
        for i, (left, occupied) in enumerate(states):
            alive = n - i
            if rem + freed - left * alive <= IGNORE_EOS_RESERVE_TOKENS * alive:
                return Verdict.NO_TOKEN
            freed += occupied
        if self.rem_chunk is None or extend <= self.rem_chunk:
            self.can_run.append((r, extend))
            self.reserve(extend, min(r.max_output, self.clip))
        else:
            if self.rem_chunk <= 0:
                return Verdict.OTHER
            self.can_run.append((r, self.rem_chunk))  # cut at the chunk budget, not at a page boundary
            self.truncate_earlier_chunk()
            self.new_chunked = r
            self.reserve(self.rem_chunk, 0)
        return self.state()

    def truncate_earlier_chunk(self) -> None:
        """A second chunk in one pass: unlike add_one_req (whose page-aligned cut of what is left is empty after a
        cut), the ignore_eos path cuts at the raw chunk budget, and SGLang keeps only the last new_chunked_req. The
        request cut before it is then taken as prefilled: its forward samples a token after the chunk, and the rest
        of its prompt is never computed (SGLang 0.5.23, seen in the real scheduler; docs/semantics.md). Its prompt
        ends where this step's chunk ends."""
        earlier = self.new_chunked
        if earlier is not None:
            n = next(n for q, n in self.can_run if q is earlier)
            earlier.prompt_len = earlier.num_computed + n - earlier.num_generated

    def _add_state(self, q: Request, insert_sort: bool) -> None:
        """add_req_state: (tokens left, tokens occupied); insert_sort keeps SGLang's insertion, which puts a request
        with more tokens left than all the others before the last one."""
        left = q.max_output * self.ratio_of(q) - q.num_generated
        if left <= 0:
            return
        entry = (left, q.prompt_len + q.num_generated)
        states = self.req_states
        if not insert_sort:
            states.append(entry)
            return
        i = 0
        for i in range(len(states)):
            if left <= states[i][0]:
                break
        states.insert(i, entry)


# SGLang's IGNORE_EOS_RESERVE_TOKENS: tokens kept free per live request in the ignore_eos simulation.
IGNORE_EOS_RESERVE_TOKENS = 1


# ----------------------------------------------------------------------------------------- the step's phase 5
def schedule(s: SchedulerState, out: DecisionBuilder) -> None:
    """get_next_batch_to_run and the batch's allocation; the shared phase 6 computes the rows."""
    g = s.sglang
    if g.tree is not None and g.chunked is not None:
        checkpoint(s, s.requests[g.chunked], False)  # stash_chunked_request: its chunks so far join the tree
    if g.shrunk:
        g.batch_is_full = False
    formed = _prefill(s, g, out)
    if not formed:
        batch = running_batch(s)
        if batch:
            _decode(s, g, batch, out)
    ran = bool(out.scheduled)
    if not ran and not s.running and not s.waiting and not g.ran_batch:
        g.ratio = s.policy.sglang.init_ratio  # on_idle: is_fully_idle() resets the ratio
    g.ran_batch = ran


def running_batch(s: SchedulerState) -> list[Request]:
    """The running batch: s.running itself when no request is chunked (the callers change s.running only by
    removing requests or by rebinding it)."""
    chunked = s.sglang.chunked
    if chunked is None:
        return s.running
    return [r for r in s.running if r.rid != chunked]


def _prefill(s: SchedulerState, g: SGLangState, out: DecisionBuilder) -> bool:
    """_get_new_batch_prefill_raw: whether a prefill batch formed (its rows are scheduled)."""
    p = s.policy
    preempting = p.preempts_on_inversion  # priority preemption
    batch = running_batch(s)
    if preempting or not batch:
        g.batch_is_full = False
    chunked = None if g.chunked is None else s.requests[g.chunked]
    if (g.batch_is_full or not s.waiting) and chunked is None:
        return False
    max_running = p.batch.max_num_seqs
    if max_running - len(batch) <= 0 and chunked is None and not preempting:
        g.batch_is_full = True
        return False
    _sort_queue(s, g)
    mixed = p.sglang.mixed_chunk and p.chunking.enabled
    adder = Adder(s, batch, len(batch) if mixed else 0)
    if chunked is not None and not adder.add_chunked(chunked):
        g.chunked = None
    for r in list(s.waiting):
        if adder.state() is Verdict.OTHER:
            break
        if len(adder.can_run) >= max_running - len(batch):
            g.batch_is_full = True
        if g.batch_is_full and not (preempting and _preempt_to_schedule(s, g, adder, batch, r, out)):
            break
        verdict = adder.add_one(r)
        if verdict is not Verdict.CONTINUE:
            if verdict is Verdict.NO_TOKEN:
                g.batch_is_full = bool(adder.can_run) or bool(batch)
            break
    if not adder.can_run:
        for v in adder.preempted:
            enter_queue(s, v)
        return False
    admitted = {r.rid for r, _ in adder.can_run}
    s.waiting = [r for r in s.waiting if r.rid not in admitted]
    for v in adder.preempted:
        enter_queue(s, v)
    if adder.new_chunked is not None:
        g.chunked = adder.new_chunked.rid
    tree = g.tree
    page = p.kv.block_size
    if tree is not None:
        for rid, (prefix, node) in adder.hits.items():  # the cached prefix counts as computed, the node stays locked
            r = s.requests[rid]
            r.num_computed = prefix
            g.protected[rid] = prefix
            g.node[rid] = node
        # prepare_for_extend's allocation evicts its shortfall first (paged: a page more per request)
        evict_for(s, sum([n for _, n in adder.can_run]) + (len(adder.can_run) * page if page > 1 else 0))
        g.extend_rows = admitted
    rows = []
    for r, n in adder.can_run:
        if r.status is not RUNNING:
            r.status = RUNNING
            r.admitted_seq = s.take_seq()
            out.admitted.append(r.rid)
        out.schedule(r, n, kv.allocate(s, r, n) if tree is None else grow(s, r, n))
        if r.rid != g.chunked:
            rows.append(r)
    decoding = mixed and bool(batch) and decode_fits(s, batch)
    if decoding:
        if tree is not None:
            evict_for(s, len(batch) * page)  # prepare_for_decode: a page per request, assumed
        for r in batch:
            out.schedule(r, 1, kv.allocate(s, r, 1) if tree is None else grow(s, r, 1))
            g.fill[r.rid] = r.prompt_len + r.num_generated  # refresh_fill_ids
        order = rows + batch  # mix_with_running: the mixed batch is the next running batch
    else:
        order = batch + rows  # merge_batch at the next get_next_batch_to_run
    # The next running batch is this batch's object (its batch_is_full false) when it is mixed, or when the running
    # batch is empty (the flag set above on the empty one is dropped with it).
    g.remade = decoding or not batch
    s.running = order + ([s.requests[g.chunked]] if g.chunked is not None else [])
    return True


def _sort_queue(s: SchedulerState, g: SGLangState) -> None:
    """SchedulePolicy.calc_priority (stable sorts of the queue in place): fcfs (by priority, then entry, with priority
    scheduling), lof, and with the radix cache lpm (fcfs, priority ignored, while more than 128 wait) and dfs-weight;
    then, under a cache-agnostic order with the cache, every 32nd call touches the first 128 waiting requests'
    prefixes, the head last (_touch_waiting_prefixes)."""
    p = s.policy
    policy = p.sglang.schedule_policy
    priority = p.queue.order is QueueOrder.PRIORITY
    sign = 1 if p.queue.priority_polarity is Polarity.LOWER_FIRST else -1
    entry = g.entry
    aware = policy is SGLangQueue.DFS_WEIGHT or (policy is SGLangQueue.LPM and len(s.waiting) <= PREFIX_MATCH_MAX)
    if aware:
        _sort_cache_aware(s, g, policy)
        return
    if policy is SGLangQueue.LOF:
        if priority:
            s.waiting.sort(key=lambda r: (r.priority * sign, -r.max_output))
        else:
            s.waiting.sort(key=lambda r: -r.max_output)
    elif priority and policy is SGLangQueue.FCFS:  # an lpm queue that fell back is not priority-sorted
        s.waiting.sort(key=lambda r: (r.priority * sign, entry[r.rid]))
    tree = g.tree
    if tree is not None and s.waiting:
        calls = g.refreshes
        g.refreshes = calls + 1
        if calls % REFRESH_INTERVAL == 0:
            for r in reversed(s.waiting[:PREFIX_MATCH_MAX]):
                tree.match(fill_tokens(s, r))


def _sort_cache_aware(s: SchedulerState, g: SGLangState, policy: SGLangQueue) -> None:
    """_compute_prefix_matches, then lpm's or dfs-weight's order. Each waiting request is matched against the tree
    (all its tokens); one whose match is at most 32 tokens is also matched against the requests before it in this
    pass that were not deprioritized: sharing 32 tokens or more with one deprioritizes it (lpm sorts it last)."""
    tree = g.tree
    seen: list[tuple] = []
    deprioritized: set[int] = set()
    matched: dict[int, int] = {}
    ends: list[Node] = []
    for r in s.waiting:
        tokens = fill_tokens(s, r)
        prefix, node = tree.match(tokens)
        g.prefix[r.rid] = prefix
        matched[r.rid] = min(prefix, len(tokens) - 1)  # num_matched_prefix_tokens
        ends.append(node)
        if prefix <= IN_BATCH_CHECK:
            if max([_common_prefix(tokens, t) for t in seen], default=0) >= IN_BATCH_DEPRIORITIZE:
                deprioritized.add(r.rid)
            else:
                seen.append(tokens)
    if policy is SGLangQueue.LPM:
        s.waiting.sort(key=lambda r: float("inf") if r.rid in deprioritized else -matched[r.rid])
    else:
        order = tree.dfs_weight_order(ends)
        s.waiting = [s.waiting[i] for i in order]


def _common_prefix(a: tuple, b: tuple) -> int:
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo


def _preempt_to_schedule(s: SchedulerState, g: SGLangState, adder: Adder, batch: list[Request], r: Request,
                         out: DecisionBuilder) -> bool:
    """PrefillAdder.preempt_to_schedule: free lower-priority running requests (lowest priority, then the latest
    entry, first) whose reservations cover r, if each is outranked by more than the threshold."""
    p = s.policy
    sign = 1 if p.queue.priority_polarity is Polarity.LOWER_FIRST else -1
    entry = g.entry
    candidates = sorted((x for x in batch if x not in adder.preempted),
                        key=lambda x: (x.priority * -sign, -entry[x.rid]))
    needed = g.fill.get(r.rid, 0) - g.prefix.get(r.rid, 0) + min(r.max_output, adder.clip) - adder.remaining_total()
    chosen = []
    for x in candidates:
        if (r.priority - x.priority) * -sign > p.preemption.priority_inversion_threshold:
            chosen.append(x)
            needed -= adder.reservation(x)
            if needed <= 0:
                break
        else:
            break
    if not chosen or needed > 0:
        return False
    victims = [x for x in batch if x in chosen]
    for i, x in enumerate(victims):
        adder.total_offset -= adder.reservation(x)
        _release(s, x, out, len(batch) - i - 1)
    batch[:] = [x for x in batch if x not in chosen]
    adder.preempted.extend(victims)
    return True


def _release(s: SchedulerState, r: Request, out: DecisionBuilder, remaining: int) -> None:
    """release_req: the KV goes back (not cached; with the radix cache its node unlocked, then the tree evicted down to
    remaining x retract_decode_steps free tokens), the request keeps its output and recomputes it later."""
    s.running.remove(r)
    kv.free(s, r)
    g = s.sglang
    if g.tree is not None:
        unlock(s, r)
        g.prefix[r.rid] = 0
        evict_for(s, remaining * s.policy.sglang.retract_decode_steps)
    r.num_computed = 0
    r.status = WAITING
    r.num_preemptions += 1
    out.preempted.append(r.rid)


# ----------------------------------------------------------------------------------------- decode
def decode_fits(s: SchedulerState, batch: list[Request]) -> bool:
    """check_decode_mem: a page for each request whose KV ends on a page boundary (with the radix cache, the shortfall
    is evicted from the tree first)."""
    if s.sglang.tree is None:
        return kv.free_blocks(s) >= pages_to_decode(s, batch)
    need = pages_to_decode(s, batch)
    evict_for(s, need * s.policy.kv.block_size)
    return available_pages(s) >= need


def pages_to_decode(s: SchedulerState, batch: list[Request]) -> int:
    page = s.policy.kv.block_size
    return sum([1 for r in batch if r.num_computed % page == 0])


def _decode(s: SchedulerState, g: SGLangState, batch: list[Request], out: DecisionBuilder) -> None:
    """update_running_batch."""
    rules = s.policy.sglang
    initial = len(batch)
    if not decode_fits(s, batch):
        batch = _retract(s, g, batch, out)
        g.ratio = min(1.0, (sum(r.num_generated for r in batch) + rules.retract_decode_steps * len(batch))
                      / (sum(r.max_output for r in batch) + 1))
    else:
        g.ratio = max(g.ratio - rules.ratio_decay, rules.min_ratio)
    if len(batch) < initial:
        g.batch_is_full = False
    # prepare_for_decode: one token each, a new page where the KV ends on a page boundary (kv.allocate(s, r, 1),
    # inline: a running request holds exactly the pages of its computed tokens)
    page = s.policy.kv.block_size
    if g.tree is not None:
        evict_for(s, len(batch) * page)  # alloc_paged_token_slots_decode: a page per request, assumed
    scheduled, grown = out.scheduled, out.grown
    taken = 0
    for r in batch:
        rid = r.rid
        if r.num_computed % page == 0:
            r.blocks += 1
            grown[rid] = 1
            taken += 1
        scheduled[rid] = 1
    s.kv_used += taken


def _retract(s: SchedulerState, g: SGLangState, batch: list[Request], out: DecisionBuilder) -> list[Request]:
    """retract_decode: victims popped from the end of the keep order until the rest fits; at least one, never the
    last (which is aborted if even it alone does not fit). Returns the batch left, in the keep order."""
    order = sorted(batch, key=retraction_key(s), reverse=True)
    retracted = []
    first = True
    while first or not decode_fits(s, order):
        if len(order) == 1:
            break
        first = False
        victim = order.pop()
        _release(s, victim, out, len(order))
        retracted.append(victim)
    if len(order) <= 1 and not decode_fits(s, order):
        last = order.pop()
        s.running.remove(last)
        kv.free(s, last)
        if g.tree is not None:
            unlock(s, last)
        last.status, last.reason = CANCELLED, Reason.OUT_OF_MEMORY
        out.cancelled.append(last.rid)
        out.released.append(last.rid)
    kept = {r.rid for r in order}
    s.running = order + [r for r in s.running if r.rid not in kept]  # filter_batch(keep_indices): keep order
    for r in retracted:
        enter_queue(s, r)
    return order


def retraction_key(s: SchedulerState) -> Callable[[Request], tuple]:
    """_get_decode_retraction_order's key (the largest is kept longest)."""
    p = s.policy
    if p.preemption.victim is Victim.LOWEST_PRIORITY:
        sign = 1 if p.queue.priority_polarity is Polarity.LOWER_FIRST else -1
        return lambda r: (r.priority * -sign, r.num_generated, -r.prompt_len)
    return lambda r: (r.num_generated, -r.prompt_len)


# ----------------------------------------------------------------------------------------- events and results
# SGLang's max_req_input_len is max_req_len less this margin (tp_worker.py).
INPUT_MARGIN = 5


def max_request_len(policy: Policy) -> int:
    """SGLang's max_req_len: the context or the pool in tokens, less one (tp_worker.get_worker_info)."""
    return min(policy.max_model_len - 1, policy.kv.num_blocks * policy.kv.block_size - 1)


def longest_prompt(policy: Policy) -> int:
    """The longest prompt arrival admits: max_req_input_len - 1."""
    return max_request_len(policy) - INPUT_MARGIN - 1


def arrival(s: SchedulerState, r: Request) -> Reason:
    """handle_generate_request's checks: a prompt of max_req_input_len tokens or more is aborted (max_req_len is the
    context or the pool, less one); max_new_tokens is capped at what is left of max_req_len, and at what an empty
    pool holds beside the page-ceiled prompt and one page (init_req_max_new_tokens, max_new_tokens_for_memory: the
    request then stops there, and always fits an empty pool)."""
    p = s.policy
    page = p.kv.block_size
    capacity = p.kv.num_blocks * page
    max_req_len = max_request_len(p)
    if r.prompt_len >= max_req_len - INPUT_MARGIN:
        return Reason.PROMPT_TOO_LONG
    cap = max(0, min(max_req_len - r.prompt_len - 1, capacity - -(-r.prompt_len // page) * page - page - 1))
    if r.max_output > cap:
        r.max_output = cap
        r.output_len = min(r.output_len, cap)
    return Reason.NONE


def abort_running(s: SchedulerState, r: Request, out: DecisionBuilder) -> bool:
    """abort_request on a running request: the chunked one is torn down now (process_pending_chunked_abort, True:
    it leaves as any cancelled request); any other is marked and ends when its next row is computed (False)."""
    g = s.sglang
    if r.rid == g.chunked:
        g.chunked = None
        if g.tree is not None:
            unlock(s, r)  # released without caching (its last chunk was not stashed yet)
        return True
    g.aborting.add(r.rid)
    out.cancelled.append(r.rid)
    return False


def end_aborted(s: SchedulerState, out: DecisionBuilder) -> None:
    """After the rows are computed: a marked request that produced a token ends aborted (update_finish_state reads
    to_finish first), its KV freed."""
    g = s.sglang
    if g.tree is not None:
        cache_results(s, out)
    if not g.aborting:
        return
    for rid in out.produced:
        if rid not in g.aborting:
            continue
        g.aborting.discard(rid)
        r = s.requests[rid]
        if r.status is Status.FINISHED:
            out.finished.remove(rid)
        else:
            kv.free(s, r)
        r.status, r.reason = CANCELLED, Reason.ABORTED
        out.released.append(rid)
    s.running = [r for r in s.running if r.status is RUNNING]


def after_step(s: SchedulerState, out: DecisionBuilder) -> None:
    """What the next iteration's filters see: a request of this batch that ended, or the chunked request in it; or a
    mixed batch that becomes the running batch (a new batch object, its batch_is_full false)."""
    g = s.sglang
    g.shrunk = g.remade or bool(out.finished) or any(rid in out.scheduled for rid in out.released) or (
        g.chunked is not None and g.chunked in out.scheduled)
    g.remade = False


# ----------------------------------------------------------------------------------------- the radix cache
def prompt_tokens(s: SchedulerState, r: Request) -> tuple:
    """The prompt's token ids, from the request's prompt identity (checker.requests: the ids the harness gives it);
    a request with its own tokens gets ids no other request has. The read is marked on the request (r.chain, which
    only the block pool reads otherwise: under SGLang's rules there is none), as the block pool marks it, so that the
    explicit-state search tries each prompt identity of a request whose tokens a step read."""
    if not r.chain:
        r.chain = TOKENS_READ
    spec = r.spec
    key = (r.rid, spec.prompt_len, spec.content)
    g = s.sglang
    tokens = g.tokens.get(key)
    if tokens is None:
        n = spec.prompt_len
        ids: list[int] = []
        for first, length in spec.content or ():
            ids.extend(range(first, first + length))
        if len(ids) < n:
            own = -(r.rid + 1) * TOKEN_ID_SPAN
            ids.extend(range(own + len(ids), own + n))
        tokens = g.tokens[key] = tuple(ids[:n])
    return tokens


TOKENS_READ = [-1]  # r.chain of a request whose tokens the radix cache read (never mutated)


def fill_tokens(s: SchedulerState, r: Request) -> tuple:
    """origin_input_ids + output_ids (every output token is the harness's one sampled id)."""
    return prompt_tokens(s, r)[:r.prompt_len] + (GREEDY_OUTPUT_TOKEN,) * r.num_generated


# With the radix cache s.kv_used counts the pages the requests hold beyond the tree's and the tree's protected pages:
# the evictable pages count free (as vLLM's cached free blocks do), and SGLang's available_size is the free pages less
# them. So locking, unlocking and inserting move s.kv_used by the change in protected pages; evicting does not.
def available_pages(s: SchedulerState) -> int:
    """The allocator's free pages (available_size / page): free blocks less the tree's evictable pages."""
    return kv.free_blocks(s) - s.sglang.tree.evictable // s.policy.kv.block_size


def evict_for(s: SchedulerState, tokens: int) -> None:
    """evict_from_tree_cache: evict the tree until `tokens` are available (or nothing evictable is left)."""
    short = tokens - available_pages(s) * s.policy.kv.block_size
    if short > 0:
        s.sglang.tree.evict(short)


def lock(s: SchedulerState, node: Node) -> None:
    tree = s.sglang.tree
    before = tree.protected
    tree.lock(node)
    s.kv_used += (tree.protected - before) // s.policy.kv.block_size


def unlock_node(s: SchedulerState, node: Node) -> None:
    tree = s.sglang.tree
    before = tree.protected
    tree.unlock(node)
    s.kv_used += (tree.protected - before) // s.policy.kv.block_size


def grow(s: SchedulerState, r: Request, n: int) -> int:
    """Pages for n more tokens of a request whose first pages may be the tree's: ceil((c + n) / P) - ceil(c / P)."""
    page = s.policy.kv.block_size
    c = r.num_computed
    added = -(-(c + n) // page) - -(-c // page)
    r.blocks += added
    s.kv_used += added
    return added


def unlock(s: SchedulerState, r: Request) -> None:
    g = s.sglang
    node = g.node.pop(r.rid, None)
    if node is not None:
        unlock_node(s, node)
    g.protected.pop(r.rid, None)


def checkpoint(s: SchedulerState, r: Request, released: bool) -> None:
    """checkpoint_into_tree of the request's computed tokens: their whole pages are inserted (those the tree already
    holds beyond the request's protected prefix are freed as duplicates, the others become the tree's), the leaf is
    split at the prompt's last whole page, and the request's lock moves to the node the insert ended on. released: it
    ended (finished or aborted) and gives its KV back: nothing stays locked."""
    g = s.sglang
    tree = g.tree
    page = s.policy.kv.block_size
    up_to = r.num_computed
    if up_to <= 0:
        if released:
            unlock(s, r)
        return
    protected = g.protected.get(r.rid, 0)
    tokens = fill_tokens(s, r)
    node = tree.insert(tokens, up_to, protected)[0]  # the new leaf is evictable: its pages count free
    aligned = up_to // page * page
    prompt = r.prompt_len // page * page
    if 0 < prompt < aligned:
        tree.insert(tokens, prompt, prompt)
    if r.status is not FINISHED:  # (step._finish freed all a finished one held)
        moved = (aligned - protected) // page  # the tree's now, or freed as duplicates
        r.blocks -= moved
        s.kv_used -= moved
    unlock(s, r)
    if not released:
        lock(s, node)
        g.node[r.rid] = node
        g.protected[r.rid] = aligned


def cache_results(s: SchedulerState, out: DecisionBuilder) -> None:
    """The radix cache's part of processing a batch's result, row by row in batch order: a request that finished, or
    whose abort takes effect, is released with its tokens cached; one that completed a prefill (not a decode row of a
    mixed batch) is checkpointed. A middle chunk is stashed at the next step's start instead."""
    g = s.sglang
    extend = g.extend_rows
    g.extend_rows = ()
    if not extend and not out.finished and not g.aborting:  # a decode step where nothing ended
        return
    produced = set(out.produced)
    by_rid = s.requests
    for rid in out.scheduled:
        if rid not in produced:
            continue
        r = by_rid[rid]
        if r.status is FINISHED or rid in g.aborting:
            checkpoint(s, r, True)
        elif rid in extend:
            checkpoint(s, r, False)
