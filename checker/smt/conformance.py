"""Pinning the symbolic step to the engine's step: one state, one step, field by field.

``capture`` reads a SchedulerState (before a step) as plain ints; ``outputs_of_engine`` reads the state
after the engine's step; ``IntBackend`` / ``Z3Backend`` evaluate the symbolic step on the captured
inputs. A mismatch is a drift between the engine and the encoder: a bug in batchcheck.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from checker.policy import Policy
from checker.semantics.decision import StepDecision
from checker.semantics.state import FIELDS, Request, SchedulerState, Status
from checker.smt.encode import BLOCKED_FIELDS, CONNECTOR_FIELDS, SPEC_FIELDS, SlotParams, SlotState, StepResult, SymbolicStep, symbolic_step
from checker.smt.ops import IntOps, Z3Ops, bool_var, int_var, pin_and_eval
from checker.smt.pool import (POOL_FIELDS, Pool, PoolState, Shape, canonical_of_engine, canonical_of_values,
                              chained_code, empty_pool, identity_of, pool_from_engine, shape_for)

PARAM_FIELDS = ("arrival_us", "prompt_len", "output_len", "max_output", "priority", "tenant")
OUTPUT_NAMES = tuple(f"{f}" for f in FIELDS) + ("scheduled",)


@dataclass(frozen=True)
class Captured:
    """Everything one step reads, as plain ints."""

    params: tuple[tuple[int, ...], ...]  # per slot, PARAM_FIELDS
    slots: tuple[tuple[int, ...], ...]  # per slot, FIELDS
    next_seq: int
    step: int
    counters: tuple[int, ...]
    now_us: int
    cancels: tuple[bool, ...]
    # With a KV connector only (policy.connector; empty otherwise): per slot TRANSFER_PARAMS, per slot
    # CONNECTOR_FIELDS (load_seq: the place in s.holders, from 1), and the next load_seq
    transfer_params: tuple[tuple[int, ...], ...] = ()
    transfer_slots: tuple[tuple[int, ...], ...] = ()
    next_load: int = 1
    # With speculative decoding only (empty otherwise), per slot: the drafts it holds, the entry of its accepted list
    # its next verifying row reads (the environment's choice: 0 past the list's end), its verifying rows so far
    drafts: tuple[int, ...] = ()
    accepted: tuple[int, ...] = ()
    verifications: tuple[int, ...] = ()
    # With blocked waiting states only (policy.queue.blocked_waiting; empty otherwise), per slot: its grammar_steps,
    # and its ready_step (SchedulerState.blocked's entry; 0 where it has none: not blocked)
    grammar: tuple[int, ...] = ()
    ready: tuple[int, ...] = ()


TRANSFER_PARAMS = ("external_tokens", "load_steps", "send_steps")  # RequestSpec's, None (never) as -1


def transfer_params(spec) -> tuple[int, int, int]:
    """A request's connector fields as the encoding takes them (None, a transfer that never completes: -1)."""
    return (spec.external_tokens, -1 if spec.load_steps is None else spec.load_steps,
            -1 if spec.send_steps is None else spec.send_steps)


def capture(s: SchedulerState, cancels: list[Request], now_us: int) -> Captured:
    cancelled = {r.rid for r in cancels}
    base = Captured(
        params=tuple((r.arrival_us, r.prompt_len, r.output_len, r.max_output, r.priority, r.tenant)
                     for r in s.requests),
        slots=tuple(r.snapshot() for r in s.requests),
        next_seq=s.next_seq, step=s.step, counters=tuple(s.tenant_counters), now_us=now_us,
        cancels=tuple(r.rid in cancelled for r in s.requests))
    if s.spec is not None:
        base = replace(base, **_spec_inputs(s))
    if s.blocked is not None:
        base = replace(base, grammar=tuple(r.spec.grammar_steps for r in s.requests),
                       ready=tuple(s.blocked.get(r.rid, 0) for r in s.requests))
    if not s.policy.connector.enabled:
        return base
    seq = {r.rid: k + 1 for k, r in enumerate(s.holders)}
    return replace(base, transfer_params=tuple(transfer_params(r.spec) for r in s.requests),
                   transfer_slots=tuple((r.transfer_step, seq.get(r.rid, 0)) for r in s.requests),
                   next_load=len(s.holders) + 1)


def _spec_inputs(s: SchedulerState) -> dict[str, tuple[int, ...]]:
    """Speculative decoding's inputs to a step: drafts held, the acceptance each request's next verifying row reads
    (speculative.accepted), how many verifying rows it has had."""
    spec = s.spec
    drafts, accepted, counts = [], [], []
    for r in s.requests:
        n = spec.verified.get(r.rid, 0)
        given = spec.fed[r.rid] if r.rid in spec.fed else r.spec.accepted
        drafts.append(spec.drafts.get(r.rid, 0))
        accepted.append(given[n] if n < len(given) else 0)
        counts.append(n)
    return {"drafts": tuple(drafts), "accepted": tuple(accepted), "verifications": tuple(counts)}


def _spec_terms(result: StepResult, counts: tuple[int, ...], o) -> dict[str, object]:
    """The encoding's drafts per slot after the step, and its verifying rows so far (the rows before it, given, plus
    this step's): the counterexample's accepted lists are read from the same flags."""
    out: dict[str, object] = {}
    for i, slot in enumerate(result.state.slots):
        out[f"slot{i}.drafts"] = slot["drafts"]
        out[f"slot{i}.verifications"] = counts[i] + o.b2i(result.verified[i])
    return out


def _connector_outputs_of_engine(s: SchedulerState, d: StepDecision) -> dict[str, int]:
    """What the connector adds to the comparison: each request's transfer step, its place in the holders' queue
    (-1: not in it), whether it was admitted as a load in this step; the loads in flight."""
    place = {r.rid: k for k, r in enumerate(s.holders)}
    loads = set(d.loads)
    out: dict[str, int] = {}
    for r in s.requests:
        out[f"slot{r.rid}.transfer_step"] = r.transfer_step
        out[f"slot{r.rid}.holder"] = place.get(r.rid, -1)
        out[f"slot{r.rid}.loaded"] = int(r.rid in loads)
    out["loads_in_flight"] = s.loads_in_flight
    return out


def _connector_terms(o, policy: Policy, params: list[SlotParams], result: StepResult) -> dict[str, object]:
    """The same facts from the encoding: the holders' queue is the queued slots holding blocks, in the order of
    their holder keys (SymbolicStep.holder_key, read on the state after the step)."""
    slots = result.state.slots
    after = SymbolicStep(o, policy, params, result.state, 0, [False] * len(slots))
    holder = [after.in_holders(i) for i in range(len(slots))]
    keys = [after.holder_key(i) for i in range(len(slots))]
    out: dict[str, object] = {}
    for i, sl in enumerate(slots):
        ahead = sum(o.b2i(o.and_(holder[j], after.lex_lt(keys[j], keys[i]))) for j in range(len(slots)) if j != i)
        out[f"slot{i}.transfer_step"] = sl["transfer_step"]
        out[f"slot{i}.holder"] = o.ite(holder[i], ahead, -1)
        out[f"slot{i}.loaded"] = o.b2i(result.loads[i])
    out["loads_in_flight"] = sum(o.b2i(sl["status"] == int(Status.LOADING)) for sl in slots)
    return out


def outputs_of_engine(s: SchedulerState, d: StepDecision) -> dict[str, int]:
    scheduled = dict(d.scheduled)
    out: dict[str, int] = {}
    for r in s.requests:
        for name, value in zip(FIELDS, r.snapshot()):
            out[f"slot{r.rid}.{name}"] = value
        out[f"slot{r.rid}.scheduled"] = scheduled.get(r.rid, 0)
    out["next_seq"] = s.next_seq
    out["step"] = s.step
    for t, c in enumerate(s.tenant_counters):
        out[f"counter{t}"] = c
    out["kv_used"] = s.kv_used
    out["swap_used"] = s.swap_used
    if s.policy.connector.enabled:
        out.update(_connector_outputs_of_engine(s, d))
    if s.blocked is not None:  # blocked in the next step's scan (its grammar not ready then)
        for r in s.requests:
            out[f"slot{r.rid}.blocked_next"] = int(r.status is Status.WAITING and s.blocked.get(r.rid, -1) > s.step)
    if s.spec is not None:
        for r in s.requests:
            out[f"slot{r.rid}.drafts"] = s.spec.drafts.get(r.rid, 0)
            out[f"slot{r.rid}.verifications"] = s.spec.verified.get(r.rid, 0)
    return out


def _flatten(result: StepResult, o=None, policy: Policy | None = None,
             params: list[SlotParams] | None = None, counts: tuple[int, ...] = ()) -> dict[str, object]:
    out: dict[str, object] = {}
    for i, slot in enumerate(result.state.slots):
        for name in FIELDS:
            out[f"slot{i}.{name}"] = slot[name]
        out[f"slot{i}.scheduled"] = result.scheduled[i]
    out["next_seq"] = result.state.next_seq
    out["step"] = result.state.step
    for t, c in enumerate(result.state.counters):
        out[f"counter{t}"] = c
    out["kv_used"] = result.state.kv_used
    out["swap_used"] = result.state.swap_used
    if policy is not None and policy.connector.enabled:
        out.update(_connector_terms(o, policy, params, result))
    if policy is not None and policy.speculative.enabled:
        out.update(_spec_terms(result, counts, o))
    if policy is not None and policy.queue.blocked_waiting != "off":
        step = result.state.step
        for i, slot in enumerate(result.state.slots):
            out[f"slot{i}.blocked_next"] = o.b2i(o.and_(slot["status"] == int(Status.WAITING),
                                                        slot["ready_step"] > step))
    return out


def _state(slots: list[dict], next_seq, step, counters, next_load=1) -> SlotState:
    return SlotState(slots=slots, next_seq=next_seq, step=step, counters=list(counters), next_load=next_load)


def int_outputs(policy: Policy, c: Captured) -> dict[str, int]:
    """The symbolic step evaluated on ints."""
    if c.transfer_params:
        params = [SlotParams(*p, 0, *t) for p, t in zip(c.params, c.transfer_params)]
        slots = [{**dict(zip(FIELDS, values)), **dict(zip(CONNECTOR_FIELDS, extra))}
                 for values, extra in zip(c.slots, c.transfer_slots)]
    else:
        params = [SlotParams(*p) for p in c.params]
        slots = [dict(zip(FIELDS, values)) for values in c.slots]
    if c.drafts:
        for slot, drafts in zip(slots, c.drafts):
            slot["drafts"] = drafts
    if c.ready:
        params = [replace(prm, grammar_steps=g) for prm, g in zip(params, c.grammar)]
        for slot, ready in zip(slots, c.ready):
            slot["ready_step"] = ready
    result = symbolic_step(IntOps, policy, params, _state(slots, c.next_seq, c.step, c.counters, c.next_load),
                           c.now_us, list(c.cancels), list(c.accepted) if c.drafts else None)
    return {k: int(v) for k, v in _flatten(result, IntOps, policy, params, c.verifications).items()}


class Z3Step:
    """The symbolic step over z3 variables, built once per (policy, slots, tenants) and then
    evaluated by pinning the variables to a captured state."""

    def __init__(self, policy: Policy, num_slots: int, num_tenants: int):
        self.connector = policy.connector.enabled
        extra = TRANSFER_PARAMS if self.connector else ()
        self.params = [SlotParams(*(int_var(f"{f}_{i}") for f in PARAM_FIELDS),
                                  **{f: int_var(f"{f}_{i}") for f in extra}) for i in range(num_slots)]
        self.spec = policy.speculative.enabled
        self.blocking = policy.queue.blocked_waiting != "off"
        if self.blocking:
            self.params = [replace(prm, grammar_steps=int_var(f"grammar_steps_{i}")) for i, prm in enumerate(self.params)]
        fields = FIELDS + (CONNECTOR_FIELDS if self.connector else ()) + (SPEC_FIELDS if self.spec else ()) \
            + (BLOCKED_FIELDS if self.blocking else ())
        self.slots = [{f: int_var(f"{f}_{i}") for f in fields} for i in range(num_slots)]
        # the verifier's choice per slot, an input like the cancels (no z3 term at all without speculative decoding)
        self.accepted = [int_var(f"accepted_{i}") for i in range(num_slots)] if self.spec else None
        self.next_seq = int_var("next_seq")
        self.step = int_var("step")
        self.next_load = int_var("next_load") if self.connector else 1  # no z3 term at all without a connector
        self.counters = [int_var(f"counter_{t}") for t in range(num_tenants)]
        self.now = int_var("now_us")
        self.cancels = [bool_var(f"cancel_{i}") for i in range(num_slots)]
        state = _state(self.slots, self.next_seq, self.step, self.counters, self.next_load)
        result = symbolic_step(Z3Ops, policy, self.params, state, self.now, self.cancels, self.accepted)
        flat = _flatten(result, Z3Ops, policy, self.params, (0,) * num_slots)
        self.names = list(flat)
        self.terms = list(flat.values())

    def evaluate(self, c: Captured) -> dict[str, int]:
        out = self._evaluate(c)
        for i, n in enumerate(c.verifications):  # the terms count this step's verifying row from 0
            out[f"slot{i}.verifications"] += n
        return out

    def _evaluate(self, c: Captured) -> dict[str, int]:
        pins: list[tuple[object, object]] = []
        for prm, values in zip(self.params, c.params):
            pins += list(zip((getattr(prm, f) for f in PARAM_FIELDS), values))
        for slot, values in zip(self.slots, c.slots):
            pins += [(slot[f], v) for f, v in zip(FIELDS, values)]
        pins += [(self.next_seq, c.next_seq), (self.step, c.step), (self.now, c.now_us)]
        pins += list(zip(self.counters, c.counters))
        pins += list(zip(self.cancels, c.cancels))
        if self.connector:
            for prm, values, slot, extra in zip(self.params, c.transfer_params, self.slots, c.transfer_slots):
                pins += list(zip((getattr(prm, f) for f in TRANSFER_PARAMS), values))
                pins += list(zip((slot[f] for f in CONNECTOR_FIELDS), extra))
            pins.append((self.next_load, c.next_load))
        if self.spec:
            pins += [(slot["drafts"], v) for slot, v in zip(self.slots, c.drafts)]
            pins += list(zip(self.accepted, c.accepted))
        if self.blocking:
            pins += [(prm.grammar_steps, g) for prm, g in zip(self.params, c.grammar)]
            pins += [(slot["ready_step"], r) for slot, r in zip(self.slots, c.ready)]
        values = pin_and_eval(pins, self.terms)
        return {name: int(v) for name, v in zip(self.names, values)}


def differences(expected: dict[str, int], got: dict[str, int]) -> list[str]:
    return [f"{k}: engine={expected[k]} symbolic={got.get(k)}" for k in expected if got.get(k) != expected[k]]


# ----------------------------------------------------------------------------------------- with prefix caching
# The same pinning for a policy with kv.prefix_caching.enabled: the inputs also hold each slot's prompt identity
# and the block pool (checker/smt/pool.py, records numbered by first appearance); the outputs also hold the pool
# in a canonical form (pool.canonical: block names by first appearance, hashes as codes, the LRU order, each
# hash's blocks in cache order) and the facts the cache invariants read.


@dataclass(frozen=True)
class CacheCaptured:
    base: Captured
    identities: tuple[int, ...]
    pool: PoolState


def cache_shape(policy: Policy, specs) -> Shape:
    """The pool encoding's sizes for these requests: a table long enough for any of them."""
    most = max((min(s.prompt_len + s.output_len, policy.max_model_len) for s in specs), default=1)
    kv = policy.kv
    return shape_for(len(specs), most, kv.num_blocks, kv.block_size, kv.prefix_caching.chained_hashes)


def cache_capture(shape: Shape, s: SchedulerState, cancels: list[Request], now_us: int) -> CacheCaptured:
    size = s.policy.kv.block_size
    idents = tuple(identity_of(r.spec.content, r.prompt_len, size, f"requests[{r.rid}].content") for r in s.requests)
    return CacheCaptured(capture(s, cancels, now_us), idents, pool_from_engine(shape, s.pool, s.requests))


def _facts_dict(facts) -> dict[str, int]:
    return {f"facts.{name}": int(v) for name, v in facts._asdict().items()}


def cache_outputs_of_engine(shape: Shape, s: SchedulerState, d: StepDecision) -> dict[str, object]:
    out: dict[str, object] = dict(outputs_of_engine(s, d))
    out.update(canonical_of_engine(shape, s.pool, s.requests))
    out["pool.overflow"] = False
    out.update(_facts_dict(s.pool.facts(s.requests)))
    return out


def _cache_step(ops, policy: Policy, shape: Shape, params: list[SlotParams], slots: list[dict], next_seq, step,
                counters, pool: PoolState, now, cancels) -> tuple[StepResult, Pool]:
    state = _state(slots, next_seq, step, counters)
    state.pool = Pool(ops, shape, pool)
    result = symbolic_step(ops, policy, params, state, now, cancels)
    return result, result.state.pool


def _true_codes(ops, pool: Pool, params: list[SlotParams]) -> list[list]:
    return [[chained_code(ops, pool.shape, prm.identity, prm.prompt_len, i, k) for k in range(pool.shape.table)]
            for i, prm in enumerate(params)]


def _pool_terms(result: StepResult, pool: Pool, ops, params) -> dict[str, object]:
    st = pool.s
    out: dict[str, object] = {}
    for i in range(pool.shape.num_slots):
        for k in range(pool.shape.table):
            out[f"table{i}.{k}"] = st.table[i][k]
        out[f"ncached{i}"] = st.ncached[i]
    for name in POOL_FIELDS:
        for j, v in enumerate(getattr(st, name)):
            out[f"{name}{j}"] = v
    out["clock"] = st.clock
    out["overflow"] = st.overflow
    facts = pool.facts([slot["blocks"] for slot in result.state.slots], _true_codes(ops, pool, params))
    for name, v in facts._asdict().items():
        out[f"facts.{name}"] = v
    return out


def _pool_values(shape: Shape, values: dict[str, object]) -> tuple[PoolState, dict[str, object]]:
    """The canonical pool and the facts from the outputs' plain values."""
    st = empty_pool(shape)
    st.table = [[int(values[f"table{i}.{k}"]) for k in range(shape.table)] for i in range(shape.num_slots)]
    st.ncached = [int(values[f"ncached{i}"]) for i in range(shape.num_slots)]
    for name in POOL_FIELDS:
        setattr(st, name, [int(values[f"{name}{j}"]) for j in range(shape.records)])
    st.clock, st.overflow = int(values["clock"]), bool(values["overflow"])
    blocks = [int(values[f"slot{i}.blocks"]) for i in range(shape.num_slots)]
    out = canonical_of_values(shape, st, blocks)
    out.update({k: int(v) for k, v in values.items() if k.startswith("facts.")})
    return st, out


def cache_int_outputs(policy: Policy, shape: Shape, c: CacheCaptured) -> dict[str, object]:
    """The symbolic step with the pool, evaluated on ints."""
    b = c.base
    params = [SlotParams(*p, identity=ident) for p, ident in zip(b.params, c.identities)]
    slots = [dict(zip(FIELDS, values)) for values in b.slots]
    result, pool = _cache_step(IntOps, policy, shape, params, slots, b.next_seq, b.step, b.counters, c.pool.copy(),
                               b.now_us, list(b.cancels))
    flat = {k: int(v) for k, v in _flatten(result).items()}
    _, canon = _pool_values(shape, {**flat, **_pool_terms(result, pool, IntOps, params)})
    return {**flat, **canon}


class Z3CacheStep:
    """Z3Step with the block pool: the step over z3 variables (pool included), built once per (policy, shape,
    tenants), then evaluated by pinning every variable to a captured state."""

    def __init__(self, policy: Policy, shape: Shape, num_tenants: int):
        n, m, length = shape.num_slots, shape.records, shape.table
        self.shape = shape
        self.params = [SlotParams(*(int_var(f"{f}_{i}") for f in PARAM_FIELDS), identity=int_var(f"identity_{i}"))
                       for i in range(n)]
        self.slots = [{f: int_var(f"{f}_{i}") for f in FIELDS} for i in range(n)]
        self.next_seq, self.step, self.now = int_var("next_seq"), int_var("step"), int_var("now_us")
        self.counters = [int_var(f"counter_{t}") for t in range(num_tenants)]
        self.cancels = [bool_var(f"cancel_{i}") for i in range(n)]
        self.pool = PoolState([[int_var(f"table_{i}_{k}") for k in range(length)] for i in range(n)],
                              [int_var(f"ncached_{i}") for i in range(n)],
                              *([int_var(f"{name}_{j}") for j in range(m)] for name in POOL_FIELDS),
                              clock=int_var("clock"))
        result, pool = _cache_step(Z3Ops, policy, shape, self.params, self.slots, self.next_seq, self.step,
                                   self.counters, self.pool.copy(), self.now, self.cancels)
        flat = {**_flatten(result), **_pool_terms(result, pool, Z3Ops, self.params)}
        self.names = list(flat)
        self.terms = list(flat.values())

    def evaluate(self, c: CacheCaptured) -> dict[str, object]:
        b = c.base
        pins: list[tuple[object, object]] = []
        for prm, values, ident in zip(self.params, b.params, c.identities):
            pins += list(zip((getattr(prm, f) for f in PARAM_FIELDS), values)) + [(prm.identity, ident)]
        for slot, values in zip(self.slots, b.slots):
            pins += [(slot[f], v) for f, v in zip(FIELDS, values)]
        pins += [(self.next_seq, b.next_seq), (self.step, b.step), (self.now, b.now_us)]
        pins += list(zip(self.counters, b.counters)) + list(zip(self.cancels, b.cancels))
        for i in range(self.shape.num_slots):
            pins += list(zip(self.pool.table[i], c.pool.table[i])) + [(self.pool.ncached[i], c.pool.ncached[i])]
        for name in POOL_FIELDS:
            pins += list(zip(getattr(self.pool, name), getattr(c.pool, name)))
        pins.append((self.pool.clock, c.pool.clock))
        values = dict(zip(self.names, pin_and_eval(pins, self.terms)))
        flat = {k: int(v) for k, v in values.items() if k.startswith(("slot", "counter")) or k in _GLOBALS}
        _, canon = _pool_values(self.shape, values)
        return {**flat, **canon}


_GLOBALS = ("next_seq", "step", "kv_used", "swap_used")
