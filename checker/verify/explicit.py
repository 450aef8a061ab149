"""Bounded verification of policies with prefix caching by explicit-state search on the engine.

The Z3 encoding does not model block identity (checker/smt/encode.py ``require_encodable``), so a policy with
``kv.prefix_caching.enabled`` is checked here instead: the engine's own step (checker.semantics.step) is run
over every environment choice of a small finite instance, breadth-first by depth.

The instance: at most N requests within K iterations of a fixed clock (iteration k starts at k * step_us, as
in checker/verify/replay.py). At each iteration any number of the requests not yet arrived arrive, in
arrival order (request i is the i-th to arrive: the Z3 environment's symmetry breaking), each with one choice
from a finite domain derived from the policy (``ExplicitEnvironment``): a prompt length, an output length, a
declared max output, a prompt identity (its own tokens, prefix group 0 or 1, or group 0 from its second block:
the same tokens after a different prefix), a priority and a tenant; and (with cancellations) any set of the
arrived requests still waiting or running is cancelled. A request that never arrives stays PENDING, so the
N-request search covers every smaller number too.

States reached by different choices are merged when they are equal: the fingerprint holds every mutable
field of every request (block table included), the queues in order, the counters, and the block pool's
content (free queue in order, reference counts, hashes, cached blocks per hash in order, the next block id),
plus each arrived request's fixed parameters and prompt identity, plus what the step scheduled, produced and
preempted, plus the frames the checked invariants can still look back at. Equal fingerprints step identically
under every later choice and give the same frames, so the merge is exact; invariants whose look-back is not
known here (user invariants, tenant_fairness) keep the whole history in the fingerprint.

With the catalogue's invariants (``_LOOKBACK``) three more reductions apply, each exact for them: identities and
output lengths are chosen lazily, when the step first reads them (``Search``); a request dead for longer than
the invariants look back is fingerprinted without its parameters; a state in which every request has arrived
and none is live is not expanded further. tests/quality/test_cache_verify.py pins the search, with and without
them, to replaying every instance of a small domain on the engine.

The search runs for n = 1, 2, ... N requests, each depth by depth, so the first violation found is minimal
(fewest requests, then fewest iterations). It is replayed on the engine with the verifier's fixed clock and
saved with the counterexample writer; any disagreement is a bug in batchcheck (InternalError).
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from enum import IntEnum
from pathlib import Path

from checker.errors import InternalError
from checker.frames import Frame, TraceContext, frame_from_engine, params_from_engine
from checker.policy import Allocation, Policy, QueueOrder, Scheduler
from checker.requests import IDENTITIES, Identity, RequestSpec, identity_content, identity_name
from checker.semantics.blockpool import BlockPool
from checker.semantics import sglang
from checker.semantics.state import FIELDS, Request, SchedulerState, Status
from checker.semantics.step import step
from checker.smt.ops import IntOps
from checker.verify import counterexample as cex
from checker.verify.env import Environment
from checker.verify.replay import first_violation, replay_fixed_clock
from checker.verify.run import Checked, Verdict, save_counterexample
from invariants.catalogue import CATALOGUE, Invariant

METHOD = "explicit-state search on the engine"
NO_PROOF_SGLANG = ("--unbounded: no proof method covers SGLang's rules yet (the z3 encoding and the induction are "
                   "of the vLLM rules), so this stays a bounded check")
NO_PROOF = ("--unbounded: no proof method covers the prefix cache yet (the z3 encoding and the induction do "
            "not model block identity), so this stays a bounded check")

# ----------------------------------------------------------------------------------------- the domains
# The prompt identities (own tokens, prefix groups 0 and 1, group 0 from its second block) are defined in
# checker.requests, which the liveness explorer shares: IDENTITIES, identity_name, identity_content.


@dataclass(frozen=True)
class Choice:
    """What one arriving request is: one point of the finite domain."""

    prompt: int
    output: int
    max_output: int
    priority: int
    tenant: int
    identity: Identity


@dataclass(frozen=True)
class ExplicitEnvironment(Environment):
    """The Z3 environment's bounds with the finite domains the explicit-state search enumerates."""

    prompts: tuple[int, ...] = ()
    prompt_why: tuple[str, ...] = ()  # what each prompt length is, e.g. "1 block"
    outputs: tuple[int, ...] = ()
    max_outputs: tuple[str, ...] = ("output",)  # "output" and/or "cap" (the declared max output)
    identities: tuple[Identity, ...] = IDENTITIES
    search_priorities: tuple[int, ...] = (0,)
    search_tenants: int = 1

    def choices(self) -> list[Choice]:
        out = []
        for prompt, output, cap, prio, tenant, ident in itertools.product(
                self.prompts, self.outputs, self.max_outputs, self.search_priorities, range(self.search_tenants),
                self.identities):
            max_out = output if cap == "output" else max(output, self.max_output_cap)
            choice = Choice(prompt, output, max_out, prio, tenant, ident)
            if choice not in out:
                out.append(choice)
        return out

    def domains(self) -> str:
        prompts = ", ".join(f"{p} ({why})" for p, why in zip(self.prompts, self.prompt_why))
        caps = " or ".join("= output" if c == "output" else str(self.max_output_cap) for c in self.max_outputs)
        return (f"prompts {{{prompts}}} tokens, outputs {{{', '.join(map(str, self.outputs))}}} tokens, "
                f"declared max output {caps}, prompt identities {{{', '.join(map(identity_name, self.identities))}}}, "
                f"priorities {{{', '.join(map(str, self.search_priorities))}}}, {self.search_tenants} tenant(s)")

    def describe(self) -> list[str]:
        return [
            f"{self.requests} requests, {self.depth} iterations of {self.step_us / 1000:g} ms each; a request "
            "arrives at any iteration (or never), requests numbered in arrival order",
            f"{METHOD} (the step itself, breadth-first, equal states merged, block pool content included): "
            + self.domains() + f" ({len(self.choices())} choices per request)",
            "a client may cancel a waiting or running request at any iteration from its arrival on"
            if self.cancellations else "no cancellations",
        ]

    def as_dict(self) -> dict:
        return {**super().as_dict(), "method": METHOD, "prompt_choices": list(self.prompts),
                "output_choices": list(self.outputs),
                "max_output_choices": ["output" if c == "output" else self.max_output_cap for c in self.max_outputs],
                "prompt_identities": [identity_name(i) for i in self.identities],
                "priority_choices": list(self.search_priorities), "tenant_choices": self.search_tenants}


def reads_priority(policy: Policy) -> bool:
    return policy.queue.uses_priority or policy.preemption.victim.value == "lowest_priority"


# invariants that read a request's priority or tenant (the others never look at them)
_READ_PRIORITY = {"priority_inversion", "degradation_order"}
_READ_TENANT = {"tenant_fairness"}


def longest_prompt(policy: Policy) -> int:
    """The longest prompt the policy admits to its queue: max_model_len - 1; under SGLang's rules, less SGLang's
    arrival margin below min(context, pool) - 1 (checker.semantics.sglang.arrival)."""
    if policy.scheduler is Scheduler.SGLANG:
        return sglang.longest_prompt(policy)
    return policy.max_model_len - 1


def explicit_environment(policy: Policy, env: Environment, invariants: list[Invariant]) -> ExplicitEnvironment:
    """The finite domains for ``env``'s bounds: prompt lengths at the policy's block and pool boundaries (one
    block, one block and a token, two blocks, a share that fills the pool with N requests, the pool less one
    token, the pool and a token; those the model takes), within ``--prompt-range`` (plus its ends) when one
    is given; outputs 1, 2 and the range's top (2K by default, beyond the horizon); priorities and tenants only
    where the policy or an invariant reads them."""
    kv = policy.kv
    size, pool, top = kv.block_size, kv.num_blocks, longest_prompt(policy)
    named = [(size, "1 block"), (size + 1, "1 block + 1 token"), (2 * size, "2 blocks"),
             ((pool // env.requests) * size,
              f"fills the pool with {env.requests} request{'s' if env.requests > 1 else ''}"),
             (pool * size - 1, "the pool less 1 token"), (pool * size + 1, "the pool + 1 token")]
    if any(p > top for p, _ in named):
        named.append((top, "the longest prompt the model takes"))
    lo, hi = env.prompt
    given = env.prompt != (1, policy.max_model_len)
    if given:
        named += [(lo, "the range's low end"), (hi, "the range's high end")]
    prompts: dict[int, str] = {}
    for p, why in named:
        if lo <= p <= hi and 1 <= p and (given or p <= top) and p not in prompts:
            prompts[p] = why
    if not prompts:
        prompts = {lo: "the range's low end", hi: "the range's high end"}
    lo_o, hi_o = env.output
    outputs = sorted({o for o in (1, 2, hi_o) if lo_o <= o <= hi_o} | {lo_o})
    full = kv.allocation is Allocation.FULL_RESERVATION or policy.admission.reject_never_fits
    caps = ("output", "cap") if full and env.max_output_cap > min(outputs) else ("output",)
    known = {inv.name for inv in invariants if CATALOGUE.get(inv.name) is inv}
    user = any(CATALOGUE.get(inv.name) is not inv for inv in invariants)
    priorities = env.priorities if reads_priority(policy) or user or known & _READ_PRIORITY else (0,)
    tenants = env.tenants if policy.queue.order is QueueOrder.TENANT_FAIR or user or known & _READ_TENANT else 1
    ordered = sorted(prompts)
    base = {f.name: getattr(env, f.name) for f in dataclasses.fields(Environment)}
    # without a prefix cache (SGLang's rules with the radix cache disabled) no rule reads a prompt's tokens
    identities = IDENTITIES if kv.prefix_caching.enabled or policy.sglang.radix_cache else IDENTITIES[:1]
    return ExplicitEnvironment(**base, prompts=tuple(ordered), prompt_why=tuple(prompts[p] for p in ordered),
                               outputs=tuple(outputs), max_outputs=caps, identities=identities,
                               search_priorities=tuple(priorities), search_tenants=tenants)


# ----------------------------------------------------------------------------------------- look-back
# An invariant is in this table only if (read off invariants/catalogue.py) its check and its trigger
# - read frames t-L..t and nothing earlier (t itself they may read: the fingerprint holds the step number);
# - read a request's fixed parameters (prompt, priority, tenant, arrival) only while it is live (waiting,
#   running, holding KV) or in the frame where it stops being live: a request finished, rejected or cancelled,
#   holding nothing, for more than L frames then needs no parameters in the fingerprint;
# - never read its output length, its declared max output (but under full reservation, where choices are not
#   lazy) or its prompt identity (the pool's facts read that, once the step has read it): lazy choices;
# - cannot change value on a state in which every request is dead and none can arrive (nothing changes there
#   but the clock): such states are not expanded.
_LOOKBACK: dict[str, Callable[[dict[str, int]], int]] = {
    "kv_never_overcommitted": lambda p: 0, "token_budget": lambda p: 0, "seq_cap": lambda p: 0,
    "request_conservation": lambda p: 0, "sglang_memory_identity": lambda p: 0, "scheduled_requests_run": lambda p: 0, "block_pool_conservation": lambda p: 0,
    "no_referenced_block_reused": lambda p: 0, "hit_only_on_identical_chain": lambda p: 0,
    "bounded_preemptions": lambda p: 0, "work_conserving": lambda p: 0, "bounded_preemptions_per_step": lambda p: 0,
    "preemption_frees_capacity": lambda p: 0, "lookahead_fits": lambda p: 0,
    # frame t, and frame t - steps's now_us, which is (t - steps) * step_us on the fixed clock
    "bounded_starvation": lambda p: 0,
    "cancellation_releases": lambda p: max(p["steps"], 1),  # its trigger reads frame t - 1
    "decode_progress": lambda p: p["gap"], "degradation_order": lambda p: p["gap"],
    "no_deadlock": lambda p: max(p["steps"] - 1, 0), "priority_inversion": lambda p: 1,
}  # tenant_fairness looks back to frame 0 and reads finished requests' prompts: not here


def lookback(inv: Invariant, params: dict[str, int]) -> int | None:
    """How many frames before frame t the invariant reads (see _LOOKBACK); None when not known (user
    invariants, tenant_fairness): the whole history then stays in the fingerprint."""
    if CATALOGUE.get(inv.name) is not inv or inv.name not in _LOOKBACK:
        return None
    return _LOOKBACK[inv.name]({**inv.defaults, **params})


# ----------------------------------------------------------------------------------------- fingerprints
_REQ_FIXED = {"spec", "chain", "rid", "arrival_us", "prompt_len", "output_len", "max_output", "priority", "tenant"}
_REQ_FIELDS = tuple(a for a in Request.__slots__ if a not in _REQ_FIXED)  # chain: derived from the spec
_POOL_FIXED = {"block_size", "num_blocks", "chained", "chains", "true_chains"}  # interning tables: shared
_POOL_FIELDS = tuple(a for a in BlockPool.__slots__ if a not in _POOL_FIXED)
_STATE_SKIP = {"policy", "requests", "pool"}
# What the fast fingerprint below reads by name; if the semantics gains a field, the generic one is used.
_FAST_REQ = ("status", "reason", "num_computed", "num_generated", "blocks", "swapped_blocks", "admitted_seq",
             "requeue_seq", "num_preemptions", "release_step", "block_ids", "num_cached_blocks", "transfer_step")
_FAST_POOL = ("uncached_free", "lru", "refs", "hash_of", "cached", "next_id", "evictions", "truth")
_FAST_STATE = ("running", "waiting", "holding", "holders", "loads_in_flight", "kv_used", "swap_used", "next_seq",
               "step", "tenant_counters", "sglang", "spec", "pipe", "blocked")
_FAST = set(_REQ_FIELDS) == set(_FAST_REQ) and set(_POOL_FIELDS) == set(_FAST_POOL)
_TERMINAL = (Status.FINISHED, Status.REJECTED, Status.CANCELLED)


def _freeze(v: object) -> object:
    """A hashable value equal for equal values (dicts in insertion order: exact, whatever order they are read in)."""
    t = type(v)
    if t is int or t is bool or t is str or v is None:
        return v
    if t is list or t is tuple:
        return tuple(_freeze(x) for x in v)  # type: ignore[union-attr]
    if t is dict:
        return tuple((k, _freeze(x)) for k, x in v.items())  # type: ignore[union-attr]
    if t is frozenset or t is set:
        return frozenset(_freeze(x) for x in v)  # type: ignore[union-attr]
    if isinstance(v, Request):
        return ("request", v.rid)
    if isinstance(v, IntEnum):
        return int(v)
    if isinstance(v, tuple):  # a NamedTuple
        return tuple(_freeze(x) for x in v)
    if dataclasses.is_dataclass(v):
        return tuple(_freeze(getattr(v, f.name)) for f in dataclasses.fields(v))
    snapshot = getattr(v, "snapshot", None)
    if snapshot is not None:  # a section of the state (SGLang's, speculative, pipeline): its own exact snapshot
        return (t.__name__, snapshot())
    raise InternalError(f"explicit-state search: no exact fingerprint for a {t.__name__} in the scheduler state")


def _spec_key(spec: RequestSpec) -> tuple:
    return (spec.arrival_us, spec.prompt_len, spec.output_len, spec.max_output, spec.priority, spec.tenant,
            spec.cls, spec.cancel_us, spec.content, spec.external_tokens, spec.load_steps, spec.send_steps,
            spec.ignore_eos)


def is_dead(r: Request) -> bool:
    """Finished, rejected or cancelled, holding nothing: the step never reads it again."""
    return r.status in _TERMINAL and not r.blocks and not r.swapped_blocks and r.release_step == -1


def state_fingerprint(s: SchedulerState, forget: frozenset[int] = frozenset()) -> tuple:
    """Everything the step reads from the state, exactly (see the module docstring); the fixed parameters
    of the requests in ``forget`` (dead long enough for every checked invariant) are left out."""
    if _FAST and set(vars(s)) - _STATE_SKIP == set(_FAST_STATE):
        return fast_fingerprint(s, forget)
    reqs = tuple((None if r.rid in forget else _spec_key(r.spec), *(_freeze(getattr(r, a)) for a in _REQ_FIELDS))
                 for r in s.requests)
    rest = tuple((k, _freeze(v)) for k, v in vars(s).items() if k not in _STATE_SKIP)
    pool = None if s.pool is None else tuple(_freeze(getattr(s.pool, a)) for a in _POOL_FIELDS)
    return reqs, rest, pool


def fast_fingerprint(s: SchedulerState, forget: frozenset[int] = frozenset()) -> tuple:
    """state_fingerprint for the fields the semantics has today, by name (the same information)."""
    reqs = tuple((None if r.rid in forget else _spec_key(r.spec), r.status, r.reason, r.num_computed,
                  r.num_generated, r.blocks, r.swapped_blocks, r.admitted_seq, r.requeue_seq, r.num_preemptions,
                  r.release_step, tuple(r.block_ids), r.num_cached_blocks, r.transfer_step) for r in s.requests)
    rest = (tuple([r.rid for r in s.running]), tuple([r.rid for r in s.waiting]),
            tuple([r.rid for r in s.holding]), tuple([r.rid for r in s.holders]), s.loads_in_flight, s.kv_used,
            s.swap_used, s.next_seq, s.step, tuple(s.tenant_counters),
            None if s.sglang is None else s.sglang.snapshot(), None if s.spec is None else s.spec.snapshot(),
            None if s.pipe is None else s.pipe.snapshot(),
            None if s.blocked is None else tuple(sorted(s.blocked.items())))
    p = s.pool
    if p is None:
        return reqs, rest, None
    # evictions is left out: the step only counts it (the frames do not read it either)
    return reqs, rest, (p.uncached_free, tuple(p.lru), tuple(p.refs.items()), tuple(p.hash_of.items()),
                        tuple(p.cached), tuple(map(tuple, p.cached.values())), p.next_id,
                        tuple(p.truth.items()))


def frame_key(f: Frame) -> tuple:
    return tuple(_freeze(getattr(f, name.name)) for name in dataclasses.fields(f))


# ----------------------------------------------------------------------------------------- the search
class _Timeout(Exception):
    """The search stops: the time ran out, or the state limit (memory) was reached."""


# Distinct states one search may hold (about 5 KB each on small pools: a few GB at most); beyond it, UNKNOWN.
MAX_STATES = 750_000


class _Node:
    """A distinct state at some depth, with the path that reached it. ``sig`` determines the node's frame
    (the state after the step and what the step scheduled, produced and preempted); ``dead_at[i]`` is the
    depth at which request i died (-1: not dead); ``lazy[i]`` what is still open about request i's choice."""

    __slots__ = ("parent", "arrivals", "cancels", "frames", "state", "arrived", "sig", "dead_at", "lazy")

    def __init__(self, parent: _Node | None, arrivals: tuple[RequestSpec, ...], cancels: tuple[int, ...],
                 frames: tuple[Frame, ...], state: SchedulerState | None, arrived: int, sig: tuple,
                 dead_at: tuple[int, ...], lazy: tuple[tuple[bool, int], ...]):
        self.parent, self.arrivals, self.cancels = parent, arrivals, cancels
        self.frames, self.state, self.arrived, self.sig, self.dead_at = frames, state, arrived, sig, dead_at
        self.lazy = lazy


@dataclass
class _Target:
    inv: Invariant
    params: dict[str, int]
    back: int | None
    triggered: bool = False
    found: _Node | None = None
    found_specs: list[RequestSpec] = field(default_factory=list)
    found_at_s: float = 0.0
    found_after: tuple[int, int] = (0, 0)  # states and steps searched when it was found


@dataclass
class SearchResult:
    timed_out: bool
    requests_done: int  # request counts searched to the full depth
    depth_done: int  # depth completed with requests_done + 1 requests (when timed out)
    states: int  # distinct states (sum over depths and request counts)
    transitions: int  # steps run
    seconds: float
    targets: list[_Target] = field(default_factory=list)
    lazy: str = ""  # which choices were made lazily
    cut: str = ""  # why the search stopped early (timed_out): "timeout" or the state limit


# A request's open choices (lazy): (its identity still open, its output's lower bound): the output is one of
# the domain's outputs above the bound; -1: decided. Decided, all of them: (False, -1).
DECIDED = (False, -1)
NEUTRAL: Identity = None  # the identity a request has until the step reads its tokens: its own


class Search:
    """Breadth-first search of one instance. Lazy choices (``reduce``): a request arrives with its own
    tokens and the longest output, and its identity is chosen when the step first reads its tokens (its
    hash chain: the step is run again from the same state with each identity), its output length when it
    produces a token that ends one of the shorter outputs (run again with that output). Before that, the
    step's result is the same whatever the choice, so this explores the same behaviours as choosing on
    arrival, with far fewer states. Only with invariants of _LOOKBACK, which never read a request's output,
    declared max output or identity (the identity reaches them through the pool's facts, computed after the
    choice)."""

    def __init__(self, policy: Policy, env: ExplicitEnvironment, targets: list[_Target], deadline: float,
                 progress: Callable[[str], None] | None = None, reduce: bool = True):
        self.policy, self.env, self.targets, self.deadline, self.progress = policy, env, targets, deadline, progress
        self.states = 0
        self.transitions = 0
        backs = [t.back for t in targets]
        self.back: int | None = None if None in backs else max(b for b in backs if b is not None)
        vetted = reduce and self.back is not None
        self.forget_dead = vetted
        self.lazy_identity = vetted and len(env.identities) > 1 and NEUTRAL in env.identities
        self.lazy_output = vetted and len(env.outputs) > 1 and env.max_outputs == ("output",)
        self.longest = max(env.outputs)
        self.outputs = frozenset(env.outputs)
        eager = []
        for ch in env.choices():
            ch = dataclasses.replace(
                ch, identity=NEUTRAL if self.lazy_identity else ch.identity,
                output=self.longest if self.lazy_output else ch.output,
                max_output=self.longest if self.lazy_output else ch.max_output)
            if ch not in eager:
                eager.append(ch)
        self.choices = eager
        self.arrive_lazy = (self.lazy_identity, 0 if self.lazy_output else -1)
        self._specs: dict[tuple[int, int, int], RequestSpec] = {}
        self._replaced: dict[tuple, RequestSpec] = {}
        self.max_states = MAX_STATES
        self.started = time.monotonic()

    def describe_lazy(self) -> str:
        what = [w for w, on in (("identities", self.lazy_identity), ("output lengths", self.lazy_output)) if on]
        return (" and ".join(what) + " chosen when the step first reads them") if what else ""

    def spec(self, rid: int, k: int, c: int) -> RequestSpec:
        key = (rid, k, c)
        spec = self._specs.get(key)
        if spec is None:
            ch = self.choices[c]
            spec = self._specs[key] = RequestSpec(
                rid=rid, arrival_us=k * self.env.step_us, prompt_len=ch.prompt, output_len=ch.output,
                max_output=ch.max_output, priority=ch.priority, tenant=ch.tenant, cls=0,
                content=identity_content(ch.identity, ch.prompt, self.policy.kv.block_size))
        return spec

    def placeholders(self, n: int) -> list[RequestSpec]:
        """Requests not yet arrived: PENDING, with the Z3 environment's 'never' arrival (the horizon)."""
        never = self.env.depth * self.env.step_us
        return [RequestSpec(rid=i, arrival_us=never, prompt_len=1, output_len=1, max_output=1) for i in range(n)]

    def moves(self, node: _Node, n: int, k: int) -> Iterator[tuple[tuple[RequestSpec, ...], tuple[int, ...]]]:
        s = node.state
        assert s is not None
        m = node.arrived
        live = (Status.WAITING, Status.SWAPPED, Status.RUNNING)
        old = [r.rid for r in s.requests[:m] if r.status in live] if self.env.cancellations else []
        for j in range(n - m + 1):
            for combo in itertools.product(range(len(self.choices)), repeat=j):
                arrivals = tuple(self.spec(m + i, k, c) for i, c in enumerate(combo))
                cancellable = old + ([m + i for i in range(j)] if self.env.cancellations else [])
                for size in range(len(cancellable) + 1):
                    for cancels in itertools.combinations(cancellable, size):
                        yield arrivals, cancels

    def successors(self, base: SchedulerState, lazy: tuple[tuple[bool, int], ...], arrivals: tuple[RequestSpec, ...],
                   cancels: tuple[int, ...], now: int):
        """The step from ``base`` under these events, once per way of making the choices it reads:
        (state after, decision, open choices after)."""
        block_size = self.policy.kv.block_size
        todo: deque[dict[tuple[int, str], int | Identity]] = deque([{}])  # (request, what) -> value
        while todo:  # in order: the first identity (own tokens) and the first output are tried first
            assign = todo.popleft()
            s = base.copy()
            reqs = s.requests
            arrived = []
            for spec in arrivals:
                r = Request(spec)
                reqs[spec.rid] = r
                arrived.append(r)
            lz = list(lazy)
            for spec in arrivals:
                lz[spec.rid] = self.arrive_lazy
            for (rid, what), value in assign.items():
                r = reqs[rid]
                ident_open, lb = lz[rid]
                if what == "identity":
                    r.spec = self._with(r.spec, "content", identity_content(value, r.prompt_len, block_size))
                    r.chain = []
                    lz[rid] = (False, lb)
                elif what == "output":
                    r.spec = self._with(self._with(r.spec, "output_len", value), "max_output", value)
                    r.output_len = r.max_output = value
                    lz[rid] = (ident_open, -1)
                else:  # "above": longer than value
                    lz[rid] = (ident_open, self._bound(value))
            for rid, (ident_open, _) in enumerate(lz):
                if ident_open:
                    reqs[rid].chain = []  # so that a read shows (Request.copy shares the list)
            d = step(s, arrived, [reqs[i] for i in cancels], now)
            seen = [rid for rid, (ident_open, _) in enumerate(lz) if ident_open and reqs[rid].chain]
            if seen:  # the step read these requests' tokens: run it again with each other identity
                for combo in itertools.product(self.env.identities, repeat=len(seen)):
                    if any(ident != NEUTRAL for ident in combo):
                        todo.append({**assign, **{(rid, "identity"): ident for rid, ident in zip(seen, combo)}})
                for rid in seen:  # this run is the one in which they all have the neutral identity (own tokens)
                    lz[rid] = (False, lz[rid][1])
            ends = [rid for rid in d.produced if lz[rid][1] != -1 and reqs[rid].num_generated in self.outputs
                    and lz[rid][1] < reqs[rid].num_generated < self.longest]
            for mask in itertools.product((True, False), repeat=len(ends)):
                if any(mask):  # these stop at this token: run it again with that output
                    todo.append({**assign, **{(rid, "output" if stop else "above"): reqs[rid].num_generated
                                              for rid, stop in zip(ends, mask)}})
            for rid in ends:  # and this run: each goes on past this token
                lz[rid] = (lz[rid][0], self._bound(reqs[rid].num_generated))
            yield s, d, tuple(lz)

    def _with(self, spec: RequestSpec, name: str, value: object) -> RequestSpec:
        key = (spec, name, value)
        out = self._replaced.get(key)
        if out is None:
            out = self._replaced[key] = dataclasses.replace(spec, **{name: value})
        return out

    def _bound(self, above: int) -> int:
        """The open-output marker for 'longer than above' (-1 once only the longest output is left)."""
        return above if any(above < o < self.longest for o in self.outputs) else -1

    def run(self, n: int, on_depth: Callable[[int, int], None]) -> None:
        """Search with at most n requests, depth by depth; record the first violation of each target."""
        env, policy, back = self.env, self.policy, self.back
        root = SchedulerState(policy, self.placeholders(n), num_tenants=env.tenants)
        fingerprint = fast_fingerprint if _FAST and set(vars(root)) - _STATE_SKIP == set(_FAST_STATE) else \
            state_fingerprint
        layer = [_Node(None, (), (), (), root, 0, (), (-1,) * n, (DECIDED,) * n)]
        expanded: list[list[_Node]] = []
        for k in range(env.depth):
            now = k * env.step_us
            nxt: dict[tuple, _Node] = {}
            count = 0
            for node in layer:
                base = node.state
                assert base is not None
                dead_at = node.dead_at
                forget = frozenset() if not self.forget_dead else frozenset(
                    i for i, at in enumerate(dead_at) if at != -1 and at <= k - (back or 0) - 1)
                history: tuple = ()
                if back is None or back > 0:  # the signatures of the frames the invariants may look back at
                    history = _history(node, back)
                for arrivals, cancels in self.moves(node, n, k):
                    for s, d, lz in self.successors(base, node.lazy, arrivals, cancels, now):
                        count += 1
                        if not count & 63 and time.monotonic() > self.deadline:
                            self.transitions += count
                            raise _Timeout("timeout")
                        open_ = tuple([DECIDED if i in forget else x for i, x in enumerate(lz)]) if forget else lz
                        sig = (fingerprint(s, forget), open_, d.scheduled, d.produced, d.preempted)
                        key = (sig, history)
                        if key in nxt:
                            continue
                        if self.states + len(nxt) >= self.max_states:
                            self.transitions += count
                            raise _Timeout(f"state limit ({self.max_states:,} states)")
                        reqs = s.requests
                        died = tuple([at if at != -1 or not is_dead(reqs[i]) else k for i, at in enumerate(dead_at)])
                        frames = node.frames + (frame_from_engine(s, d),)
                        nxt[key] = _Node(node, arrivals, cancels, frames, s, node.arrived + len(arrivals), sig, died,
                                         lz)
                node.state = None  # expanded: only the path is kept
            self.transitions += count
            self.states += len(nxt)
            expanded.append(layer)
            if back is not None and len(expanded) >= max(back, 1):  # signatures no later key reads (memory)
                for old in expanded[-max(back, 1)]:
                    old.sig = ()
            layer = list(nxt.values())
            self.evaluate(layer, k)
            if self.forget_dead:  # every request arrived and none is live: nothing changes any more, and no
                # invariant of _LOOKBACK can newly fail or fire on the same frame again (pruned once evaluated)
                layer = [x for x in layer if x.arrived < n or not all(is_dead(r) for r in x.state.requests)]
            on_depth(n, k + 1)
            if all(t.found is not None for t in self.targets):
                return

    def evaluate(self, layer: list[_Node], t: int) -> None:
        open_ = [x for x in self.targets if x.found is None]
        for node in layer:
            s = node.state
            assert s is not None
            ctx = TraceContext(self.policy, params_from_engine(s), list(node.frames))
            for target in open_:
                if target.found is None and not target.inv.holds(IntOps, ctx, t, target.params):
                    target.found = node
                    target.found_specs = [r.spec for r in s.requests[:node.arrived]]
                    target.found_at_s = time.monotonic() - self.started
                    target.found_after = (self.states, self.transitions)
                if not target.triggered and target.inv.triggered(IntOps, ctx, t, target.params):
                    target.triggered = True


def _history(node: _Node, back: int | None) -> tuple:
    """The signatures of the node's last ``back`` frames (all of them when None)."""
    sigs = []
    cur: _Node | None = node
    while cur is not None and cur.parent is not None and (back is None or len(sigs) < back):
        sigs.append(cur.sig)
        cur = cur.parent
    return tuple(sigs)


def search(policy: Policy, env: ExplicitEnvironment, invariants: list[tuple[Invariant, dict[str, int]]],
           timeout_s: float, progress: Callable[[str], None] | None = None, reduce: bool = True) -> SearchResult:
    """Search with 1, 2, ... env.requests requests, each up to env.depth iterations, until every invariant is
    violated or the bounds (or the time) run out."""
    started = time.monotonic()
    targets = [_Target(inv, params, lookback(inv, params)) for inv, params in invariants]
    srch = Search(policy, env, targets, started + timeout_s, progress, reduce)
    done, depth_done = 0, 0

    def on_depth(n: int, k: int) -> None:
        nonlocal depth_done
        depth_done = k
        if progress is not None:
            progress(f"{METHOD}: {n} request(s), depth {k}/{env.depth}, {srch.states:,} states, "
                     f"{time.monotonic() - started:.0f} s")

    timed_out, cut = False, ""
    try:
        for n in range(1, env.requests + 1):
            depth_done = 0
            srch.run(n, on_depth)
            done = n
            if all(t.found is not None for t in targets):
                break
    except _Timeout as stop:
        timed_out, cut = True, str(stop)
    return SearchResult(timed_out, done, depth_done, srch.states, srch.transitions, time.monotonic() - started,
                        targets, srch.describe_lazy(), cut)


# ----------------------------------------------------------------------------------------- verdicts
@dataclass
class ExplicitChecked(Checked):
    """A verdict of the explicit-state search (its line names the method and the finite domains)."""

    domains: str = ""
    states: int = 0
    transitions: int = 0
    unbounded: bool = False
    no_proof: str = NO_PROOF  # why --unbounded stays a bounded check here
    requests_done: int = 0  # UNKNOWN: request counts searched to the full depth
    cut: str = "timeout"  # UNKNOWN: why the search stopped

    def line(self) -> str:
        e = self.env
        size = f"{self.states:,} states, {self.transitions:,} steps"
        if self.verdict is Verdict.VIOLATED:
            detail = (f"{self.requests} request(s), fails at iteration {self.violation_step}; minimal: no violation "
                      f"with fewer requests up to depth {e.depth}, none shorter with {self.requests} ({METHOD}: "
                      f"{self.domains}; {size}); replayed on the engine: {self.counterexample}")
        elif self.verdict is Verdict.HOLDS_UP_TO:
            detail = (f"{e.requests} requests, {e.depth} iterations (bounded check, not a proof; {METHOD}: "
                      f"{self.domains}; {size})")
        elif self.verdict is Verdict.VACUOUS:
            detail = (f"its situation never occurs within {e.requests} requests, {e.depth} iterations ({METHOD}: "
                      f"{self.domains}; {size}), so nothing was checked")
        else:
            done = self.requests_done
            searched = [f"with up to {done} request(s) to depth {e.depth}"] if done else []
            if done < e.requests:
                searched.append(f"with {done + 1} request(s) to depth {self.depth}")
            detail = f"{self.cut}; no violation {' and '.join(searched)} ({METHOD}: {self.domains}; {size})"
        if self.unbounded and self.verdict is not Verdict.VIOLATED:
            detail += f"; {self.no_proof}"
        return f"{self.verdict.value:<12} {self.label:<40} {detail}  [{self.seconds:.2f} s]"

    def as_dict(self) -> dict:
        return {**super().as_dict(), "method": METHOD, "domains": self.domains, "states": self.states,
                "steps": self.transitions, **({"unbounded": self.no_proof} if self.unbounded else {})}


def check_many(policy: Policy, policy_file: str | None, invariants: list[tuple[Invariant, dict[str, int]]],
               env: Environment, timeout_s: float, out_dir: Path | None, unbounded: bool = False,
               progress: Callable[[str], None] | None = None) -> list[Checked]:
    """Verdicts for the invariants of a policy with prefix caching, from one shared search (``timeout_s`` per
    invariant: the search gets timeout_s times their number)."""
    xenv = env if isinstance(env, ExplicitEnvironment) else \
        explicit_environment(policy, env, [i for i, _ in invariants])
    result = search(policy, xenv, invariants, timeout_s * max(1, len(invariants)), progress)
    domains = xenv.domains() + (f"; {result.lazy}" if result.lazy else "")
    out: list[Checked] = []
    for target in result.targets:
        common = dict(domains=domains, states=result.states, transitions=result.transitions, unbounded=unbounded,
                      no_proof=NO_PROOF if policy.kv.prefix_caching.enabled else NO_PROOF_SGLANG)
        inv, params = target.inv, target.params
        if target.found is not None:
            started = time.monotonic()
            specs, step_at = confirm(policy, xenv, target)
            frames = [_frame_dict(f, len(specs)) for f in _replay_frames(policy, xenv, specs, step_at + 1)]
            path = save_counterexample(policy, policy_file, inv, params, xenv, specs, step_at, frames, True, "",
                                       METHOD, out_dir)
            common.update(states=target.found_after[0], transitions=target.found_after[1])
            out.append(ExplicitChecked(inv, params, Verdict.VIOLATED, xenv,
                                       target.found_at_s + time.monotonic() - started, depth=step_at + 1,
                                       requests=len(specs), violation_step=step_at, counterexample=path, specs=specs,
                                       method=METHOD, **common))
        elif result.timed_out:
            out.append(ExplicitChecked(inv, params, Verdict.UNKNOWN, xenv, result.seconds, depth=result.depth_done,
                                       requests_done=result.requests_done, method=METHOD, cut=result.cut, **common))
        else:
            verdict = Verdict.HOLDS_UP_TO if target.triggered else Verdict.VACUOUS
            out.append(ExplicitChecked(inv, params, verdict, xenv, result.seconds, depth=xenv.depth, method=METHOD,
                                       **common))
    return out


def path_of(node: _Node) -> list[_Node]:
    path = []
    cur: _Node | None = node
    while cur is not None and cur.parent is not None:
        path.append(cur)
        cur = cur.parent
    return path[::-1]


def specs_of(node: _Node, specs: list[RequestSpec], step_us: int) -> list[RequestSpec]:
    """The requests of a path (their choices as the last state has them), each with its cancel time (the first
    iteration that cancelled it)."""
    out = list(specs)
    for k, n in enumerate(path_of(node)):
        for rid in n.cancels:
            if out[rid].cancel_us is None:
                out[rid] = dataclasses.replace(out[rid], cancel_us=k * step_us)
    return out


def _replay_frames(policy: Policy, env: Environment, specs: list[RequestSpec], steps: int) -> list[Frame]:
    return replay_fixed_clock(policy, specs, steps, env.step_us, env.tenants).frames


def confirm(policy: Policy, env: Environment, target: _Target) -> tuple[list[RequestSpec], int]:
    """Replay the path's requests on the engine with the fixed clock: it must fail at the same iteration,
    with the same frames (any difference is a bug in batchcheck)."""
    node = target.found
    assert node is not None
    specs = specs_of(node, target.found_specs, env.step_us)
    t = len(node.frames) - 1
    replay = replay_fixed_clock(policy, specs, t + 1, env.step_us, env.tenants)
    step_at = first_violation(target.inv, target.params, replay)
    diffs = [k for k, (mine, theirs) in enumerate(zip(node.frames, replay.frames))
             if _truncated_key(mine, len(specs)) != frame_key(theirs)]
    if diffs or step_at != t:
        raise InternalError(
            f"the engine's replay of an explicit-state counterexample to {target.inv.name} for policy {policy.name} "
            f"disagrees with the search: the search says it fails at iteration {t}, the replay says "
            f"{'it holds' if step_at is None else f'iteration {step_at}'}; frames differ at iterations {diffs[:5]}; "
            f"requests: {cex.requests_json(specs)}")
    return specs, t


def _truncated_key(f: Frame, m: int) -> tuple:
    """The frame as the replay of the path's m requests shows it: the search's never-arrived requests
    (PENDING, holding nothing, scheduled nothing) left out."""
    n = len(f.slots)
    for i in range(m, n):
        if f.slots[i]["status"] != int(Status.PENDING) or f.scheduled[i]:
            raise InternalError(f"explicit-state search: request {i} is not pending but did not arrive")
    cut = {}
    for fld in dataclasses.fields(f):
        v = getattr(f, fld.name)
        if fld.name in ("slots", "scheduled", "produced", "preempted"):
            v = v[:m]
        cut[fld.name] = v
    return frame_key(Frame(**cut))


def _frame_dict(f: Frame, m: int) -> dict:
    """A frame in the counterexample file's shape (the solver's frame_values)."""
    return {"now_us": f.now_us, "kv_used": f.kv_used,
            "requests": [{**{name: f.slots[i][name] for name in FIELDS}, "scheduled": f.scheduled[i],
                          "produced": bool(f.produced[i]), "preempted": bool(f.preempted[i])} for i in range(m)]}
