"""The two records of the capacity audit: a batching contract and a workload written for it.

Every number is a whole number in the unit its name states (tokens/s, ms, bytes, permille,
requests per minute), so the audit's arithmetic (checker/audit/fluid.py) never needs a float. A
workload names the contract it was written for by the contract's content id (:func:`content_id`).
The formulas that use these fields are in docs/audit.md.
"""

from __future__ import annotations

import hashlib
import json
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

from checker.policy import MAX_MS
from checker.workload import NamedClasses

MAX_RATE = 10**15  # tokens/s: larger rates are absurd inputs, not capacity plans
MAX_TOKENS_PER_REQUEST = 10**9
MAX_ARRIVALS_PER_MIN = 10**12
MAX_BYTES = 10**18
MAX_PRIORITY = 1_000_000

Int = Annotated[int, Field(strict=True)]
Rate = Annotated[int, Field(strict=True, ge=1, le=MAX_RATE)]
Ms = Annotated[int, Field(strict=True, ge=1, le=MAX_MS)]
Permille = Annotated[int, Field(strict=True, ge=0, le=1000)]
Name = Annotated[str, Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9_.:/+-]+$")]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


def _fail(field: str, value: object, expected: str) -> PydanticCustomError:
    return PydanticCustomError("consistency", "{field}={value} (expected {expected})",
                               {"field": field, "value": value, "expected": expected})


class Slo(_Strict):
    """Service-level objectives the audit checks its floors against (null: not checked)."""

    queue_ms: Annotated[int | None, Field(strict=True, ge=1, le=MAX_MS)] = None
    """Bound on every class's fluid queue delay (ms)."""
    ttft_ms: Annotated[int | None, Field(strict=True, ge=1, le=MAX_MS)] = None
    """Bound on every class's TTFT floor: queue delay plus the prefill iterations of its longest prompt (ms)."""
    tpot_ms: Annotated[int | None, Field(strict=True, ge=1, le=MAX_MS)] = None
    """Bound on the time per output token after the first (ms)."""


class AuditContract(_Strict):
    """A batching contract: the service one deployment promises, as whole numbers. The total token
    rate is split into a prefill and a decode partition; every iteration serves
    ``rate * iteration_ms / 1000`` tokens of each partition."""

    format: Literal["batchcheck-audit-contract"] = "batchcheck-audit-contract"
    """Marks the file as an audit contract."""
    version: Literal[1] = 1
    """Record version."""
    example: Annotated[str | None, Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9_.-]+$")] = None
    """Set only on illustrative records (not a measured deployment): printed first as ``example=VALUE``."""
    scope: Name
    """What the contract covers (model, device, deployment); a workload must name the same scope."""
    total_tokens_per_s: Rate
    """Token service rate of the deployment: prefill plus decode tokens per second."""
    prefill_tokens_per_s: Rate
    """Prefill partition: prompt tokens per second."""
    decode_tokens_per_s: Rate
    """Decode partition: output tokens per second (one per active sequence per iteration)."""
    iteration_ms: Ms
    """Duration of one scheduler iteration (ms)."""
    prefill_chunk_tokens: Annotated[int, Field(strict=True, ge=1, le=MAX_RATE)]
    """Largest prefill chunk one request gets in one iteration; at most what the prefill partition
    serves in one iteration."""
    active_sequence_cap: Annotated[int, Field(strict=True, ge=1, le=10**9)]
    """Most sequences running at once (vLLM ``max_num_seqs``)."""
    kv_budget_bytes: Annotated[int, Field(strict=True, ge=1, le=MAX_BYTES)]
    """KV cache bytes available to sequences."""
    kv_bytes_per_token: Annotated[int, Field(strict=True, ge=1, le=10**9)]
    """KV bytes one token of context takes (2 x layers x kv_heads x head_dim x dtype bytes / TP)."""
    slo: Slo = Field(default_factory=Slo)
    """Queue, TTFT and TPOT bounds."""
    admission_headroom_permille: Annotated[int, Field(strict=True, ge=0, le=999)] = 0
    """Share of the KV budget admission keeps free (vLLM's watermark); the peak must fit the rest."""
    fairness_bound_permille: Permille = 1000
    """How far (permille of a partition) a tenant may run above its share; 1000: not checked."""
    tenant_shares_permille: dict[Name, Permille] | None = None
    """Each tenant's share of each partition (sum <= 1000). Null: equal shares of the workload's tenants."""
    cancel_release_lag_ms: Annotated[int, Field(strict=True, ge=0, le=MAX_MS)] = 0
    """Time from a cancel to the release of the request's KV (ms)."""

    @model_validator(mode="after")
    def _consistent(self) -> AuditContract:
        parts = self.prefill_tokens_per_s + self.decode_tokens_per_s
        if parts != self.total_tokens_per_s:
            raise _fail("total_tokens_per_s", self.total_tokens_per_s,
                        f"prefill_tokens_per_s + decode_tokens_per_s = {parts}: the partitions must add up "
                        "to the total")
        per_iteration = self.prefill_tokens_per_s * self.iteration_ms // 1000
        if self.prefill_chunk_tokens > per_iteration:
            raise _fail("prefill_chunk_tokens", self.prefill_chunk_tokens,
                        f"<= {per_iteration}: what the prefill partition ({self.prefill_tokens_per_s} tokens/s) "
                        f"serves in one {self.iteration_ms} ms iteration; a larger chunk contradicts the "
                        "declared service rate")
        if self.decode_tokens_per_s * self.iteration_ms < 1000:
            least = -(-1000 // self.iteration_ms)
            raise _fail("decode_tokens_per_s", self.decode_tokens_per_s,
                        f">= {least}: at least one decode token per {self.iteration_ms} ms iteration")
        if self.kv_budget_bytes < self.kv_bytes_per_token:
            raise _fail("kv_budget_bytes", self.kv_budget_bytes,
                        f">= kv_bytes_per_token={self.kv_bytes_per_token}: room for one token")
        shares = self.tenant_shares_permille
        if shares is not None and sum(shares.values()) > 1000:
            raise _fail("tenant_shares_permille", shares, f"shares summing to <= 1000 (they sum to {sum(shares.values())})")
        if shares is not None and not shares:
            raise _fail("tenant_shares_permille", shares, "at least one tenant, or null for equal shares")
        return self

    @property
    def prefill_per_iteration(self) -> int:
        return self.prefill_tokens_per_s * self.iteration_ms // 1000

    @property
    def decode_slots(self) -> int:
        """Decode tokens one iteration serves: at most this many sequences get a token per iteration."""
        return self.decode_tokens_per_s * self.iteration_ms // 1000


class AuditClass(_Strict):
    """One request class: a steady arrival rate of requests of the given lengths."""

    name: Name
    """Class name (unique in the workload)."""
    arrivals_per_min: Annotated[int, Field(strict=True, ge=1, le=MAX_ARRIVALS_PER_MIN)]
    """Requests arriving per minute."""
    prompt_tokens: Annotated[int, Field(strict=True, ge=1, le=MAX_TOKENS_PER_REQUEST)]
    """Prompt tokens per request (prefill work; the mean for a class of mixed lengths)."""
    output_tokens: Annotated[int, Field(strict=True, ge=1, le=MAX_TOKENS_PER_REQUEST)]
    """Output tokens per request (decode work; the mean for a class of mixed lengths)."""
    max_prompt_tokens: Annotated[int | None, Field(strict=True, ge=1, le=MAX_TOKENS_PER_REQUEST)] = None
    """Longest prompt of the class, for the TTFT floor (null: prompt_tokens)."""
    priority: Annotated[int, Field(strict=True, ge=-MAX_PRIORITY, le=MAX_PRIORITY)] = 0
    """Lower is served first; classes of equal priority in the order they are listed."""
    tenant: Name = "default"
    """Tenant the class belongs to."""
    cancel_permille: Permille = 0
    """Share of the class's requests that are cancelled; each holds its KV for the contract's
    cancellation lag longer."""

    @model_validator(mode="after")
    def _consistent(self) -> AuditClass:
        if self.max_prompt_tokens is not None and self.max_prompt_tokens < self.prompt_tokens:
            raise _fail("max_prompt_tokens", self.max_prompt_tokens, f">= prompt_tokens={self.prompt_tokens}")
        per_min = self.arrivals_per_min * (self.prompt_tokens + self.output_tokens)
        if per_min > MAX_RATE * 60:
            raise _fail("arrivals_per_min", self.arrivals_per_min,
                        f"a class demand <= {MAX_RATE} tokens/s (this one asks "
                        f"{per_min // 60} tokens/s)")
        return self

    @property
    def longest_prompt(self) -> int:
        return self.max_prompt_tokens or self.prompt_tokens


class AuditWorkload(_Strict, NamedClasses):
    """A workload written for one contract: steady request classes."""

    format: Literal["batchcheck-audit-workload"] = "batchcheck-audit-workload"
    """Marks the file as an audit workload."""
    version: Literal[1] = 1
    """Record version."""
    scope: Name
    """Must equal the contract's scope."""
    contract_id: Annotated[str, Field(pattern=r"^sha256:[0-9a-f]{16}$")]
    """Content id of the contract this workload was written for (``batchcheck audit`` refuses any other)."""
    classes: Annotated[list[AuditClass], Field(min_length=1, max_length=10_000)]
    """Request classes."""



def canonical_json(record: BaseModel) -> str:
    """Every field (defaults included), keys sorted, no whitespace: the bytes the content id hashes."""
    return json.dumps(record.model_dump(mode="json"), sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def content_id(record: BaseModel) -> str:
    """``sha256:`` and the first 16 hex digits of the SHA-256 of the record's canonical JSON."""
    return "sha256:" + hashlib.sha256(canonical_json(record).encode("utf-8")).hexdigest()[:16]
