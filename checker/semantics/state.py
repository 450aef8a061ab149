"""Scheduler state: one status enum, one record per request, the queues and the KV counters."""

from __future__ import annotations

from enum import IntEnum

from checker.policy import Policy, Scheduler
from checker.requests import RequestSpec
from checker.semantics.blockpool import BlockPool
from checker.semantics.radix import Node, Tree


class Status(IntEnum):
    PENDING = 0  # not arrived yet
    WAITING = 1  # in the waiting queue, holding no KV (fresh, or preempted by recompute)
    SWAPPED = 2  # in the waiting queue, its KV in swap space (preempted by swap)
    RUNNING = 3  # admitted: in the running list, holding KV
    FINISHED = 4
    REJECTED = 5
    CANCELLED = 6  # cancelled; holds KV until its release lag has passed
    LOADING = 7  # admitted as an asynchronous KV load (policy.connector): holds its blocks, not running


TERMINAL = frozenset({Status.FINISHED, Status.REJECTED, Status.CANCELLED})


class Reason(IntEnum):
    NONE = 0
    STOPPED = 1  # produced its output tokens
    LENGTH_CAPPED = 2  # reached max_model_len
    PROMPT_TOO_LONG = 3  # prompt_len >= max_model_len
    NEVER_FITS = 4  # needs more KV blocks than the pool has (admission.reject_never_fits)
    OVERLOADED = 5  # admission.max_inflight reached
    QUEUE_FULL = 6  # admission.max_queue_len / max_queued_tokens reached
    TIMEOUT = 7  # timeouts.queue_timeout_ms passed before first admission
    ABORTED = 8  # cancelled by the client
    OUT_OF_MEMORY = 9  # aborted by the scheduler: even alone its next decode does not fit (SGLang's retract_decode)
    LOAD_FAILED = 10  # its asynchronous KV load failed (connector.load_failure fail: vLLM's FINISHED_ERROR)


NEVER = 1 << 62  # a step that never comes: a transfer that is never reported done, a release that never happens
PAST_TRANSFER = -2  # transfer_step of a held request whose transfer is over (its report frees nothing)

_PENDING, _NO_REASON = Status.PENDING, Reason.NONE  # bound once: an Enum class attribute costs ~0.2 us per use


class Request:
    """The scheduler's record of one request: the static spec plus the mutable fields."""

    __slots__ = ("spec", "rid", "arrival_us", "prompt_len", "output_len", "max_output", "priority",
                 "tenant", "status", "reason", "num_computed", "num_generated", "blocks",
                 "swapped_blocks", "admitted_seq", "requeue_seq", "num_preemptions", "release_step",
                 "block_ids", "num_cached_blocks", "chain", "transfer_step")

    def __init__(self, spec: RequestSpec):
        self.spec = spec
        self.rid = spec.rid
        self.arrival_us = spec.arrival_us
        self.prompt_len = spec.prompt_len
        self.output_len = spec.output_len
        self.max_output = spec.max_output
        self.priority = spec.priority
        self.tenant = spec.tenant
        self.status = _PENDING
        self.reason = _NO_REASON
        self.num_computed = 0  # tokens whose KV is computed
        self.num_generated = 0  # output tokens produced
        self.blocks = 0  # KV blocks held in the pool
        self.swapped_blocks = 0  # KV blocks held in swap space
        self.admitted_seq = 0  # position in the running list (0: never admitted)
        self.requeue_seq = 0  # when it was last put back into the queue (0: never)
        self.num_preemptions = 0
        self.release_step = -1  # CANCELLED holding KV: the step at whose start the KV is freed
        # Block identity, with prefix caching only (checker.semantics.blockpool); blocks == len(block_ids) then.
        self.block_ids: list[int] = []  # the request's block table
        self.num_cached_blocks = 0  # how many of its first blocks are registered in the cache
        self.chain: list[int] = []  # chains of its full blocks, extended as its tokens grow
        # With a KV connector only: the step in whose output its transfer (a load, or a prefill node's send) is
        # reported done (NEVER: it never is); -1 while it has started none.
        self.transfer_step = -1

    def copy(self) -> Request:
        """An independent record with the same spec and the same mutable fields."""
        c = Request.__new__(Request)
        c.spec, c.rid, c.arrival_us, c.prompt_len = self.spec, self.rid, self.arrival_us, self.prompt_len
        c.output_len, c.max_output, c.priority, c.tenant = self.output_len, self.max_output, self.priority, self.tenant
        c.status, c.reason, c.num_computed, c.num_generated = self.status, self.reason, self.num_computed, self.num_generated
        c.blocks, c.swapped_blocks, c.admitted_seq, c.requeue_seq = self.blocks, self.swapped_blocks, self.admitted_seq, self.requeue_seq
        c.num_preemptions, c.release_step = self.num_preemptions, self.release_step
        c.block_ids, c.num_cached_blocks, c.chain = list(self.block_ids), self.num_cached_blocks, self.chain
        c.transfer_step = self.transfer_step
        return c

    @property
    def num_tokens(self) -> int:
        """Prompt plus generated tokens: what the next computation must cover."""
        return self.prompt_len + self.num_generated

    @property
    def gap(self) -> int:
        return self.prompt_len + self.num_generated - self.num_computed

    @property
    def in_prefill(self) -> bool:
        """Prefill (or recompute) until it has an output token and is one token behind."""
        return self.num_generated == 0 or self.num_computed + 1 < self.prompt_len + self.num_generated

    def in_prefill_after(self, n: int) -> bool:
        """Still in its prefill (or recompute) once n more tokens are computed: a gap left that is not one decode."""
        tokens = self.prompt_len + self.num_generated
        computed = self.num_computed + n
        return computed < tokens and (self.num_generated == 0 or computed + 1 < tokens)

    def snapshot(self) -> tuple[int, ...]:
        """The mutable fields, in FIELDS order (conformance tests compare these)."""
        return (int(self.status), int(self.reason), self.num_computed, self.num_generated, self.blocks,
                self.swapped_blocks, self.admitted_seq, self.requeue_seq, self.num_preemptions,
                self.release_step)

    def __repr__(self) -> str:
        return (f"Request(rid={self.rid}, {self.status.name}, computed={self.num_computed}, "
                f"generated={self.num_generated}/{self.output_len}, blocks={self.blocks})")


FIELDS = ("status", "reason", "num_computed", "num_generated", "blocks", "swapped_blocks",
          "admitted_seq", "requeue_seq", "num_preemptions", "release_step")


class SGLangState:
    """What SGLang's scheduler keeps between iterations beyond the requests and the pool."""

    __slots__ = ("chunked", "batch_is_full", "ratio", "entry", "shrunk", "ran_batch", "aborting", "next_entry",
                 "fill", "remade", "tree", "node", "protected", "prefix", "refreshes", "tokens", "extend_rows")

    def __init__(self, init_ratio: float, radix_page: int | None = None):
        self.chunked: int | None = None  # rid of Scheduler.chunked_req (running, its prompt not yet complete)
        self.batch_is_full = False  # running_batch.batch_is_full
        self.ratio = init_ratio  # new_token_ratio_tracker.current
        self.entry: dict[int, int] = {}  # rid -> when it last entered the waiting queue (wait_queue_entry_time)
        self.next_entry = 0
        self.shrunk = False  # a request of the last batch ended or stayed chunked: its filter clears batch_is_full
        # this step's prefill batch becomes the running batch object (batch_is_full false): mixed, or none was running
        self.remade = False
        self.ran_batch = False  # the last step ran a batch (last_batch is not None, for the idle ratio reset)
        self.aborting: set[int] = set()  # running requests aborted: they end when their next row is computed
        # rid -> len(full_untruncated_fill_ids): prompt + output as of the request's last init_next_round_input (what
        # priority preemption reads for a waiting request; 0 before its first)
        self.fill: dict[int, int] = {}
        # The radix cache (policy.sglang.radix_cache; checker.semantics.radix), None when it is disabled. node: rid ->
        # the tree node a running request locks (req.lock); protected: rid -> its cache_protected_len (its first tokens
        # that are the tree's); prefix: rid -> req.prefix_len as its last match left it (priority preemption reads it);
        # refreshes: calc_priority calls (the waiting-prefix refresh runs every 32nd); tokens: (rid, prompt length,
        # prompt identity) -> its prompt's token ids (a function of its spec, shared between copies).
        self.tree = None if radix_page is None else Tree(radix_page)
        self.node: dict[int, Node] = {}
        self.protected: dict[int, int] = {}
        self.prefix: dict[int, int] = {}
        self.refreshes = 0
        self.tokens: dict[tuple, tuple] = {}
        self.extend_rows: set[int] | tuple = ()  # within a step only: the rids of its prefill batch's extend rows

    def copy(self) -> SGLangState:
        c = SGLangState.__new__(SGLangState)
        c.chunked, c.batch_is_full, c.ratio = self.chunked, self.batch_is_full, self.ratio
        c.entry, c.next_entry, c.shrunk = dict(self.entry), self.next_entry, self.shrunk
        c.ran_batch, c.aborting, c.fill, c.remade = self.ran_batch, set(self.aborting), dict(self.fill), self.remade
        c.protected, c.prefix = dict(self.protected), dict(self.prefix)
        c.refreshes, c.tokens, c.extend_rows = self.refreshes, self.tokens, self.extend_rows
        if self.tree is None:
            c.tree, c.node = None, {}
        else:
            c.tree, by_id = self.tree.copy()
            c.node = {rid: by_id[n.id] for rid, n in self.node.items()}
        return c

    def snapshot(self) -> tuple:
        snap = (self.chunked, self.batch_is_full, self.ratio, tuple(sorted(self.entry.items())), self.next_entry,
                self.shrunk, self.ran_batch, tuple(sorted(self.aborting)), tuple(sorted(self.fill.items())), self.remade)
        if self.tree is None:
            return snap
        return snap + (self.tree.snapshot(), tuple(sorted((rid, n.id) for rid, n in self.node.items())),
                       tuple(sorted(self.protected.items())), tuple(sorted(self.prefix.items())), self.refreshes % 32)


class SchedulerState:
    """Everything the step reads and writes. ``running`` is in admission order; ``waiting`` is kept
    in queue order by checker.semantics.order; the KV counters are sums over the requests."""

    def __init__(self, policy: Policy, specs: list[RequestSpec], num_tenants: int = 1):
        self.policy = policy
        self.requests = [Request(s) for s in specs]
        self.running: list[Request] = []
        self.waiting: list[Request] = []
        self.holding: list[Request] = []  # CANCELLED (or FINISHED, pinned by a connector), still holding KV
        # With a KV connector and holders_first: waiting requests that hold blocks (LOADING, or loaded and not yet
        # running), in the order their loads started (vLLM 0.33's kv_holding_waiting); empty otherwise.
        self.holders: list[Request] = []
        self.loads_in_flight = 0  # requests in LOADING
        self.kv_used = 0
        self.swap_used = 0
        self.next_seq = 1  # shared counter for admitted_seq and requeue_seq
        self.step = 0  # index of the next step
        self.tenant_counters = [0] * max(num_tenants, 1 + max((s.tenant for s in specs), default=0))
        kv = policy.kv
        cache = kv.prefix_caching
        self.pool = BlockPool(kv.num_blocks, kv.block_size, cache.chained_hashes) if cache.enabled else None
        # SGLang's scheduler state (policy.scheduler sglang; checker.semantics.sglang), None under the vLLM rules
        self.sglang = (SGLangState(policy.sglang.init_ratio, kv.block_size if policy.sglang.radix_cache else None)
                       if policy.scheduler is Scheduler.SGLANG else None)
        # Speculative decoding's drafts (policy.speculative; checker.semantics.speculative), None when it is off
        self.spec = _spec_state(policy) if policy.speculative.enabled else None
        # Async scheduling's batches in flight (policy.pipeline; checker.semantics.inflight), None when it is off
        self.pipe = _pipe_state(policy) if policy.pipeline.enabled else None
        # Blocked waiting states (policy.queue.blocked_waiting; checker.semantics.blocked): rid -> the step whose
        # scan first finds its grammar ready, for the waiting requests still blocked; None when it is off
        self.blocked: dict[int, int] | None = None if policy.queue.blocked_waiting == "off" else {}

    def copy(self) -> SchedulerState:
        """An independent state (requests copied; the policy shared), for stepping one state several ways."""
        c = SchedulerState.__new__(SchedulerState)
        c.policy = self.policy
        c.requests = requests = [r.copy() for r in self.requests]
        c.running = [requests[r.rid] for r in self.running]
        c.waiting = [requests[r.rid] for r in self.waiting]
        c.holding = [requests[r.rid] for r in self.holding]
        c.holders = [requests[r.rid] for r in self.holders]
        c.loads_in_flight = self.loads_in_flight
        c.kv_used, c.swap_used, c.next_seq, c.step = self.kv_used, self.swap_used, self.next_seq, self.step
        c.tenant_counters = list(self.tenant_counters)
        c.pool = None if self.pool is None else self.pool.copy()
        c.sglang = None if self.sglang is None else self.sglang.copy()
        c.spec = None if self.spec is None else self.spec.copy()
        c.pipe = None if self.pipe is None else self.pipe.copy()
        c.blocked = None if self.blocked is None else dict(self.blocked)
        return c

    def take_seq(self) -> int:
        seq = self.next_seq
        self.next_seq += 1
        return seq

    def snapshot(self) -> tuple:
        """Per-request fields plus the globals (conformance and determinism tests compare these)."""
        snap = (tuple(r.snapshot() for r in self.requests), self.kv_used, self.swap_used,
                self.next_seq, self.step, tuple(self.tenant_counters))
        snap = snap if self.sglang is None else snap + (self.sglang.snapshot(),)
        snap = snap if self.spec is None else snap + (self.spec.snapshot(),)
        snap = snap if self.blocked is None else snap + (tuple(sorted(self.blocked.items())),)
        return snap if self.pipe is None else snap + (self.pipe.snapshot(),)


def _spec_state(policy: Policy):
    from checker.semantics.speculative import SpecState  # it imports this module

    return SpecState(policy)


def _pipe_state(policy: Policy):
    from checker.semantics.inflight import PipeState  # it imports this module

    return PipeState(policy)
