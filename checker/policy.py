"""The scheduler policy: a declarative rule set, validated by pydantic.

One section per rule kind of the unified vocabulary (docs/spec-reference.md): admission, queue
order, batch composition, chunking, KV allocation, preemption, cancellation, timeouts. Defaults are
vLLM v1 (0.33) behaviour wherever vLLM has the knob; capacity (``kv.num_blocks``) and
``max_model_len`` have no default because they depend on the model and device.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

# Bounds that reject absurd sizes with a clear message instead of simulating forever.
MAX_TOKENS = 10_000_000
MAX_BLOCKS = 100_000_000
MAX_SEQS = 1_000_000
MAX_BLOCK_SIZE = 4096
MAX_STEPS = 1_000_000
MAX_MS = 86_400_000  # one day


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


def _fail(field: str, value: object, expected: str) -> PydanticCustomError:
    """A cross-field error carrying its own field path (relative to the model that raised it)."""
    return PydanticCustomError(
        "consistency", "{field}={value} (expected {expected})",
        {"field": field, "value": value, "expected": expected},
    )


# ----------------------------------------------------------------------------------------- admission
class Admission(_Strict):
    """Gate at arrival. Prompts with ``prompt_len >= max_model_len`` are always rejected (every
    modelled server validates this); the fields here are the optional gates."""

    max_inflight: Annotated[int | None, Field(ge=1, le=MAX_SEQS)] = None
    """Reject on arrival when waiting + running requests already reach this (TGI
    ``max_concurrent_requests``: HTTP 429)."""
    max_queue_len: Annotated[int | None, Field(ge=0, le=MAX_SEQS)] = None
    """Reject on arrival when this many requests already wait (SGLang ``max_queued_requests``)."""
    max_queued_tokens: Annotated[int | None, Field(ge=1, le=10 * MAX_TOKENS)] = None
    """Reject on arrival when the prompt tokens of waiting requests plus this prompt exceed it."""
    reject_never_fits: bool = False
    """Reject a request whose whole context (prompt + max output) needs more blocks than the pool
    has. vLLM does not: such a request sits at the queue head forever."""
    reserve_full_prompt: bool = True
    """Admit a waiting request only if blocks for its whole current sequence (prompt + generated)
    fit, not just the first chunk (vLLM ``scheduler_reserve_full_isl``)."""


# ----------------------------------------------------------------------------------------- queue
class QueueOrder(StrEnum):
    """fcfs: arrival order. priority: by priority (see priority_polarity), then arrival.
    priority_aging: priority improved by one level per aging_interval_ms waited, then arrival.
    shortest_prompt_first: by prompt length, then arrival. tenant_fair: by the tenant's virtual
    token counter (VTC), then arrival."""

    FCFS = "fcfs"
    PRIORITY = "priority"
    PRIORITY_AGING = "priority_aging"
    SHORTEST_PROMPT_FIRST = "shortest_prompt_first"
    TENANT_FAIR = "tenant_fair"


class Polarity(StrEnum):
    """lower_first: a lower value is served first (vLLM). higher_first: a higher value first (SGLang)."""

    LOWER_FIRST = "lower_first"  # vLLM: a lower value is served first
    HIGHER_FIRST = "higher_first"  # SGLang default, TRT-LLM float priority


class HeadOfLine(StrEnum):
    """strict: admission stops at the first waiting request that does not fit (vLLM, TGI, TRT-LLM).
    skip: that request is passed over and the next one is tried."""

    STRICT = "strict"  # stop admitting at the first waiting request that does not fit (vLLM, TGI)
    SKIP = "skip"  # try the next waiting request instead


class Requeue(StrEnum):
    """front: a preempted request goes back to the front of the queue (vLLM FCFS). by_order: it
    re-enters at its place in the queue order (vLLM's priority heap)."""

    FRONT = "front"  # a preempted request goes back to the front of the queue (vLLM FCFS)
    BY_ORDER = "by_order"  # a preempted request re-enters at its place in the queue order (vLLM priority heap)


class VTCWeights(_Strict):
    """Virtual token counter weights (Sheng et al., OSDI'24): service = w_in * input + w_out * output."""

    input_weight: Annotated[int, Field(ge=0, le=1000)] = 1
    """Counter increase per prompt token computed (prefill and recompute)."""
    output_weight: Annotated[int, Field(ge=0, le=1000)] = 2
    """Counter increase per output token produced."""


class BlockedWaiting(StrEnum):
    """What the waiting scan does at a request in a blocked waiting state (a structured-output request whose grammar
    is still compiling: trace field ``grammar_steps``; checker/semantics/blocked.py).
    off: no blocked states (``grammar_steps`` is ignored; every rule exactly as without this field).
    skip: the scan passes over it and it keeps its place in the queue (vLLM 0.33: skip_request puts it on the
    step's skipped list, re-queued at the front in its order when the pass ends).
    stop: it is treated as a request that does not fit (under strict head of line admission stops behind it: the
    planted bug of docs/semantics.md)."""

    OFF = "off"
    SKIP = "skip"
    STOP = "stop"


class Queue(_Strict):
    order: QueueOrder = QueueOrder.FCFS
    """Waiting-queue order."""
    priority_polarity: Polarity = Polarity.LOWER_FIRST
    """Which priority value is more urgent."""
    aging_interval_ms: Annotated[int | None, Field(ge=1, le=MAX_MS)] = None
    """priority_aging only: a waiting request's effective priority improves by one level for every
    this many ms it has waited since arrival."""
    vtc: VTCWeights | None = None
    """tenant_fair only: the tenant with the smallest counter is served first."""
    head_of_line: HeadOfLine = HeadOfLine.STRICT
    """What admission does at a waiting request that does not fit."""
    preempted_requeue: Requeue = Requeue.FRONT
    """Where a preempted request re-enters the waiting queue."""
    blocked_waiting: BlockedWaiting = BlockedWaiting.OFF
    """What admission does at a waiting request whose structured-output grammar is not ready yet (off: the
    requests' ``grammar_steps`` are ignored)."""

    @model_validator(mode="after")
    def _order_parameters(self) -> Queue:
        aging = self.order is QueueOrder.PRIORITY_AGING
        if aging and self.aging_interval_ms is None:
            raise _fail("aging_interval_ms", None, "an interval in ms when order is priority_aging")
        if not aging and self.aging_interval_ms is not None:
            raise _fail("aging_interval_ms", self.aging_interval_ms,
                        f"no aging interval unless order is priority_aging (order is {self.order.value})")
        fair = self.order is QueueOrder.TENANT_FAIR
        if not fair and self.vtc is not None:
            raise _fail("vtc", "{...}", f"no vtc weights unless order is tenant_fair (order is {self.order.value})")
        return self

    @property
    def vtc_weights(self) -> VTCWeights:
        return self.vtc or VTCWeights()

    @property
    def uses_priority(self) -> bool:
        return self.order in (QueueOrder.PRIORITY, QueueOrder.PRIORITY_AGING)


# ----------------------------------------------------------------------------------------- batch
class PhaseMode(StrEnum):
    """decode_first: running requests (decodes and partial prefills) are served first, then
    admissions fill what is left (vLLM v1, Sarathi). prefill_first: if any prefill work fits, the step
    runs prefills only and decodes wait (vLLM v0, SGLang). mixed: one pass over running and waiting
    requests together in queue order (Orca). static: admit only when nothing runs, and run the batch to
    completion (Triton dynamic batcher, TRT-LLM STATIC_BATCH)."""

    DECODE_FIRST = "decode_first"  # running requests (decodes, partial prefills) first, then admissions (vLLM v1, Sarathi)
    PREFILL_FIRST = "prefill_first"  # if any prefill work fits, the step runs prefills only (vLLM v0, SGLang)
    MIXED = "mixed"  # one pass over running and waiting together in queue order (Orca)
    STATIC = "static"  # admit only when nothing runs; the batch runs to completion (Triton, TRT STATIC)


class Batch(_Strict):
    max_num_seqs: Annotated[int, Field(ge=1, le=MAX_SEQS)] = 256
    """Cap on running requests (vLLM ``max_num_seqs``, TRT-LLM ``max_batch_size``)."""
    max_num_batched_tokens: Annotated[int, Field(ge=1, le=MAX_TOKENS)] = 8192
    """Token budget of one step, shared by decodes and prefill chunks."""
    phase_mode: PhaseMode = PhaseMode.DECODE_FIRST
    """How prefills and decodes share a step."""
    prefill_share: Annotated[float | None, Field(gt=0.0, le=1.0)] = None
    """Cap on the share of the step's token budget that prefill tokens may take (None: no cap)."""

    @property
    def prefill_token_cap(self) -> int:
        if self.prefill_share is None:
            return self.max_num_batched_tokens
        return max(1, int(self.prefill_share * self.max_num_batched_tokens))


# ----------------------------------------------------------------------------------------- chunking
class Chunking(_Strict):
    enabled: bool = True
    """Split prompts into chunks that fit the step budget. Off: a whole prompt must fit one step."""
    long_prefill_token_threshold: Annotated[int, Field(ge=0, le=MAX_TOKENS)] = 0
    """Per-request per-step cap on new tokens; 0 = no cap (vLLM ``long_prefill_token_threshold``)."""
    threshold_when_alone: bool = True
    """The cap applies even when only one request is running or waiting at the start of the step (vLLM
    v1 before 0.33, Sarathi). vLLM 0.33: false, a lone request has nobody to starve and takes the budget."""
    threshold_adaptive: bool = False
    """Floor the cap at ``max_num_batched_tokens // (running + waiting)`` (vLLM 0.33
    ``long_prefill_token_threshold_adaptive``)."""


# ----------------------------------------------------------------------------------------- kv
class Allocation(StrEnum):
    """on_demand: blocks for the tokens scheduled in the step only (vLLM, TRT-LLM MAX_UTILIZATION).
    full_reservation: at admission, blocks for prompt + max output (Orca, TGI, TRT-LLM NO_EVICT)."""

    ON_DEMAND = "on_demand"  # blocks for the tokens scheduled this step only (vLLM, TRT MAX_UTILIZATION)
    FULL_RESERVATION = "full_reservation"  # blocks for prompt + max output at admission (Orca, TGI, TRT NO_EVICT)


class PrefixCaching(_Strict):
    """Block reuse by chained block hashes (vLLM automatic prefix caching; docs/prefix-caching.md)."""

    enabled: bool = False
    """Full blocks are hashed as their tokens are scheduled; a freed block keeps its hash until it is
    reused (LRU); a waiting request starts from its longest cached prefix. Off: no block is shared."""
    count_evictable_hits: bool = True
    """Admission counts the hit blocks that are cached but free against the free blocks (adopting them
    takes them off the free queue; vLLM's get_num_blocks_to_allocate). False models a scheduler that treats
    every hit block as already held: it over-commits the pool when hits are free (a planted-bug knob)."""
    chained_hashes: bool = True
    """A block's hash covers the block's tokens and every token before it (vLLM's chained block hashes).
    False models hashing a block's own tokens only: a block then matches another prompt's block with the
    same tokens after a different prefix, a wrong hit (a planted-bug knob)."""


class KV(_Strict):
    num_blocks: Annotated[int, Field(ge=1, le=MAX_BLOCKS)]
    """Usable KV blocks in the pool (vLLM: num_gpu_blocks - 1, block 0 is the null block)."""
    block_size: Annotated[int, Field(ge=1, le=MAX_BLOCK_SIZE)] = 16
    """Tokens per KV block."""
    allocation: Allocation = Allocation.ON_DEMAND
    """When blocks are taken from the pool."""
    watermark: Annotated[float, Field(ge=0.0, lt=1.0)] = 0.0
    """Headroom at admission: a waiting or preempted request is admitted only if
    ``int(watermark * num_blocks)`` blocks stay free, when something is already running."""
    check_allocation: bool = True
    """False models a scheduler that grows running requests without checking the pool (it trusts
    an estimate): blocks in use may then exceed ``num_blocks`` (an over-commit)."""
    swap_blocks: Annotated[int, Field(ge=0, le=MAX_BLOCKS)] = 0
    """CPU swap space in blocks, for ``preemption.mode: swap``."""
    prefix_caching: PrefixCaching = Field(default_factory=PrefixCaching)
    """Prefix caching (block identity). vLLM 0.33 turns it on by default; the importer says so."""

    @property
    def watermark_blocks(self) -> int:
        return int(self.watermark * self.num_blocks)


# ----------------------------------------------------------------------------------------- preemption
class Trigger(StrEnum):
    """kv_growth_fails: a running request cannot get its next blocks (vLLM). priority_inversion: the
    waiting head outranks the worst running request and does not fit (vLLM v0, SGLang)."""

    KV_GROWTH_FAILS = "kv_growth_fails"  # a running request cannot get its next blocks (vLLM)
    PRIORITY_INVERSION = "priority_inversion"  # the waiting head outranks the worst running request and does not fit (vLLM v0, SGLang)


class Victim(StrEnum):
    """last_admitted: the tail of the running list (vLLM FCFS, TRT-LLM MAX_UTILIZATION).
    lowest_priority: worst priority, then latest arrival (vLLM priority). fewest_generated: fewest
    output tokens, ties to the longest prompt (SGLang retract)."""

    LAST_ADMITTED = "last_admitted"  # tail of the running list (vLLM FCFS, TRT-LLM MAX_UTILIZATION)
    LOWEST_PRIORITY = "lowest_priority"  # worst priority, then latest arrival (vLLM priority)
    FEWEST_GENERATED = "fewest_generated"  # fewest output tokens, ties to the longest prompt (SGLang retract)


class PreemptMode(StrEnum):
    """recompute: free all blocks; the request recomputes prompt + generated later. swap: move the
    blocks to swap space and resume without recompute (vLLM v0); recompute when swap space is full."""

    RECOMPUTE = "recompute"  # free all blocks; the request recomputes prompt + generated later
    SWAP = "swap"  # move the blocks to swap space; resume without recompute (vLLM v0)


class Preemption(_Strict):
    triggers: list[Trigger] = Field(default_factory=lambda: [Trigger.KV_GROWTH_FAILS])
    """What preempts. An empty list: never preempt (a request that cannot grow just waits)."""
    victim: Victim = Victim.LAST_ADMITTED
    """Which running request is preempted."""
    mode: PreemptMode = PreemptMode.RECOMPUTE
    """What happens to a preempted request's KV."""
    block_admission_after_preempt: bool = True
    """No admissions in a step in which a running request was preempted for KV (vLLM v1)."""
    priority_inversion_threshold: Annotated[int, Field(ge=0, le=1_000_000)] = 0
    """priority_inversion only: preempt only if the priorities differ by more than this (SGLang: 10)."""

    @model_validator(mode="after")
    def _distinct_triggers(self) -> Preemption:
        if len(set(self.triggers)) != len(self.triggers):
            raise _fail("triggers", [t.value for t in self.triggers], "each trigger at most once")
        return self


# ----------------------------------------------------------------------------------------- events
class Cancellation(_Strict):
    release_lag_steps: Annotated[int, Field(ge=0, le=MAX_STEPS)] = 0
    """Steps between a cancel reaching the scheduler and the request's KV blocks being freed
    (vLLM: 0, freed before the next step; TGI: lazy, after the next token)."""


class TimeoutAction(StrEnum):
    """reject: the timed-out request leaves the queue as rejected (Triton REJECT)."""

    REJECT = "reject"


class Timeouts(_Strict):
    queue_timeout_ms: Annotated[int | None, Field(ge=1, le=MAX_MS)] = None
    """A request still waiting for its first admission after this many ms is rejected."""
    action: TimeoutAction = TimeoutAction.REJECT
    """What happens to a request that timed out in the queue."""


# ----------------------------------------------------------------------------------------- connector
class ConnectorKind(StrEnum):
    """none: no KV connector (every request computes its KV on this node).
    offload: an external KV tier (CPU offload, LMCache, a shared store): a waiting request whose prompt the
    tier holds beyond the local prefix hit is admitted as an asynchronous load that holds its blocks until the
    load is reported done (vLLM 0.33: WAITING_FOR_REMOTE_KVS), then computes the rest locally.
    decode_node: the decode side of disaggregated prefill/decode: the same load state, the KV coming from a
    prefill node.
    prefill_node: the prefill side: a finished request's blocks stay pinned until the decode side confirms
    the transfer (vLLM's connector request_finished returning delay_free_blocks).
    both: a node in both roles (vLLM kv_role kv_both with a P/D connector): loads, and pins after finish."""

    NONE = "none"
    OFFLOAD = "offload"
    DECODE_NODE = "decode_node"
    PREFILL_NODE = "prefill_node"
    BOTH = "both"


class ReleaseRule(StrEnum):
    """When blocks held for a transfer are freed once nothing else needs them.
    on_completion: when the connector reports the transfer done (vLLM 0.33: an aborted load frees its blocks
    when finished_recving arrives; a pinned request when finished_sending arrives): never, if it never does.
    immediate: at once (an aborted load's blocks are freed at the abort; pinning is off).
    deadline: on completion, or ``release_deadline_steps`` steps after the abort or finish, whichever is first
    (NIXL's abort-request timeout)."""

    ON_COMPLETION = "on_completion"
    IMMEDIATE = "immediate"
    DEADLINE = "deadline"


class LoadFailure(StrEnum):
    """What happens to a request whose asynchronous load fails (trace field ``load_fails``: the connector reports
    the load done and failed; vLLM 0.33 kv_load_failure_policy, failed_recving).
    fail: the request ends with an error in the output of the step reporting the failure (FINISHED_ERROR; reason
    LOAD_FAILED) and its blocks are freed then (vLLM's default).
    recompute: when the waiting scan next reaches it, its blocks are freed and it is admitted from scratch like a
    fresh request (its local prefix hit looked up again; no second load)."""

    FAIL = "fail"
    RECOMPUTE = "recompute"


class Connector(_Strict):
    """A KV connector: requests that hold KV blocks while they are not running (docs/semantics.md,
    "KV held outside the running batch")."""

    kind: ConnectorKind = ConnectorKind.NONE
    """What the node's connector does; none keeps every other rule exactly as without this section."""
    holders_first: bool = True
    """Waiting requests that hold blocks (loads in flight, loaded requests not yet running) are kept in their
    own queue, scanned before the waiting queue (vLLM 0.33's kv_holding_waiting). False: they stay in the
    waiting queue in its order, where a plain waiting request that does not fit stops the scan before them."""
    reserve_inflight: bool = True
    """A load is admitted only if its blocks fit in the free blocks minus what the in-flight prefills (loads,
    and running requests still in their prefill) need to finish (vLLM 0.33's reserved_blocks)."""
    release: ReleaseRule = ReleaseRule.ON_COMPLETION
    """When an aborted load's blocks (offload, decode_node) or a finished request's pinned blocks
    (prefill_node) are freed."""
    release_deadline_steps: Annotated[int | None, Field(ge=1, le=MAX_STEPS)] = None
    """Steps after the abort (or finish) at which ``release: deadline`` frees the blocks."""
    max_load_steps: Annotated[int, Field(ge=1, le=MAX_STEPS)] = 4
    """Longest transfer that verification and liveness let the environment choose (a load or a send takes
    1..max_load_steps steps, or never completes if ``transfers_may_hang``); the engine takes each request's
    own latency from its workload or trace."""
    transfers_may_hang: bool = True
    """Verification and liveness also let a transfer never complete (a lost load, a decode side that never
    reads)."""
    load_failure: LoadFailure = LoadFailure.FAIL
    """What a failed load does to its request (a request's ``load_fails``)."""
    loads_may_fail: bool = False
    """The environment may make loads fail (the fuzzer's choices; verify, any-N and the liveness explorer refuse
    it by name: failed loads are not encoded)."""

    @property
    def enabled(self) -> bool:
        return self.kind is not ConnectorKind.NONE

    @property
    def loads(self) -> bool:
        return self.kind in (ConnectorKind.OFFLOAD, ConnectorKind.DECODE_NODE, ConnectorKind.BOTH)

    @property
    def pins(self) -> bool:
        return (self.kind in (ConnectorKind.PREFILL_NODE, ConnectorKind.BOTH)
                and self.release is not ReleaseRule.IMMEDIATE)

    @model_validator(mode="after")
    def _consistent(self) -> Connector:
        if self.release is ReleaseRule.DEADLINE and self.release_deadline_steps is None:
            raise _fail("release_deadline_steps", None, ">= 1 when release is deadline")
        if self.release is not ReleaseRule.DEADLINE and self.release_deadline_steps is not None:
            raise _fail("release_deadline_steps", self.release_deadline_steps,
                        f"null unless release is deadline (it is {self.release.value}: the deadline would never apply)")
        if not self.enabled:
            defaults = Connector(kind=ConnectorKind.OFFLOAD)
            for name in ("holders_first", "reserve_inflight", "release", "max_load_steps", "transfers_may_hang",
                         "load_failure", "loads_may_fail"):
                value = getattr(self, name)
                if value != getattr(defaults, name):
                    shown = value.value if isinstance(value, StrEnum) else str(value).lower()
                    raise _fail(name, shown, "its default unless kind is offload, decode_node, prefill_node or both "
                                "(without a connector no request holds KV outside the batch)")
        return self


# ----------------------------------------------------------------------------------------- speculative decoding
class SpecMethod(StrEnum):
    """How draft tokens are proposed (vLLM's speculative_config method). none: no speculative decoding. ngram:
    prompt lookup (no lookahead slots). draft: a separate draft model (vLLM draft_model: k lookahead slots and one
    extra budget slot per scheduled request). eagle, mtp: a draft head on the target's hidden states (k lookahead
    slots; mtp as single-module MTP, the eagle family)."""

    NONE = "none"
    NGRAM = "ngram"
    DRAFT = "draft"
    EAGLE = "eagle"
    MTP = "mtp"


class Speculative(_Strict):
    """Speculative decoding (docs/speculative.md): every running request that decoded in the step it was last
    scheduled holds ``num_tokens`` draft tokens, scheduled with its next decode (counted in the token budget), the
    drafter's lookahead slots allocated with them; the environment accepts 0..num_tokens of them, and the rejected
    ones are rolled back."""

    method: SpecMethod = SpecMethod.NONE
    """The drafter; none keeps every other rule exactly as without this section."""
    num_tokens: Annotated[int, Field(ge=0, le=64)] = 0
    """Draft tokens per step (vLLM num_speculative_tokens): 0 with method none, 1..64 otherwise."""
    reserve_lookahead: bool = True
    """The drafter's lookahead slots get blocks with the scheduled tokens (vLLM). False models a scheduler that
    allocates blocks for the scheduled tokens only, so the drafter writes KV past what a request holds (a planted bug:
    the invariant lookahead_fits finds it); only with a method that has lookahead slots (draft, eagle, mtp)."""

    @model_validator(mode="after")
    def _consistent(self) -> Speculative:
        if self.method is SpecMethod.NONE and self.num_tokens:
            raise _fail("num_tokens", self.num_tokens, "0 when method is none")
        if self.method is not SpecMethod.NONE and not self.num_tokens:
            raise _fail("num_tokens", 0, f">= 1 when method is {self.method.value}")
        if not self.reserve_lookahead and self.method in (SpecMethod.NONE, SpecMethod.NGRAM):
            raise _fail("reserve_lookahead", _shown(False), f"true when method is {self.method.value} (it has no lookahead "
                        "slots to leave unreserved)")
        return self

    @property
    def enabled(self) -> bool:
        return self.method is not SpecMethod.NONE

    @property
    def lookahead_slots(self) -> int:
        """KV slots the drafter needs past the scheduled tokens (vLLM VllmConfig.num_lookahead_tokens)."""
        return 0 if self.method in (SpecMethod.NONE, SpecMethod.NGRAM) else self.num_tokens

    @property
    def reserved_slots(self) -> int:
        """The lookahead slots allocated with the scheduled tokens (all of them unless reserve_lookahead is false)."""
        return self.lookahead_slots if self.reserve_lookahead else 0

    @property
    def budget_slots(self) -> int:
        """Extra token-budget slots each scheduled request takes (vLLM max_num_new_slots_for_drafting)."""
        return 1 if self.method is SpecMethod.DRAFT else 0


# ----------------------------------------------------------------------------------------- async scheduling
class Pipeline(_Strict):
    """Async scheduling (vLLM's AsyncScheduler stepped by the engine core's batch queue; docs/speculative.md, "Async
    scheduling"): the scheduler decides step t+1 while step t's batch is still in flight. A request whose in-flight
    step samples has that token as a placeholder (it counts as generated for what the next step schedules); the
    outputs, finishes and the frees of finished requests take effect when the batch is resolved, one step later."""

    in_flight: Annotated[int, Field(ge=0, le=64)] = 0
    """Batches in flight while the scheduler decides the next one: 0 (the default) synchronous scheduling, exactly as
    without this section (vLLM --no-async-scheduling); 1 async scheduling (vLLM --async-scheduling with
    pipeline_parallel_size 1). Deeper pipelines (pipeline parallelism, P batches in flight) are refused by name: not
    modelled yet."""

    @property
    def enabled(self) -> bool:
        return self.in_flight > 0


# ----------------------------------------------------------------------------------------- scheduler family
class Scheduler(StrEnum):
    """Whose scheduling rules the step follows. vllm: the rule sections above (vLLM, and the servers mapped onto
    its vocabulary). sglang: SGLang 0.5's own loop, prefill adder, new-token ratio and retraction
    (checker/semantics/sglang.py; docs/semantics.md, "SGLang's rules")."""

    VLLM = "vllm"
    SGLANG = "sglang"


class SGLangQueue(StrEnum):
    """SGLang's --schedule-policy values the rules model: fcfs (the queue in entry order; by priority, then entry,
    with priority scheduling), lof (longest output first: by max_new_tokens, descending), and the cache-aware lpm
    (longest cached prefix first; fcfs while more than 128 requests wait) and dfs-weight (a depth-first walk of the
    radix tree, heaviest subtree first). The cache-aware ones need sglang.radix_cache (SGLang itself runs fcfs for
    them when the cache is disabled: say fcfs)."""

    FCFS = "fcfs"
    LOF = "lof"
    LPM = "lpm"
    DFS_WEIGHT = "dfs-weight"


class SGLang(_Strict):
    """SGLang 0.5.23's scheduling knobs (server arguments and SGLANG_* environment variables), read when
    ``scheduler`` is sglang. The other sections give what SGLang shares with the vocabulary: kv.block_size is
    --page-size, kv.num_blocks the pool in pages, batch.max_num_seqs --max-running-requests,
    batch.max_num_batched_tokens --chunked-prefill-size (with chunking.enabled), queue.order fcfs or priority
    (--enable-priority-scheduling; queue.priority_polarity lower_first is --schedule-low-priority-values-first),
    preemption.triggers priority_inversion with its threshold (priority preemption), preemption.victim
    fewest_generated (--retraction-policy length) or lowest_priority (priority)."""

    schedule_policy: SGLangQueue = SGLangQueue.FCFS
    """--schedule-policy."""
    max_prefill_tokens: Annotated[int, Field(ge=1, le=MAX_TOKENS)] = 16384
    """--max-prefill-tokens: the prefill tokens of one batch (the first request of a batch may exceed it when
    chunking is off)."""
    mixed_chunk: bool = False
    """--enable-mixed-chunk: the running requests decode inside a prefill batch when their next pages fit."""
    radix_cache: bool = False
    """The radix (prefix) cache (SGLang's default; false is --disable-radix-cache): finished and prefilled requests'
    page-aligned tokens stay in a radix tree, later requests start from their longest cached prefix, and unlocked
    leaves are evicted least recently used first when the pool runs short (checker/semantics/radix.py)."""
    init_new_token_ratio: Annotated[float, Field(gt=0.0, le=1.0)] = 0.7
    """SGLANG_INIT_NEW_TOKEN_RATIO."""
    min_new_token_ratio_factor: Annotated[float, Field(ge=0.0, le=1.0)] = 0.14
    """SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR."""
    new_token_ratio_decay_steps: Annotated[float, Field(gt=0.0, le=MAX_STEPS)] = 600
    """SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS."""
    schedule_conservativeness: Annotated[float, Field(gt=0.0, le=100.0)] = 1.0
    """--schedule-conservativeness (scales the initial ratio, capped at 1)."""
    retract_decode_steps: Annotated[int, Field(ge=0, le=MAX_STEPS)] = 20
    """SGLANG_RETRACT_DECODE_STEPS: decode steps the requests left after a retraction are estimated to need."""
    clip_max_new_tokens: Annotated[int, Field(ge=1, le=MAX_TOKENS)] = 4096
    """SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION: the clip on a request's max_new_tokens in the admission estimate."""

    @model_validator(mode="after")
    def _modelled(self) -> SGLang:
        if self.schedule_policy in (SGLangQueue.LPM, SGLangQueue.DFS_WEIGHT) and not self.radix_cache:
            raise _fail("schedule_policy", self.schedule_policy.value, "fcfs or lof when radix_cache is false (SGLang "
                        "runs a cache-aware policy as fcfs when the radix cache is disabled: say fcfs)")
        return self

    @property
    def init_ratio(self) -> float:
        """The ratio's initial value (NewTokenRatioTracker.from_config)."""
        return min(self.init_new_token_ratio * self.schedule_conservativeness, 1.0)

    @property
    def min_ratio(self) -> float:
        return min(self.init_ratio * self.min_new_token_ratio_factor, 1.0)

    @property
    def ratio_decay(self) -> float:
        return (self.init_ratio - self.min_ratio) / self.new_token_ratio_decay_steps


# Fields the SGLang rules do not read: under scheduler sglang each must have this value (any other would be
# ignored, and a policy that says what its scheduler does not do misleads).
SGLANG_UNREAD = (
    ("batch.phase_mode", "prefill_first"),
    ("batch.prefill_share", None),
    ("chunking.long_prefill_token_threshold", 0),
    ("chunking.threshold_when_alone", True),
    ("chunking.threshold_adaptive", False),
    ("queue.head_of_line", "strict"),
    ("queue.preempted_requeue", "front"),
    ("kv.allocation", "on_demand"),
    ("kv.watermark", 0.0),
    ("kv.check_allocation", True),
    ("kv.prefix_caching.enabled", False),
    ("preemption.mode", "recompute"),
    ("preemption.block_admission_after_preempt", True),
    ("admission.reserve_full_prompt", True),
    ("cancellation.release_lag_steps", 0),
    ("connector.kind", "none"),
)


# ----------------------------------------------------------------------------------------- policy
class Policy(_Strict):
    """A scheduler policy: one section per rule kind of the unified vocabulary."""

    name: str | None = None
    """Policy name (default: the file name)."""
    max_model_len: Annotated[int, Field(ge=2, le=MAX_TOKENS)]
    """Longest context (prompt + output) of the model. Prompts of this length or more are rejected;
    decoding stops when prompt + output reaches it."""
    admission: Admission = Field(default_factory=Admission)
    """Gates applied when a request arrives."""
    queue: Queue = Field(default_factory=Queue)
    """Waiting-queue order and head-of-line behaviour."""
    batch: Batch = Field(default_factory=Batch)
    """Per-step budgets and how prefills and decodes share a step."""
    chunking: Chunking = Field(default_factory=Chunking)
    """Chunked prefill."""
    kv: KV
    """The paged KV pool."""
    preemption: Preemption = Field(default_factory=Preemption)
    """What preempts running requests, which ones, and how."""
    cancellation: Cancellation = Field(default_factory=Cancellation)
    """How fast a cancelled request's KV is released."""
    timeouts: Timeouts = Field(default_factory=Timeouts)
    """Queue timeouts."""
    connector: Connector = Field(default_factory=Connector)
    """A KV connector (offload tier, disaggregated prefill/decode): KV held by requests that are not running."""
    scheduler: Scheduler = Scheduler.VLLM
    """Whose scheduling rules the step follows: vllm (the sections above) or sglang (SGLang's own rules)."""
    sglang: SGLang = Field(default_factory=SGLang)
    """SGLang's knobs, read when scheduler is sglang."""
    speculative: Speculative = Field(default_factory=Speculative)
    """Speculative decoding: draft tokens and their lookahead slots (off by default)."""
    pipeline: Pipeline = Field(default_factory=Pipeline)
    """Async scheduling: a batch in flight while the next is decided (off by default)."""

    @model_validator(mode="after")
    def _consistent(self) -> Policy:
        b, c, q, p, kv = self.batch, self.chunking, self.queue, self.preemption, self.kv
        if not c.enabled and b.max_num_batched_tokens < self.max_model_len:
            raise _fail("batch.max_num_batched_tokens", b.max_num_batched_tokens,
                        f">= max_model_len={self.max_model_len} when chunking.enabled is false: "
                        "without chunking a whole prompt must fit one step (vLLM rejects this too)")
        if b.max_num_seqs > b.max_num_batched_tokens and self.scheduler is not Scheduler.SGLANG:
            raise _fail("batch.max_num_seqs", b.max_num_seqs,
                        f"<= batch.max_num_batched_tokens={b.max_num_batched_tokens}: "
                        "every running request needs at least one token per step")
        if c.long_prefill_token_threshold > self.max_model_len:
            raise _fail("chunking.long_prefill_token_threshold", c.long_prefill_token_threshold,
                        f"<= max_model_len={self.max_model_len}")
        if c.long_prefill_token_threshold and not c.enabled:
            raise _fail("chunking.long_prefill_token_threshold", c.long_prefill_token_threshold,
                        "0 when chunking.enabled is false: the cap splits prompts into chunks")
        if b.prefill_share is not None and not c.enabled and b.prefill_token_cap < self.max_model_len:
            raise _fail("batch.prefill_share", b.prefill_share,
                        f"a share leaving >= max_model_len={self.max_model_len} prefill tokens per step "
                        "when chunking.enabled is false")
        if Trigger.PRIORITY_INVERSION in p.triggers and not q.uses_priority:
            raise _fail("preemption.triggers", [t.value for t in p.triggers],
                        f"no priority_inversion unless queue.order is priority or priority_aging "
                        f"(it is {q.order.value})")
        if p.mode is PreemptMode.SWAP and kv.swap_blocks == 0:
            raise _fail("kv.swap_blocks", 0, ">= 1 when preemption.mode is swap")
        if p.mode is not PreemptMode.SWAP and kv.swap_blocks:
            raise _fail("kv.swap_blocks", kv.swap_blocks, "0 unless preemption.mode is swap")
        pc = kv.prefix_caching
        if not pc.enabled and not (pc.count_evictable_hits and pc.chained_hashes):
            bad = "count_evictable_hits" if not pc.count_evictable_hits else "chained_hashes"
            raise _fail(f"kv.prefix_caching.{bad}", False, "true unless kv.prefix_caching.enabled is true")
        if kv.prefix_caching.enabled:
            for name, value, allowed in (("kv.allocation", kv.allocation.value, "on_demand"),
                                         ("kv.check_allocation", kv.check_allocation, "true"),
                                         ("preemption.mode", p.mode.value, "recompute")):
                if str(value).lower() != allowed:
                    raise _fail(name, value, f"{allowed} when kv.prefix_caching.enabled is true (the block pool "
                                "with block identity models vLLM's on-demand, checked, recompute-only pool)")
        if self.scheduler is Scheduler.SGLANG:
            self._sglang_consistent()
        elif self.sglang != SGLang():
            changed = next(k for k, v in self.sglang.model_dump().items() if v != SGLang.model_fields[k].default)
            raise _fail(f"sglang.{changed}", _shown(getattr(self.sglang, changed)),
                        "its default unless scheduler is sglang (the vllm rules do not read the sglang section)")
        if self.speculative.enabled:
            self._speculative_consistent()
        if self.pipeline.enabled:
            self._pipeline_consistent()
        if q.blocked_waiting is not BlockedWaiting.OFF:
            for name, value, default in (("scheduler", self.scheduler.value, "vllm"),
                                         ("speculative.method", self.speculative.method.value, "none"),
                                         ("pipeline.in_flight", str(self.pipeline.in_flight), "0")):
                if value != default:
                    raise _fail(name, value, f"{default} when queue.blocked_waiting is {q.blocked_waiting.value} "
                                "(blocked waiting states are modelled for vLLM's synchronous rules)")
        con = self.connector
        if con.loads and b.phase_mode is PhaseMode.MIXED:
            raise _fail("connector.kind", con.kind.value, "none or prefill_node when batch.phase_mode is mixed (the "
                        "mixed pass has no holders' scan; loads are modelled for the decode_first, prefill_first "
                        "and static passes)")
        return self

    def _speculative_consistent(self) -> None:
        """Speculative decoding is modelled for vLLM's rules without prefix caching or a KV connector (refused by
        name otherwise), and its drafts must fit max_model_len and the step budget (vLLM refuses the latter)."""
        spec, b = self.speculative, self.batch
        method = spec.method.value
        for path, value, allowed, why in (
                ("scheduler", self.scheduler.value, "vllm", "SGLang's speculative rules are not modelled yet"),
                ("kv.prefix_caching.enabled", self.kv.prefix_caching.enabled, False,
                 "caching the accepted drafts' blocks and padded resumed decodes are not modelled yet"),
                ("connector.kind", self.connector.kind.value, "none",
                 "a load's deferred lookahead slots are not modelled yet"),
                ("kv.allocation", self.kv.allocation.value, "on_demand",
                 "lookahead slots under full reservation are not modelled yet")):
            if value != allowed:
                raise _fail(path, _shown(value), f"{_shown(allowed)} when speculative.method is {method} ({why})")
        if spec.num_tokens + 2 > self.max_model_len:
            raise _fail("speculative.num_tokens", spec.num_tokens,
                        f"<= max_model_len - 2 = {self.max_model_len - 2} (a decode verifying its drafts needs one "
                        "token of context, the drafts and the sampled token within max_model_len)")
        slots = max(spec.lookahead_slots, spec.budget_slots)
        if b.max_num_batched_tokens <= slots:
            raise _fail("batch.max_num_batched_tokens", b.max_num_batched_tokens,
                        f"> {slots} (the lookahead slots of speculative.method {method} with num_tokens "
                        f"{spec.num_tokens}: vLLM refuses a budget that cannot schedule a token beside them)")

    def _pipeline_consistent(self) -> None:
        """Async scheduling (in_flight 1) is modelled under vLLM's rules, speculative decoding included, without swap,
        a KV connector, full reservation or another phase mode (refused by name); deeper pipelines are not modelled
        yet."""
        depth = self.pipeline.in_flight
        if depth > 1:
            raise _fail("pipeline.in_flight", depth, "1: pipeline parallelism (more than one batch in flight, vLLM's "
                        "decode stagger) is not modelled yet")
        for path, value, allowed, why in (
                ("scheduler", self.scheduler.value, "vllm", "SGLang's overlap loop is not modelled yet"),
                ("connector.kind", self.connector.kind.value, "none",
                 "vLLM fences a consumer connector's frees until the in-flight step completes: not modelled yet"),
                ("preemption.mode", self.preemption.mode.value, "recompute", "vLLM v1 preempts by recompute"),
                ("kv.allocation", self.kv.allocation.value, "on_demand",
                 "full reservation under async scheduling is not modelled yet"),
                ("batch.phase_mode", self.batch.phase_mode.value, "decode_first",
                 "vLLM v1's passes; other phase modes are not modelled with a batch in flight")):
            if value != allowed:
                raise _fail(path, _shown(value), f"{_shown(allowed)} when pipeline.in_flight is {depth} ({why})")

    def _sglang_consistent(self) -> None:
        for path, default in SGLANG_UNREAD:
            value: object = self
            for part in path.split("."):
                value = getattr(value, part)
            if (value.value if isinstance(value, StrEnum) else value) != default:
                raise _fail(path, _shown(value), f"{_shown(default)} when scheduler is sglang (SGLang's rules do not "
                            "have this knob; see docs/semantics.md, \"SGLang's rules\")")
        p, q = self.preemption, self.queue
        if Trigger.KV_GROWTH_FAILS not in p.triggers:
            raise _fail("preemption.triggers", [t.value for t in p.triggers],
                        "a list with kv_growth_fails when scheduler is sglang (SGLang always retracts when decode "
                        "runs out of KV)")
        if q.order not in (QueueOrder.FCFS, QueueOrder.PRIORITY):
            raise _fail("queue.order", q.order.value, "fcfs or priority when scheduler is sglang "
                        "(priority: --enable-priority-scheduling; the order within is sglang.schedule_policy)")
        allowed = (Victim.FEWEST_GENERATED, Victim.LOWEST_PRIORITY) if q.uses_priority else (Victim.FEWEST_GENERATED,)
        if p.victim not in allowed:
            raise _fail("preemption.victim", p.victim.value, " or ".join(v.value for v in allowed)
                        + " when scheduler is sglang (--retraction-policy length or priority)")
        page = self.kv.block_size
        if self.chunking.enabled and self.batch.max_num_batched_tokens % page:
            raise _fail("batch.max_num_batched_tokens", self.batch.max_num_batched_tokens,
                        f"a multiple of kv.block_size={page} when scheduler is sglang (SGLang refuses a "
                        "--chunked-prefill-size that is not a multiple of --page-size)")
        if not self.chunking.enabled and self.batch.max_num_batched_tokens < self.max_model_len + self.sglang.max_prefill_tokens:
            raise _fail("batch.max_num_batched_tokens", self.batch.max_num_batched_tokens,
                        f">= max_model_len + sglang.max_prefill_tokens = "
                        f"{self.max_model_len + self.sglang.max_prefill_tokens} when scheduler is sglang and "
                        "chunking.enabled is false: without chunking a prefill batch takes its first request whole "
                        "and others up to max_prefill_tokens")

    # Derived facts, computed from the fields above (never stored twice).
    @property
    def step_token_bound(self) -> int:
        """Most tokens one step schedules: the step budget; under SGLang's rules max_num_batched_tokens is the
        prefill batch's chunk budget, and a decode batch runs every running request (max_num_seqs) beside it."""
        b = self.batch
        if self.scheduler is Scheduler.SGLANG:
            return max(b.max_num_batched_tokens, b.max_num_seqs)
        return b.max_num_batched_tokens

    @property
    def preempts_on_growth(self) -> bool:
        return Trigger.KV_GROWTH_FAILS in self.preemption.triggers

    @property
    def preempts_on_inversion(self) -> bool:
        return Trigger.PRIORITY_INVERSION in self.preemption.triggers


def _shown(value: object) -> object:
    if isinstance(value, StrEnum):
        return value.value
    if isinstance(value, bool):
        return str(value).lower()
    return "null" if value is None else value


def policy_json_schema() -> dict:
    return Policy.model_json_schema()
