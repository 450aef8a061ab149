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

With prefix caching (``kv.prefix_caching.enabled``) a request class also has a prompt identity
(checker.requests.IDENTITIES), cancelled requests holding KV are listed in release order (the order the
step frees them in, which decides the LRU order) instead of sorted, and the key ends with the block pool's
content (docs/liveness.md, "Prefix caching"):

- each live request's number of cached blocks and block table, then each holding request's block table,
  then the free uncached blocks (a count) and the cached free blocks in LRU order, with the blocks
  relabelled 0, 1, ... in that order of first appearance (block ids are anonymous);
- per block label: its chain (0: no hash) and its rank among the cached blocks of that chain (a hit takes
  the first). Chains are named by what the step can still compare them with: a chain of the instance's
  prompt identities by its index in a table built from the request classes (``chain_ids``: interned by
  parent and block tokens, in class order, so every process names it alike); a chain of a live request's
  own tokens by (its live position, the block index); a chain no request can produce again (the own tokens
  of a request that is gone, or a chain of no registered class) is an orphan, all orphans one name: no hit
  ever looks them up.

The representative a key decodes to gets a pool whose chains are interned in the Canon's own table
(``chains``), shared by every representative: the step's hits compare chains as ints, so one table for all.

Under SGLang's rules (``scheduler: sglang``) running requests are ranked in SGLang's batch order, and the key ends with
an SGLang section (``_encode_sglang``: entry ranks, marked aborts, fill lengths with priority preemption, the chunked
request, the flags and the new-token ratio's exact bits; docs/liveness.md, "SGLang's rules"). With the vLLM rules
the keys are as they were.

With speculative decoding the key has each live request's drafts after the tenant counters, and with async scheduling
(pipeline.in_flight 1) the batch in flight (FIELDS_PER_BATCH_ROW; docs/liveness.md, "Speculative decoding and async
scheduling"). Without them the keys are as they were.

With blocked waiting states (queue.blocked_waiting skip or stop) the key has a blocked section after the tenant counters:
per live request 1 if it is blocked in the next scan (its grammar's ready step is the environment's choice:
checker.liveness.explore, docs/liveness.md "Blocked waiting states"). Off, the keys are as they were.
"""

from __future__ import annotations

import struct
from types import SimpleNamespace

from checker.errors import InputError, InternalError, Problem
from checker.policy import Policy, QueueOrder, Requeue, Scheduler
from checker.requests import IDENTITIES, Identity, RequestSpec, identity_content
from checker.semantics.blockpool import NO_PARENT, BlockPool, Chains, block_tokens
from checker.semantics.inflight import Batch, PipeState
from checker.semantics.order import key_function
from checker.semantics.sglang import arrival as sglang_arrival
from checker.semantics.speculative import SpecState
from checker.semantics.state import NEVER, Request, SchedulerState, SGLangState, Status

WAITING, SWAPPED, RUNNING, CANCELLED = int(Status.WAITING), int(Status.SWAPPED), int(Status.RUNNING), int(Status.CANCELLED)
LOADING = int(Status.LOADING)
LIVE = frozenset({WAITING, SWAPPED, RUNNING, LOADING})
STATUS_OF = {int(s): s for s in Status}
STATUS_INT = {s: int(s) for s in Status}
RUNNING_STATUS, CANCELLED_STATUS = Status.RUNNING, Status.CANCELLED  # bound once: ~0.2 us per Enum lookup
LOADING_STATUS, FINISHED_STATUS = Status.LOADING, Status.FINISHED

# A KV connector's choices for a request (policy.connector): external_tokens, load_steps, send_steps
# (RequestSpec's fields; None: the transfer never completes).
Transfer = tuple[int, int | None, int | None]
NO_TRANSFER: Transfer = (0, 1, 0)  # RequestSpec's defaults: no external hit

# A request class: what the environment chooses when a request arrives (the identity: None without the cache; the
# transfer, optional: NO_TRANSFER when left out).
RequestClass = tuple  # prompt, output, max_output, priority, tenant, identity[, transfer]


def transfer_of(cls: RequestClass) -> Transfer:
    return cls[6] if len(cls) > 6 else NO_TRANSFER


# With blocked waiting states (policy.queue.blocked_waiting) a class may end with a grammar mark (GRAMMAR, after its
# transfer): its requests arrive blocked (checker.semantics.blocked), and stay blocked until the environment chooses
# that their grammar is ready (checker.liveness.explore: the readiness choice). Only the arrival reads it: a live
# request's class in a key is the class without the mark, and the key's blocked section says whether it is blocked.
GRAMMAR = 1


def grammar_of(cls: RequestClass) -> int:
    return cls[7] if len(cls) > 7 else 0

# Fields per live request in a key: class id, status, computed, generated, blocks, swapped blocks,
# admission rank, requeue rank.
FIELDS_PER_REQUEST = 8
STATUS_AT, BLOCKS_AT, ADMITTED_AT = 1, 4, 6  # offsets of the status, blocks and admission rank among a live request's fields


def live_field(key: tuple, i: int, offset: int) -> int:
    """A field of the i-th live request (arrival order) of a key."""
    return key[1 + i * FIELDS_PER_REQUEST + offset]


def holding_count(key: tuple, timed: bool) -> int:
    """How many requests of a key hold KV after they left (cancelled, or pinned by a connector); ``timed``: the
    key has ages (Canon.timed)."""
    m = key[0]
    return key[1 + m * FIELDS_PER_REQUEST + (m if timed and m else 0)]
# With async scheduling (policy.pipeline) the key has an async section after the tenant counters (and the drafts per
# live request before it, with speculative decoding): the number of batches in flight, per batch a row per live request
# (its place in the batch's order, 0: not in it; tokens scheduled; output placeholders pending; finishing in it; drafts
# verified and accepted; stale), then per live request whether it is finishing (PipeState.finishing).
FIELDS_PER_BATCH_ROW = 7
FIELDS_PER_HOLDING = 2  # blocks, steps until release (with a KV connector: NEVER_CODE for a release that never comes)

# With a KV connector the key has a connector section (after the tenant counters, before the pool): per live request
# its transfer code and its place in the holders' queue (0: not in it), then per holding request its transfer code.
# A live request's transfer code: T_NONE (no transfer started: transfer_step -1), T_NEVER (a load never reported),
# or T_AT + max(transfer_step - next step, -1) (-1: reported before the next step, or a transfer of the past; the
# step reads nothing more of it). A holding request's: T_NONE, T_NEVER or T_AT + max(transfer_step - next step, 0)
# (report_phase frees it at the end of the first step whose index is >= transfer_step).
T_NONE, T_NEVER, T_AT = 0, 1, 3
NEVER_CODE = -1  # a holding request's release_step NEVER (release on_completion of a connector)
PAST_TRANSFER = -2  # the transfer_step a decoded representative's past transfer gets (< 0, and not -1: "none")

# With SGLang's rules (policy.scheduler sglang) the key ends with an SGLang section (SGLangState): per live request its
# entry rank (the order of the waiting queue's entry stamps, 1.. among the requests whose stamp a rule can still read,
# 0 for the others), 1 if it is an aborted running request that ends at its next row (SGLangState.aborting), and,
# with priority preemption, its fill length (0: none); then the chunked request (live position + 1, 0: none), the
# flags (SG_FULL, SG_SHRUNK, SG_RAN, SG_REMADE bits) and the new-token ratio as its IEEE-754 bits (an int that
# decodes to the identical float). A running request's admission rank is its place in SGLang's batch order
# (s.running, the chunked request last) instead.
SG_FULL, SG_SHRUNK, SG_RAN, SG_REMADE = 1, 2, 4, 8


def float_bits(x: float) -> int:
    return struct.unpack("<q", struct.pack("<d", x))[0]


def bits_float(b: int) -> float:
    return struct.unpack("<d", struct.pack("<q", b))[0]


# Chain names in a key with the cache (per block label, with its rank): NO_HASH, ORPHAN, RUN + the chain's index in
# Canon.chain_ids, or -(1 + live position + block index * OWN_STRIDE) for a live request's own tokens.
NO_HASH, ORPHAN, RUN = 0, 1, 2
OWN_STRIDE = 1 << 16
ORPHAN_TOKENS = ("orphan",)  # the block tokens of the decoded orphan chain: no request's tokens look like this

class ObservedPool(BlockPool):
    """The pool of a decoded representative (and of its copies): the same pool, counting the admission lookups
    that find a cached prefix (``found``, per process), which the explorer reports: a caching instance in which no
    lookup ever finds one never exercises the cache."""

    __slots__ = ()
    found = 0

    def hit(self, r: Request) -> list[int]:
        blocks = BlockPool.hit(self, r)
        if blocks:
            ObservedPool.found += 1
        return blocks

    def copy(self) -> BlockPool:
        c = BlockPool.copy(self)
        c.__class__ = ObservedPool
        return c


def identity_token(ident: Identity) -> str:
    """A prompt identity as the liveness options write it: own, g0, g1, g0+1 (group 0 from its second block)."""
    if ident is None:
        return "own"
    group, offset = ident
    return f"g{group}" + (f"+{offset}" if offset else "")


IDENTITY_TOKENS: dict[str, Identity] = {identity_token(i): i for i in IDENTITIES}


def identities_need_the_cache(identities) -> InputError:
    return InputError(Problem("--identities", ",".join(dict.fromkeys(map(identity_token, identities))),
                              "only with kv.prefix_caching.enabled: true (without the cache a prompt's tokens are "
                              "never read)"))


class Canon:
    """Encodes states of one policy under one clock into keys, and keys back into representatives."""

    def __init__(self, policy: Policy, step_us: int, priorities: tuple[int, ...] = (0,), tenants: int = 1,
                 classes: list[RequestClass] | tuple[RequestClass, ...] = (), block_identity: bool = True):
        """``classes``: the instance's request classes, registered first (their ids are 0, 1, ...).
        ``block_identity=False`` (replayed frames, which carry no block tables): a caching policy's keys
        without the pool's content and without prompt identities."""
        caching = policy.kv.prefix_caching.enabled
        if not caching and any(c[5] is not None for c in classes):
            raise identities_need_the_cache([c[5] for c in classes if c[5] is not None])
        self.cache = caching and block_identity  # the key holds the block pool's content
        con = policy.connector
        # the key has the connector section (block_identity=False, replayed frames: they carry no transfer steps, so
        # only pinned requests and releases that never come, which the frames show, are in the key)
        self.connector = con.enabled and block_identity
        self.holds = con.enabled  # FINISHED requests may hold KV (pinned), and a release may never come
        self.loads, self.pins = con.loads, con.pins  # what of a request's transfer the step reads
        self.holders_queue = con.loads and con.holders_first
        # SGLang's rules: the key has the SGLang section (block_identity=False, replayed frames: they carry no SGLang
        # state, so the key without it, running requests ranked by admission)
        self.sglang_rules = policy.scheduler is Scheduler.SGLANG
        self.sglang = self.sglang_rules and block_identity
        # speculative decoding and async scheduling: the key has their sections (block_identity=False, replayed frames:
        # they carry neither drafts nor batches in flight, so the key without them)
        self.speculative = policy.speculative.enabled and block_identity
        self.pipelined = policy.pipeline.enabled and block_identity
        self.in_flight_sections = self.speculative or self.pipelined  # read once per encode
        # blocked waiting states: the key has a blocked section after the tenant counters (per live request 1 if it
        # is blocked in the next scan); replayed frames carry no grammar state, so the key without it
        self.blocking = policy.queue.blocked_waiting != "off" and block_identity
        self.preempting = self.sglang_rules and policy.preempts_on_inversion  # fill lengths and running entries read
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
        # Under aging, the holders' queue of a loading connector is kept by the queue's key at time 0
        # (checker.semantics.transfer.start_load), which reads the absolute clock's phase in the aging period: the
        # key then ends with it (the iteration's index modulo the period).
        self.phase = self.period if aging and con.loads and con.holders_first and block_identity else 0
        self.age_cap = max(caps)
        # a request's class by its fields (prompt, output, max_output, priority, tenant; with the cache also its
        # prompt content) -> class id
        self.class_ids: dict[tuple, int] = {}
        self.classes: list[RequestClass] = []
        if self.cache:
            kv = policy.kv
            self.block_size, self.chained = kv.block_size, kv.prefix_caching.chained_hashes
            self.chain_ids: dict[tuple[int, tuple], int] = {}  # (parent chain or NO_PARENT, block tokens) -> chain
            self.chain_defs: list[tuple[int, tuple]] = []  # chain -> (parent, block tokens)
            self.chains = Chains()  # the engine's interning table of every decoded representative's pool
            self.true_chains: dict = {}  # the same for unchained pools' true chains (BlockPool.true_chains)
            self._names: list = []  # engine chain in self.chains -> its name (see _names_of)
            self._other_names: dict[int, tuple[Chains, list]] = {}  # the same for other tables (engine replays)
            self._engine: dict[int, int] = {}  # chain name -> engine chain in self.chains
        for cls in classes:
            self.class_id(cls)
        if self.connector:  # and each class as it reads once its load has started: the same ids in every process
            for cls in classes:
                self.class_id(cls[:6] + (self.read_transfer(*transfer_of(cls), 0),))
        if self.sglang_rules:  # and each class as SGLang's arrival caps its max output: the same ids in every process
            for cls in classes:
                self.class_id(self.sglang_capped(cls))

    def sglang_capped(self, cls: RequestClass) -> RequestClass:
        """A class as a request of it is after SGLang's arrival checks (checker.semantics.sglang.arrival caps
        max_output and output_len)."""
        r = Request(RequestSpec(0, 0, cls[0], cls[1], cls[2], cls[3], cls[4]))
        sglang_arrival(SimpleNamespace(policy=self.policy), r)  # it reads only the policy
        return (cls[0], r.output_len, r.max_output) + tuple(cls[3:])

    def class_id(self, cls: RequestClass) -> int:
        lookup = self._lookup(cls)
        cid = self.class_ids.get(lookup)
        if cid is None:
            cid = self.class_ids[lookup] = len(self.classes)
            self.classes.append(cls)
            if self.cache and cls[5] is not None:
                self._add_chains(cls)
        return cid

    def _lookup(self, cls: RequestClass) -> tuple:
        """What encode looks a request's class up by: its fields, with the cache its prompt content, with a KV
        connector its transfer (as the step can still read it: ``read_transfer``)."""
        out = cls[:5]
        if self.cache:
            out += (identity_content(cls[5], cls[0], self.block_size),)
        if self.connector:
            ext, load, send = transfer_of(cls)
            out += (self.read_transfer(ext, load, send, -1),)
        if grammar_of(cls):  # a class whose arrivals are blocked: an id of its own (encode never looks it up)
            out += ("grammar",)
        return out

    def read_transfer(self, ext: int, load: int | None, send: int | None, transfer_step: int) -> Transfer:
        """What the step can still read of a request's transfer fields: external_tokens and load_steps until its
        load starts (transfer.external_tokens asks only then; load_steps only with an external hit), send_steps on
        a node that pins finished requests; the rest reads as NO_TRANSFER's."""
        if not self.loads or transfer_step != -1 or not ext:
            ext, load = 0, 1
        return ext, load, send if self.pins else 0

    def spec(self, rid: int, arrival_us: int, cid: int, tag: int = 0) -> RequestSpec:
        """A request of class ``cid`` (``tag``: RequestSpec.cls)."""
        cls = self.classes[cid]
        prompt, output, max_output, priority, tenant, ident = cls[:6]
        content = identity_content(ident, prompt, self.block_size) if self.cache else None
        ext, load, send = transfer_of(cls)
        return RequestSpec(rid, arrival_us, prompt, output, max_output, priority, tenant, tag, content=content,
                           external_tokens=ext, load_steps=load, send_steps=send,
                           grammar_steps=NEVER if grammar_of(cls) else 0)

    def _class_of(self, r: Request) -> RequestClass:
        """The class of a request that is none of the registered ones (with a KV connector: its transfer as the
        step can still read it)."""
        ident = None
        content = r.spec.content if self.cache else None
        if content is not None:
            ident = next((i for i in IDENTITIES if i is not None
                          and identity_content(i, r.prompt_len, self.block_size) == content), False)
            if ident is False:
                raise InternalError(f"liveness: request {r.rid}'s prompt content {content} is none of the prompt "
                                    "identities the canonical key names")
        if not self.connector:
            return (r.prompt_len, r.output_len, r.max_output, r.priority, r.tenant, ident)
        sp = r.spec
        transfer = self.read_transfer(sp.external_tokens, sp.load_steps, sp.send_steps, r.transfer_step)
        return (r.prompt_len, r.output_len, r.max_output, r.priority, r.tenant, ident, transfer)

    # ------------------------------------------------------------------------------------- chains
    def _add_chains(self, cls: RequestClass) -> None:
        """Intern the chains of every block a request of this class can cache (its prompt, then output tokens,
        up to its longest context), by parent and block tokens: the same names in every process."""
        prompt, output, max_output, _, _, ident = cls[:6]
        content = identity_content(ident, prompt, self.block_size)
        top = min(prompt + max(output, max_output), self.policy.max_model_len)
        parent = NO_PARENT
        ids, defs = self.chain_ids, self.chain_defs
        known = len(defs)
        for k in range(top // self.block_size + 1):
            entry = (parent if self.chained else NO_PARENT, block_tokens(content, prompt, k, self.block_size))
            chain = ids.get(entry)
            if chain is None:
                chain = ids[entry] = len(defs)
                defs.append(entry)
            parent = chain
        if len(defs) > known:  # chains named ORPHAN so far may be this class's: name them again
            self._names.clear()
            self._other_names.clear()

    def _names_of(self, chains: Chains) -> list:
        """Engine chain -> name, for the chains of an interning table: RUN + chain, ORPHAN, or ("own", rid, k)
        (a request's own tokens: the key names it by the request's live position, or ORPHAN)."""
        if chains is self.chains:
            names = self._names
        else:
            entry = self._other_names.get(id(chains))
            if entry is None or entry[0] is not chains:
                entry = self._other_names[id(chains)] = (chains, [])
            names = entry[1]
        if len(names) < len(chains):
            table = {v: k for k, v in chains.items()}
            for e in range(len(names), len(chains)):
                parent, tokens = table[e]
                if tokens == ORPHAN_TOKENS:
                    names.append(ORPHAN)
                elif tokens[0] == "own":
                    names.append(tokens)
                else:  # a chain no registered class (no live request, no arrival to come) has is an orphan
                    up = NO_PARENT if parent == NO_PARENT else names[parent]
                    chain = self.chain_ids.get((up - RUN if up != NO_PARENT else NO_PARENT, tokens)) \
                        if type(up) is int and (up == NO_PARENT or up >= RUN) else None
                    names.append(ORPHAN if chain is None else RUN + chain)
        return names

    def _engine_chain(self, name: int) -> int:
        """The chain of ``self.chains`` a key's chain name stands for in a representative (own tokens: of the
        request numbered by its live position, as decode numbers them)."""
        e = self._engine.get(name)
        if e is not None:
            return e
        chains = self.chains
        if name == ORPHAN:
            entry = (NO_PARENT, ORPHAN_TOKENS)
        elif name >= RUN:
            parent, tokens = self.chain_defs[name - RUN]
            entry = (NO_PARENT if parent == NO_PARENT else self._engine_chain(RUN + parent), tokens)
        else:
            pos, k = (-name - 1) % OWN_STRIDE, (-name - 1) // OWN_STRIDE
            parent = self._engine_chain(name + OWN_STRIDE) if self.chained and k else NO_PARENT
            entry = (parent, ("own", pos, k))
        e = self._engine[name] = chains.setdefault(entry, len(chains))
        return e

    def _cap(self, age: int) -> int:
        cap = self.age_cap
        if age < cap:
            return age
        return cap + (age - cap) % self.period if self.period else cap

    # ------------------------------------------------------------------------------------- encode
    def encode_requests(self, requests: list[Request], next_now_us: int, next_step: int,
                        counters: list[int] | tuple[int, ...] = (), pool: BlockPool | None = None,
                        holding: list[Request] | None = None, holders: list[Request] | None = None,
                        sglang: SGLangState | None = None, running: list[Request] | None = None,
                        spec: SpecState | None = None, pipe: PipeState | None = None,
                        blocked: dict[int, int] | None = None) -> tuple:
        """The key of a state given its requests in arrival order (ties: by number). ``next_now_us`` is
        when the next iteration starts; ``next_step`` its index (for release lags and transfers); ``pool``: its
        block pool (with the cache); ``holding`` and ``holders``: the state's lists of those names (with a KV
        connector: the holders' queue order, and with the cache the order in which held blocks are freed);
        ``sglang`` and ``running``: under SGLang's rules its SGLangState and running list (SGLang's batch order);
        ``spec`` and ``pipe``: with speculative decoding its drafts, with async scheduling its batches in flight;
        ``blocked``: with blocked waiting states its map of blocked requests (SchedulerState.blocked)."""
        live = []
        holding_entries = None  # (blocks, steps until release[, transfer code]) of the requests holding KV after they left
        held = [] if self.cache else None  # with the cache: those requests
        connector = self.connector
        for r in requests:
            status = r.status
            if status in LIVE:
                live.append(r)
            elif r.blocks and (status is CANCELLED_STATUS or (self.holds and status is FINISHED_STATUS)):
                if holding_entries is None:
                    holding_entries = []
                holding_entries.append(self._holding_entry(r, next_step))
                if held is not None:
                    held.append(r)
        out = [len(live)]
        sg = self.sglang
        if sg and (sglang is None or running is None):
            raise InternalError("liveness: a state under SGLang's rules without its SGLang state")
        if live:
            if sg:  # SGLang's batch order (the chunked request last), as ranks: keyed by admitted_seq like the other
                ranked = [r.admitted_seq for r in running]
            else:
                ranked = [r.admitted_seq for r in live if r.status is RUNNING_STATUS]
                if len(ranked) > 1:
                    ranked.sort()
            admitted_rank = {seq: i for i, seq in enumerate(ranked, 1)}
            requeue_rank = None
            if self.front:
                requeued = [r.requeue_seq for r in live if r.requeue_seq]
                if requeued:
                    requeued.sort()
                    requeue_rank = {seq: i for i, seq in enumerate(requeued, 1)}
            class_ids = self.class_ids
            cache = self.cache
            for r in live:
                cls = (r.prompt_len, r.output_len, r.max_output, r.priority, r.tenant, r.spec.content) if cache else \
                    (r.prompt_len, r.output_len, r.max_output, r.priority, r.tenant)
                if connector:
                    sp = r.spec
                    cls += (self.read_transfer(sp.external_tokens, sp.load_steps, sp.send_steps, r.transfer_step),)
                cid = class_ids.get(cls)
                if cid is None:
                    cid = self.class_id(self._class_of(r))
                status = r.status
                out += (cid, STATUS_INT[status], r.num_computed, r.num_generated, r.blocks, r.swapped_blocks,
                        admitted_rank[r.admitted_seq] if status is RUNNING_STATUS else (1 if r.admitted_seq else 0),
                        requeue_rank[r.requeue_seq] if requeue_rank is not None and r.requeue_seq else 0)
            if self.timed:
                step_us = self.step_us
                ages = [(next_now_us - r.arrival_us) // step_us for r in live]
                out.append(self._cap(ages[-1]))
                out += (self._cap(ages[i] - ages[i + 1]) for i in range(len(ages) - 1))
        if holding_entries is None:
            out.append(0)
        else:
            out.append(len(holding_entries))
            if held is None:
                holding_entries.sort()
            else:  # in release order, as the step frees them (stable: the same release step, in cancel order)
                if connector and holding is not None:  # in the state's order: releases and reports free in it
                    members = set(map(id, held))
                    held = [r for r in holding if id(r) in members]
                else:
                    held.sort(key=lambda r: r.release_step)
                holding_entries = [self._holding_entry(r, next_step) for r in held]
            for entry in holding_entries:
                out += entry[:FIELDS_PER_HOLDING]
        if self.fair:
            low = min(counters)
            out += (c - low for c in counters)
        if self.blocking:  # blocked in the scan of step next_step (its grammar ready in a later one)
            out += (1 if blocked.get(r.rid, -1) > next_step else 0 for r in live)
        if self.in_flight_sections:
            if (spec is None) is self.speculative or (pipe is None) is self.pipelined:
                raise InternalError("liveness: a speculative or async state without its drafts or batches in flight")
            position = {r.rid: i for i, r in enumerate(live)}
            if spec is not None:
                drafts = spec.drafts
                out += (drafts.get(r.rid, 0) for r in live)
            if pipe is not None:
                self._encode_pipe(out, pipe, live, position)
        if connector:
            self._encode_connector(out, live, holding_entries or (), next_step, holders)
        if self.cache:
            if pool is None:
                raise InternalError("liveness: a caching policy's state without its block pool")
            self._encode_pool(out, pool, live, held)
        if self.phase:
            out.append(next_now_us // self.step_us % self.phase)
        if sg:
            self._encode_sglang(out, live, sglang)
        return tuple(out)

    def _encode_sglang(self, out: list, live: list[Request], g: SGLangState) -> None:
        """The SGLang section (see SG_FULL): what of SGLangState a later step can read.

        Entry stamps: the waiting queue is sorted by (priority, entry) under priority scheduling, and stably by max
        output under lof, in which requests of equal key are always in entry order; under fcfs it is never sorted
        and is in entry order (enter_queue appends and stamps; removals keep the order). So the entry ranks of the
        waiting requests are all of its order that the step reads. A running request's stamp is read only by
        priority preemption (the latest entry is preempted first); it gets a new one when it is requeued. Fill
        lengths are read only by priority preemption."""
        preempting = self.preempting
        entry = g.entry
        kept = [entry[r.rid] for r in live if preempting or r.status is not RUNNING_STATUS]
        kept.sort()
        rank = {stamp: i for i, stamp in enumerate(kept, 1)}
        aborting, fill = g.aborting, g.fill
        chunked = 0
        for i, r in enumerate(live):
            rid = r.rid
            out += (rank[entry[rid]] if preempting or r.status is not RUNNING_STATUS else 0,
                    1 if rid in aborting else 0)
            if preempting:
                out.append(fill.get(rid, 0))
            if rid == g.chunked:
                chunked = i + 1
        if g.chunked is not None and not chunked:
            raise InternalError(f"liveness: SGLang's chunked request {g.chunked} is not live")
        out += (chunked, (SG_FULL if g.batch_is_full else 0) | (SG_SHRUNK if g.shrunk else 0)
                | (SG_RAN if g.ran_batch else 0) | (SG_REMADE if g.remade else 0), float_bits(g.ratio))

    def _encode_pipe(self, out: list, pipe: PipeState, live: list[Request], position: dict[int, int]) -> None:
        """The async section (see FIELDS_PER_BATCH_ROW): the batches in flight, oldest first, each as a row per live
        request, then per live request whether it is finishing in one of them. A request that is no longer live
        (finished, rejected, cancelled) is left out of a batch: resolving it reads nothing of it but its status."""
        out.append(len(pipe.batches))
        for b in pipe.batches:
            rank = {rid: i for i, rid in enumerate((rid for rid in b.scheduled if rid in position), 1)}
            scheduled, pending, finishing, verified, stale = b.scheduled, b.pending, b.finishing, b.verified, b.stale
            for r in live:
                rid = r.rid
                d, a = verified.get(rid, (0, 0))
                out += (rank.get(rid, 0), scheduled.get(rid, 0), pending.get(rid, 0), 1 if rid in finishing else 0,
                        d, a, 1 if rid in stale else 0)
        out += (1 if r.rid in pipe.finishing else 0 for r in live)

    def _decode_pipe(self, s: SchedulerState, key: tuple, pos: int, m: int) -> int:
        """The async section from ``pos`` on into a new PipeState of ``s`` (live requests numbered 0..m-1); returns
        the position after it."""
        pipe = s.pipe = PipeState(self.policy)
        for _ in range(key[pos]):
            rows = [key[pos + 1 + i * FIELDS_PER_BATCH_ROW:pos + 1 + (i + 1) * FIELDS_PER_BATCH_ROW] for i in range(m)]
            pos += m * FIELDS_PER_BATCH_ROW
            order = sorted((row[0], i) for i, row in enumerate(rows) if row[0])
            b = Batch({i: rows[i][1] for _, i in order})
            b.pending = {i: row[2] for i, row in enumerate(rows) if row[2]}
            b.finishing = [i for _, i in order if rows[i][3]]
            b.verified = {i: (row[4], row[5]) for i, row in enumerate(rows) if row[4]}
            b.stale = {i for i, row in enumerate(rows) if row[6]}
            pipe.batches.append(b)
        pos += 1
        pipe.finishing = {i for i in range(m) if key[pos + i]}
        return pos + m

    def _holding_entry(self, r: Request, next_step: int) -> tuple:
        """(blocks, steps until release[, transfer code]) of a request holding KV after it left."""
        if not self.holds:
            return r.blocks, max(r.release_step - next_step, 0)
        release = NEVER_CODE if r.release_step >= NEVER else max(r.release_step - next_step, 0)
        if not self.connector:
            return r.blocks, release
        t = r.transfer_step
        code = T_NONE if t == -1 else T_NEVER if t >= NEVER else T_AT + max(t - next_step, 0)
        return r.blocks, release, code

    def _encode_connector(self, out: list, live: list[Request], holding_entries, next_step: int,
                          holders: list[Request] | None) -> None:
        """The connector section: per live request its transfer code and holders' queue place, per holding
        request its transfer code (see FIELDS_PER_HOLDING)."""
        place = {id(r): i for i, r in enumerate(holders, 1)} if holders else {}
        for r in live:
            t = r.transfer_step
            if t == -1:
                code = T_NONE
            elif r.status is not LOADING_STATUS:
                code = T_AT - 1  # a transfer of the past: only "it had one" is read
            else:
                code = T_NEVER if t >= NEVER else T_AT + max(t - next_step, -1)
            out += (code, place.get(id(r), 0))
        out += (entry[2] for entry in holding_entries)

    def _encode_pool(self, out: list, pool: BlockPool, live: list[Request], held: list[Request]) -> None:
        """The block pool's content, blocks relabelled by first appearance (see the module docstring)."""
        labels: dict[int, int] = {}
        for r in live:
            out.append(r.num_cached_blocks)
            for b in r.block_ids:
                lab = labels.get(b)
                if lab is None:
                    lab = labels[b] = len(labels)
                out.append(lab)
        for r in held:
            for b in r.block_ids:
                lab = labels.get(b)
                if lab is None:
                    lab = labels[b] = len(labels)
                out.append(lab)
        lru = pool.lru
        out += (pool.uncached_free, len(lru))
        for b in lru:  # free: in no block table
            lab = labels[b] = len(labels)
            out.append(lab)
        names = self._names_of(pool.chains)
        hash_of, cached = pool.hash_of, pool.cached
        positions = None
        for b in labels:
            h = hash_of.get(b)
            if h is None:
                out += (NO_HASH, 0)
                continue
            name = names[h]
            if type(name) is tuple:  # ("own", rid, k)
                if positions is None:
                    positions = {r.rid: i for i, r in enumerate(live)}
                pos = positions.get(name[1])
                name = ORPHAN if pos is None else -(1 + pos + name[2] * OWN_STRIDE)
            if name == ORPHAN:
                out += (ORPHAN, 0)
                continue
            blocks = cached[h]
            out += (name, 0 if len(blocks) == 1 else list(blocks).index(b))

    def encode(self, s: SchedulerState, next_now_us: int) -> tuple:
        """The key of a SchedulerState whose requests are numbered in arrival order."""
        return self.encode_requests(s.requests, next_now_us, s.step, s.tenant_counters, s.pool, s.holding, s.holders,
                                    s.sglang, s.running, s.spec, s.pipe, s.blocked)

    def blocked_flags(self, key: tuple) -> tuple[int, ...]:
        """The blocked section of a key (blocked waiting states): per live request 1 if it is blocked in the next
        scan unless the environment chooses that its grammar is ready."""
        m = key[0]
        pos = 1 + m * FIELDS_PER_REQUEST + (m if self.timed and m else 0)
        pos += 1 + FIELDS_PER_HOLDING * key[pos] + (self.tenants if self.fair else 0)
        return key[pos:pos + m]

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
        first = ages[0] if m else 0
        now = (first + (key[-1] - first) % self.phase if self.phase else first) * step_us
        s = SchedulerState.__new__(SchedulerState)
        s.policy = self.policy
        s.step = 0
        s.sglang = None  # under SGLang's rules: below
        s.pool = None  # with the cache: below
        s.spec = None  # speculative decoding: below
        s.pipe = None  # async scheduling: below
        s.blocked = None  # blocked waiting states: below
        requests: list[Request] = []
        running: list[tuple[int, Request]] = []
        waiting: list[Request] = []
        top_seq = 0
        kv_used = swap_used = 0
        for i in range(m):
            base = 1 + i * FIELDS_PER_REQUEST
            cid, status, computed, generated, blocks, swapped, admitted, requeue = key[base:base + FIELDS_PER_REQUEST]
            r = Request(self.spec(i, now - ages[i] * step_us, cid))
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
            r.status, r.blocks, r.release_step = Status.CANCELLED, blocks, NEVER if release == NEVER_CODE else release
            kv_used += blocks
            requests.append(r)
            holding.append(r)
        pos += 1 + FIELDS_PER_HOLDING * h
        s.requests = requests
        running.sort(key=lambda pair: pair[0])
        s.running = [r for _, r in running]
        s.holding = holding
        s.holders, s.loads_in_flight = [], 0
        s.kv_used, s.swap_used = kv_used, swap_used
        s.next_seq = top_seq + 1
        s.tenant_counters = list(key[pos:pos + self.tenants]) if self.fair else [0] * self.tenants
        pos += self.tenants if self.fair else 0
        if self.blocking:  # a blocked request stays blocked until the environment chooses (explore: readiness)
            s.blocked = {i: NEVER for i in range(m) if key[pos + i]}
            pos += m
        if self.speculative:
            s.spec = SpecState(self.policy)
            s.spec.drafts = {i: d for i, d in enumerate(key[pos:pos + m]) if d}
            pos += m
        if self.pipelined:
            pos = self._decode_pipe(s, key, pos, m)
        if self.connector:
            pos = self._decode_connector(s, key, pos, requests[:m], holding, waiting)
        if self.cache:
            s.pool = self._decode_pool(key, pos, requests[:m], holding)
            s.kv_used = s.pool.num_used
        if self.sglang:  # no cache, no connector, no aging phase under SGLang's rules: the section starts at pos
            entry = self._decode_sglang(s, key, pos, requests[:m])
            waiting.sort(key=lambda r: entry[r.rid])  # the queue in entry order (_encode_sglang)
        else:
            if self.sglang_rules:  # a key without the SGLang section (replayed frames): a fresh SGLang state
                s.sglang = SGLangState(self.policy.sglang.init_ratio)
            if len(waiting) > 1:
                waiting.sort(key=key_function(s, now))
        s.waiting = waiting
        return s, now

    def _decode_sglang(self, s: SchedulerState, key: tuple, pos: int, live: list[Request]) -> dict[int, int]:
        """The SGLang section from ``pos`` on into a new SGLangState of ``s``; returns its entry stamps."""
        g = s.sglang = SGLangState(self.policy.sglang.init_ratio)  # no radix cache (refused): its fields empty
        preempting = self.preempting
        entry: dict[int, int] = {}
        aborting: set[int] = set()
        fill: dict[int, int] = {}
        width = 3 if preempting else 2
        for i in range(len(live)):
            stamp, marked = key[pos], key[pos + 1]
            if stamp:
                entry[i] = stamp
            if marked:
                aborting.add(i)
            if preempting and key[pos + 2]:
                fill[i] = key[pos + 2]
            pos += width
        chunked, flags, ratio = key[pos:pos + 3]
        g.chunked = chunked - 1 if chunked else None
        g.batch_is_full, g.shrunk = bool(flags & SG_FULL), bool(flags & SG_SHRUNK)
        g.ran_batch, g.remade = bool(flags & SG_RAN), bool(flags & SG_REMADE)
        g.ratio = bits_float(ratio)
        g.entry, g.next_entry, g.aborting, g.fill = entry, max(entry.values(), default=0), aborting, fill
        return entry

    def _decode_connector(self, s: SchedulerState, key: tuple, pos: int, live: list[Request], holding: list[Request],
                          waiting: list[Request]) -> int:
        """The connector section from ``pos`` on: transfer steps (relative to step 0), the holders' queue (its
        requests leave ``waiting``), loads in flight; returns the position after it."""
        places = []
        for r in live:
            code, place = key[pos], key[pos + 1]
            pos += 2
            r.transfer_step = -1 if code == T_NONE else NEVER if code == T_NEVER else \
                PAST_TRANSFER if code < T_AT else code - T_AT
            if place:
                places.append((place, r))
        for r in holding:
            code = key[pos]
            pos += 1
            r.transfer_step = -1 if code == T_NONE else NEVER if code == T_NEVER else code - T_AT
        if places:
            places.sort(key=lambda pair: pair[0])
            s.holders = [r for _, r in places]
            members = set(map(id, s.holders))
            waiting[:] = [r for r in waiting if id(r) not in members]
        s.loads_in_flight = sum(r.status is LOADING_STATUS for r in live)
        return pos

    def _decode_pool(self, key: tuple, pos: int, live: list[Request], holding: list[Request]) -> BlockPool:
        """The block pool of a key (from ``pos`` on), block ids = labels, chains in self.chains; fills in the
        requests' block tables."""
        kv = self.policy.kv
        p = ObservedPool.__new__(ObservedPool)
        p.block_size, p.num_blocks, p.chained = kv.block_size, kv.num_blocks, self.chained
        p.chains, p.true_chains, p.truth, p.evictions = self.chains, self.true_chains, {}, 0
        refs: dict[int, int] = {}
        for i, r in enumerate(live + holding):
            if i < len(live):
                r.num_cached_blocks = key[pos]
                pos += 1
            r.block_ids = ids = list(key[pos:pos + r.blocks])
            pos += r.blocks
            for b in ids:
                refs[b] = refs.get(b, 0) + 1
        p.uncached_free, free = key[pos], key[pos + 1]
        p.lru = dict.fromkeys(key[pos + 2:pos + 2 + free])
        pos += 2 + free
        p.refs = refs
        p.next_id = count = len(refs) + free
        hash_of: dict[int, int] = {}
        ranked: dict[int, list[tuple[int, int]]] = {}
        for b in range(count):
            name, rank = key[pos + 2 * b], key[pos + 2 * b + 1]
            if name == NO_HASH:
                continue
            h = hash_of[b] = self._engine_chain(name)
            ranked.setdefault(h, []).append((rank, b))
        p.hash_of = hash_of
        p.cached = {h: dict.fromkeys(b for _, b in sorted(blocks)) for h, blocks in ranked.items()}
        return p
