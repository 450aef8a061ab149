"""The integer fluid capacity audit of one workload against one batching contract.

Integers only (tokens per minute, permille, ms, microseconds, bytes); every division rounds up, so
each figure is the conservative side of its exact value. docs/audit.md states every formula; the
names below follow it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from checker.audit.records import AuditClass, AuditContract, AuditWorkload

CLAIM = "LOCAL_FLUID_CAPACITY_MODEL_NOT_QUEUEING_OR_DEVICE_BENCHMARK"
WITHIN = "CAPACITY_WITHIN_DECLARED_BOUND"
MAX_LOAD_PERMILLE = 999  # a partition loaded to 1000 permille has an unbounded fluid queue

# The bounds, in the order they are checked for each class (docs/audit.md, "The decision").
BOUNDS = ("PREFILL_CAPACITY_EXCEEDED", "DECODE_CAPACITY_EXCEEDED", "TENANT_SHARE_EXCEEDED",
          "ACTIVE_SEQUENCE_CAP_EXCEEDED", "KV_BUDGET_EXCEEDED", "QUEUE_SLO_EXCEEDED", "TTFT_SLO_EXCEEDED",
          "TPOT_SLO_EXCEEDED")


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def permille(part: int, whole: int) -> int:
    """part / whole in permille, rounded up."""
    return ceil_div(part * 1000, whole)


def queue_delay_ms(iteration_ms: int, load_permille: int) -> int | None:
    """Fluid queue delay at a load U (permille): ceil(iteration_ms * U / (1000 - U)); None (unbounded)
    at U >= 1000. (The audit also calls it unbounded when a partition is at capacity.)"""
    if load_permille >= 1000:
        return None
    return ceil_div(iteration_ms * load_permille, 1000 - load_permille)


@dataclass(frozen=True)
class ClassFigures:
    """One class's own demand and floors, and the cumulative figures of the classes served up to it."""

    name: str
    tenant: str
    priority: int
    prefill_tokens_per_min: int
    decode_tokens_per_min: int
    prefill_iterations: int  # iterations the longest prompt needs: ceil(longest / chunk)
    kv_hold_us: int  # mean time a request holds KV (prefill + decode + cancel lag share), microseconds
    active_sequences: int  # ceil(arrivals_per_min * kv_hold_us / 60e6): Little's law, rounded up
    kv_bytes: int  # active_sequences * (prompt + output) * kv_bytes_per_token
    # cumulative over the classes served before it and itself:
    load_permille: int
    prefill_permille: int
    decode_permille: int
    tenant_prefill_permille: int
    tenant_decode_permille: int
    active_sequences_cum: int
    kv_bytes_cum: int
    queue_ms: int | None
    ttft_ms: int | None
    tpot_ms: int

    def as_json(self) -> dict:
        return {
            "name": self.name, "tenant": self.tenant, "priority": self.priority,
            "prefill_tokens_per_min": self.prefill_tokens_per_min, "decode_tokens_per_min": self.decode_tokens_per_min,
            "prefill_iterations": self.prefill_iterations, "kv_hold_us": self.kv_hold_us,
            "active_sequences": self.active_sequences, "kv_bytes": self.kv_bytes,
            "queue_ms": self.queue_ms, "ttft_ms": self.ttft_ms, "tpot_ms": self.tpot_ms,
            "served_so_far": {  # this class and every class served before it
                "load_permille": self.load_permille, "prefill_permille": self.prefill_permille,
                "decode_permille": self.decode_permille, "tenant_prefill_permille": self.tenant_prefill_permille,
                "tenant_decode_permille": self.tenant_decode_permille,
                "active_sequences": self.active_sequences_cum, "kv_bytes": self.kv_bytes_cum,
            },
        }


@dataclass(frozen=True)
class Failure:
    bound: str
    cls: str
    tenant: str
    value: int | None  # None: unbounded
    limit: int

    def as_json(self) -> dict:
        return {"bound": self.bound, "class": self.cls, "tenant": self.tenant, "value": self.value,
                "limit": self.limit}


@dataclass(frozen=True)
class AuditResult:
    contract: AuditContract
    workload: AuditWorkload
    contract_id: str
    workload_id: str
    classes: list[ClassFigures]  # in service order
    tenant_shares: dict[str, int]
    kv_limit_bytes: int
    failure: Failure | None
    derived: dict | None = field(default=None)  # the derivation, for `audit --policy ...`

    @property
    def decision(self) -> str:
        return WITHIN if self.failure is None else self.failure.bound

    @property
    def last(self) -> ClassFigures:
        return self.classes[-1]

    @property
    def worst_ttft_ms(self) -> int | None:
        values = [c.ttft_ms for c in self.classes]
        return None if any(v is None for v in values) else max(values)  # type: ignore[type-var]

    def decision_line(self) -> str:
        if self.failure is None:
            return f"decision={WITHIN}"
        f = self.failure
        value = "unbounded" if f.value is None else f.value
        return f"decision={f.bound};class={f.cls};tenant={f.tenant};value={value};limit={f.limit}"

    def text(self) -> str:
        last = self.last
        lines = []
        if self.contract.example is not None:
            lines.append(f"example={self.contract.example}")
        lines.append(self.decision_line())
        lines.append(f"utilization_permille={last.load_permille};prefill={last.prefill_permille};"
                     f"decode={last.decode_permille}")
        lines.append(f"queue_ms={_show(last.queue_ms)};worst_ttft_ms={_show(self.worst_ttft_ms)};"
                     f"tpot_ms={last.tpot_ms}")
        lines.append(f"peak_kv_bytes={last.kv_bytes_cum}")
        lines.append(f"claim={CLAIM}")
        return "\n".join(lines)

    def as_json(self) -> dict:
        last = self.last
        out: dict = {
            "example": self.contract.example,
            "decision": self.decision,
            "failure": None if self.failure is None else self.failure.as_json(),
            "scope": self.contract.scope,
            "contract_id": self.contract_id,
            "workload_id": self.workload_id,
            "demand_tokens_per_min": {"prefill": sum(c.prefill_tokens_per_min for c in self.classes),
                                      "decode": sum(c.decode_tokens_per_min for c in self.classes)},
            "utilization_permille": {"total": last.load_permille, "prefill": last.prefill_permille,
                                     "decode": last.decode_permille},
            "queue_ms": last.queue_ms,
            "worst_ttft_ms": self.worst_ttft_ms,
            "tpot_ms": last.tpot_ms,
            "peak_active_sequences": last.active_sequences_cum,
            "active_sequence_cap": self.contract.active_sequence_cap,
            "peak_kv_bytes": last.kv_bytes_cum,
            "kv_limit_bytes": self.kv_limit_bytes,
            "prefill_chunk_tokens": self.contract.prefill_chunk_tokens,
            "decode_slots_per_iteration": self.contract.decode_slots,
            "tenant_shares_permille": self.tenant_shares,
            "classes": [c.as_json() for c in self.classes],
            "claim": CLAIM,
        }
        if self.derived is not None:
            out["derived"] = self.derived
        return out


def _show(value: int | None) -> str:
    return "unbounded" if value is None else str(value)


def service_order(workload: AuditWorkload) -> list[AuditClass]:
    """Lower priority value first; equal priorities in the order listed."""
    order = sorted(range(len(workload.classes)), key=lambda i: (workload.classes[i].priority, i))
    return [workload.classes[i] for i in order]


def tenant_shares(contract: AuditContract, workload: AuditWorkload) -> dict[str, int]:
    """The contract's explicit shares, or equal shares (1000 // tenants, rounded down) of the workload's tenants."""
    if contract.tenant_shares_permille is not None:
        return dict(sorted(contract.tenant_shares_permille.items()))
    tenants = workload.tenants
    return {t: 1000 // len(tenants) for t in tenants}


def audit(contract: AuditContract, workload: AuditWorkload, contract_id: str, workload_id: str,
          derived: dict | None = None) -> AuditResult:
    """Run the fluid audit. The pair must already belong together (checker.audit.check_pair)."""
    c = contract
    it = c.iteration_ms
    cap_prefill = c.prefill_tokens_per_s * 60  # tokens per minute
    cap_decode = c.decode_tokens_per_s * 60
    cap_total = c.total_tokens_per_s * 60
    shares = tenant_shares(c, workload)
    kv_limit = c.kv_budget_bytes * (1000 - c.admission_headroom_permille) // 1000

    figures: list[ClassFigures] = []
    failure: Failure | None = None
    prefill_sum = decode_sum = active_sum = kv_sum = 0
    tenant_prefill: dict[str, int] = {}
    tenant_decode: dict[str, int] = {}
    for k in service_order(workload):
        prefill = k.arrivals_per_min * k.prompt_tokens
        decode = k.arrivals_per_min * k.output_tokens
        iterations = ceil_div(k.longest_prompt, c.prefill_chunk_tokens)
        hold_us = (iterations + k.output_tokens - 1) * it * 1000 + k.cancel_permille * c.cancel_release_lag_ms
        active = ceil_div(k.arrivals_per_min * hold_us, 60_000_000)
        kv = active * (k.prompt_tokens + k.output_tokens) * c.kv_bytes_per_token

        prefill_sum += prefill
        decode_sum += decode
        active_sum += active
        kv_sum += kv
        tenant_prefill[k.tenant] = tenant_prefill.get(k.tenant, 0) + prefill
        tenant_decode[k.tenant] = tenant_decode.get(k.tenant, 0) + decode
        load = permille(prefill_sum + decode_sum, cap_total)
        prefill_load, decode_load = permille(prefill_sum, cap_prefill), permille(decode_sum, cap_decode)
        saturated = max(prefill_load, decode_load) >= 1000  # a partition at capacity: no finite queue
        queue = None if saturated else queue_delay_ms(it, load)
        fig = ClassFigures(
            name=k.name, tenant=k.tenant, priority=k.priority,
            prefill_tokens_per_min=prefill, decode_tokens_per_min=decode, prefill_iterations=iterations,
            kv_hold_us=hold_us, active_sequences=active, kv_bytes=kv,
            load_permille=load, prefill_permille=prefill_load, decode_permille=decode_load,
            tenant_prefill_permille=permille(tenant_prefill[k.tenant], cap_prefill),
            tenant_decode_permille=permille(tenant_decode[k.tenant], cap_decode),
            active_sequences_cum=active_sum, kv_bytes_cum=kv_sum, queue_ms=queue,
            ttft_ms=None if queue is None else queue + iterations * it,
            tpot_ms=it * ceil_div(max(active_sum, 1), c.decode_slots),
        )
        figures.append(fig)
        if failure is None:
            failure = _first_failure(fig, c, shares[k.tenant], kv_limit)
    return AuditResult(contract, workload, contract_id, workload_id, figures, shares, kv_limit, failure, derived)


def _first_failure(f: ClassFigures, c: AuditContract, share: int, kv_limit: int) -> Failure | None:
    tenant_limit = min(share + c.fairness_bound_permille, 1000)
    checks: list[tuple[str, int | None, int | None]] = [
        ("PREFILL_CAPACITY_EXCEEDED", f.prefill_permille, MAX_LOAD_PERMILLE),
        ("DECODE_CAPACITY_EXCEEDED", f.decode_permille, MAX_LOAD_PERMILLE),
        ("TENANT_SHARE_EXCEEDED", f.tenant_prefill_permille, tenant_limit),
        ("TENANT_SHARE_EXCEEDED", f.tenant_decode_permille, tenant_limit),
        ("ACTIVE_SEQUENCE_CAP_EXCEEDED", f.active_sequences_cum, c.active_sequence_cap),
        ("KV_BUDGET_EXCEEDED", f.kv_bytes_cum, kv_limit),
        ("QUEUE_SLO_EXCEEDED", f.queue_ms, c.slo.queue_ms),
        ("TTFT_SLO_EXCEEDED", f.ttft_ms, c.slo.ttft_ms),
        ("TPOT_SLO_EXCEEDED", f.tpot_ms, c.slo.tpot_ms),
    ]
    for bound, value, limit in checks:
        if limit is None:
            continue
        if value is None or value > limit:
            return Failure(bound, f.name, f.tenant, value, limit)
    return None
