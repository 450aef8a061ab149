"""Both audit records derived from a policy, a service-curve profile and a batchcheck workload, so that
the audit and the reference engine describe the same system (docs/audit.md, "The derived form").

The only place the audit meets floats: the profile's coefficients and the workload's arrival times
and lengths become whole numbers here, once, each rounded to the conservative side.
"""

from __future__ import annotations

import re
from checker.audit.fluid import ceil_div
from checker.audit.records import AuditContract, AuditWorkload, content_id
from checker.errors import InputError, Problem
from checker.loading import validate
from checker.policy import Polarity, Policy
from checker.profile import Profile
from checker.requests import RequestSpec
from checker.workload import Workload, generate


def _name(text: str) -> str:
    """A record name: characters outside [A-Za-z0-9_.:/+-] become '_'."""
    return re.sub(r"[^A-Za-z0-9_.:/+-]", "_", text)[:200] or "_"


def derive(policy: Policy, profile: Profile, workload: Workload, *, policy_source: str = "<policy>",
           profile_source: str = "<profile>", workload_source: str = "<workload>",
           queue_slo_ms: int | None = None, ttft_slo_ms: int | None = None,
           tpot_slo_ms: int | None = None) -> tuple[AuditContract, AuditWorkload, dict]:
    """The contract, the workload record written for it, and the derivation's intermediate figures."""
    specs = generate(workload)
    served = served_requests(policy, specs, f"a workload that generates at least one request with a prompt shorter "
                             f"than max_model_len={policy.max_model_len} of {policy_source}", workload_source)

    # 1. The classes, measured on the requests the engine would run.
    truncated = workload.max_requests is not None and len(specs) == workload.max_requests
    horizon_us = specs[-1].arrival_us + 1 if truncated else round(workload.duration_s * 1_000_000)
    classes = []
    for ci, k in enumerate(workload.classes):
        members = [r for r in served if r.cls == ci]
        if not members:
            continue  # no request of this class reaches the scheduler
        start_us = round(k.start_ms * 1000)
        stop_us = horizon_us if k.stop_ms is None else min(horizon_us, round(k.stop_ms * 1000))
        classes.append(class_figures(policy, k.name, k.tenant, k.priority, members, stop_us - start_us))
    return derive_records(policy, profile, served, classes, {"workload": workload_source, "requests": len(specs)},
                          policy_source=policy_source, profile_source=profile_source, workload_source=workload_source,
                          queue_slo_ms=queue_slo_ms, ttft_slo_ms=ttft_slo_ms, tpot_slo_ms=tpot_slo_ms)


def served_requests(policy: Policy, specs: list[RequestSpec], expected: str, source: str) -> list[RequestSpec]:
    """The requests the scheduler admits to its queue: prompts shorter than max_model_len."""
    served = [r for r in specs if r.prompt_len < policy.max_model_len]  # longer prompts are rejected on arrival
    if not served:
        raise InputError(Problem("classes", f"<{len(specs)} requests, none shorter than max_model_len>", expected),
                         source)
    return served


def _out_len(policy: Policy, r: RequestSpec) -> int:  # decoding stops at max_model_len
    return min(r.output_len, policy.max_model_len - r.prompt_len)


def class_figures(policy: Policy, name: str, tenant: str, priority: int, members: list[RequestSpec],
                  window_us: int) -> dict:
    """One audit class from its served requests arriving over ``window_us`` (docs/audit.md, step 1)."""
    n = len(members)
    priority = priority if policy.queue.uses_priority else 0
    if policy.queue.priority_polarity is Polarity.HIGHER_FIRST:
        priority = -priority
    return {
        "name": _name(name),
        "arrivals_per_min": ceil_div(n * 60_000_000, max(1, window_us)),
        "prompt_tokens": ceil_div(sum(r.prompt_len for r in members), n),
        "output_tokens": max(1, ceil_div(sum(_out_len(policy, r) for r in members), n)),
        "max_prompt_tokens": max(r.prompt_len for r in members),
        "priority": priority,
        "tenant": _name(tenant),
        "cancel_permille": ceil_div(sum(1 for r in members if r.cancel_us is not None) * 1000, n),
    }


def derive_records(policy: Policy, profile: Profile, served: list[RequestSpec], classes: list[dict], source: dict, *,
                   policy_source: str, profile_source: str, workload_source: str, queue_slo_ms: int | None = None,
                   ttft_slo_ms: int | None = None, tpot_slo_ms: int | None = None
                   ) -> tuple[AuditContract, AuditWorkload, dict]:
    """Steps 2-5 of the derivation, from the served requests and the class figures of step 1."""
    def out_len(r: RequestSpec) -> int:
        return _out_len(policy, r)

    b = policy.batch
    slots = b.max_num_seqs  # decode tokens one iteration can hold: one per running sequence
    prefill_per_iteration = min(b.prefill_token_cap, b.max_num_batched_tokens - slots)
    if prefill_per_iteration < 1:
        raise InputError(Problem("batch.max_num_seqs", b.max_num_seqs,
                                 f"< batch.max_num_batched_tokens={b.max_num_batched_tokens}: the audit's prefill "
                                 "share of an iteration is the budget left after one decode token per sequence"),
                         policy_source)
    if profile.model is None:
        raise InputError(Problem("model", None, "the model shape (layers, hidden, heads, kv_heads): the audit "
                                 "needs KV bytes per token"), profile_source)

    prefill_per_min = sum(c["arrivals_per_min"] * c["prompt_tokens"] for c in classes)
    decode_per_min = sum(c["arrivals_per_min"] * c["output_tokens"] for c in classes)
    mean_prompt = ceil_div(sum(r.prompt_len for r in served), len(served))
    mean_context = ceil_div(sum(r.prompt_len + out_len(r) for r in served), len(served))

    # 2. Device time the workload needs: full prefill-only and decode-only iterations at the budget.
    prefill_us = profile.iteration_us(prefill_per_iteration, prefill_per_iteration * mean_prompt, 0, 0)
    decode_us = profile.iteration_us(0, 0, slots, slots * mean_context)
    busy_us_per_min = ceil_div(prefill_per_min * prefill_us * slots + decode_per_min * decode_us * prefill_per_iteration,
                               prefill_per_iteration * slots)
    prefill_rate = max(1, prefill_per_min * 1_000_000 // busy_us_per_min)
    decode_rate = max(1, decode_per_min * 1_000_000 // busy_us_per_min)

    # 3. The steady-state iteration: the least fixed point of tau = T(prompt tokens arriving in tau,
    #    sequences active at tau), at most the full-budget iteration.
    full_us = profile.iteration_us(prefill_per_iteration, prefill_per_iteration * mean_prompt, slots,
                                   slots * mean_context)
    steps_per_request = [(c["arrivals_per_min"], ceil_div(c["prompt_tokens"], prefill_per_iteration)
                          + c["output_tokens"] - 1) for c in classes]

    def iteration_at(tau: int) -> int:
        x = min(prefill_per_iteration, ceil_div(prefill_per_min * tau, 60_000_000))
        n = min(slots, sum(ceil_div(a * steps * tau, 60_000_000) for a, steps in steps_per_request))
        return profile.iteration_us(x, x * mean_prompt, n, n * mean_context)

    tau, rounds, saturated = profile.iteration_us(0, 0, 0, 0), 0, False
    while True:
        rounds += 1
        nxt = iteration_at(tau)
        if nxt >= full_us or rounds >= 1_000_000:
            tau, saturated = full_us, True
            break
        if nxt <= tau:
            break
        tau = nxt
    iteration_ms = ceil_div(tau, 1000)
    decode_rate = max(decode_rate, ceil_div(1000, iteration_ms))  # every iteration serves >= 1 decode token
    chunk = prefill_per_iteration
    if policy.chunking.long_prefill_token_threshold:
        chunk = min(chunk, policy.chunking.long_prefill_token_threshold)
    chunk = max(1, min(chunk, prefill_rate * iteration_ms // 1000))
    if prefill_rate * iteration_ms < 1000:
        prefill_rate = ceil_div(1000, iteration_ms)  # the chunk floor above: one prompt token per iteration

    kv_bytes_per_token = profile.model.kv_bytes_per_token
    kv = policy.kv
    scope = _name(f"derived:{policy.name or 'policy'}:{profile.name}")
    contract_data = {
        "scope": scope,
        "total_tokens_per_s": prefill_rate + decode_rate,
        "prefill_tokens_per_s": prefill_rate,
        "decode_tokens_per_s": decode_rate,
        "iteration_ms": iteration_ms,
        "prefill_chunk_tokens": chunk,
        "active_sequence_cap": b.max_num_seqs,
        "kv_budget_bytes": kv.num_blocks * kv.block_size * kv_bytes_per_token,
        "kv_bytes_per_token": kv_bytes_per_token,
        "slo": {"queue_ms": queue_slo_ms if queue_slo_ms is not None else policy.timeouts.queue_timeout_ms,
                "ttft_ms": ttft_slo_ms, "tpot_ms": tpot_slo_ms},
        "admission_headroom_permille": min(999, ceil_div(kv.watermark_blocks * 1000, kv.num_blocks)),
        "fairness_bound_permille": 1000,
        "cancel_release_lag_ms": policy.cancellation.release_lag_steps * iteration_ms,
    }
    contract = validate(AuditContract, contract_data, f"<contract derived from {policy_source}>")
    workload_data = {"scope": scope, "contract_id": content_id(contract), "classes": classes}
    record = validate(AuditWorkload, workload_data, f"<workload derived from {workload_source}>")
    derivation = {
        "policy": policy.name, "profile": profile.name, **source,
        "requests_rejected_over_max_model_len": source["requests"] - len(served),
        "phase_mode": b.phase_mode.value,
        "budget_tokens_per_iteration": b.max_num_batched_tokens,
        "decode_slots_per_iteration": slots,
        "prefill_tokens_per_iteration": prefill_per_iteration,
        "mean_prompt_tokens": mean_prompt, "mean_context_tokens": mean_context,
        "prefill_tokens_per_min": prefill_per_min, "decode_tokens_per_min": decode_per_min,
        "prefill_iteration_us": prefill_us, "decode_iteration_us": decode_us, "full_iteration_us": full_us,
        "busy_us_per_min": busy_us_per_min,
        "steady_iteration_us": tau, "fixed_point_rounds": rounds, "saturated": saturated,
        "contract": contract.model_dump(mode="json"),
        "workload_record": record.model_dump(mode="json"),
    }
    return contract, record, derivation

