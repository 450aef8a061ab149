"""Hypothesis strategies for small policies and small request scenarios.

Used by the conformance and property tests, and usable in a user's own tests::

    from hypothesis import given
    from checker.strategies import small_policies, small_scenarios

Policies are valid by construction (they pass the pydantic schema); scenarios have a few requests
numbered in arrival order, some of them too long, some cancelled.
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import strategies as st

from checker.policy import (Allocation, HeadOfLine, PhaseMode, Policy, Polarity, PreemptMode, QueueOrder,
                            Requeue, Trigger, Victim)
from checker.requests import RequestSpec

SYMBOLIC_MODES = list(PhaseMode)  # the phase modes the symbolic step encodes (all of them)


@st.composite
def small_policies(draw: st.DrawFn, modes: list[PhaseMode] | None = None) -> Policy:
    """Policies with tiny budgets and pools, so that every rule fires within a few steps."""
    chunking = draw(st.booleans())
    max_model_len = draw(st.integers(8, 80))
    max_num_seqs = draw(st.integers(1, 5))
    low = max(max_num_seqs, 2 if chunking else max_model_len)
    budget = draw(st.integers(low, max(low, 96)))
    order = draw(st.sampled_from(list(QueueOrder)))
    priority_order = order in (QueueOrder.PRIORITY, QueueOrder.PRIORITY_AGING)
    triggers = [Trigger.KV_GROWTH_FAILS] if draw(st.sampled_from([True, True, False])) else []
    if priority_order and draw(st.booleans()):
        triggers.append(Trigger.PRIORITY_INVERSION)
    swap = draw(st.booleans()) and bool(triggers)
    prefill_share = None
    if draw(st.booleans()):
        share = draw(st.sampled_from([0.25, 0.5, 0.75, 1.0]))
        if chunking or int(share * budget) >= max_model_len:
            prefill_share = share
    data = {
        "name": "generated",
        "max_model_len": max_model_len,
        "admission": {
            "max_inflight": draw(st.sampled_from([None, None, None, 2, 4])),
            "max_queue_len": draw(st.sampled_from([None, None, None, 0, 2])),
            "max_queued_tokens": draw(st.sampled_from([None, None, None, 30, 100])),
            "reject_never_fits": draw(st.booleans()),
            "reserve_full_prompt": draw(st.booleans()),
        },
        "queue": {
            "order": order.value,
            "priority_polarity": draw(st.sampled_from(list(Polarity))).value,
            "head_of_line": draw(st.sampled_from(list(HeadOfLine))).value,
            "preempted_requeue": draw(st.sampled_from(list(Requeue))).value,
            **({"aging_interval_ms": draw(st.integers(1, 4))} if order is QueueOrder.PRIORITY_AGING else {}),
            **({"vtc": {"input_weight": draw(st.integers(0, 3)), "output_weight": draw(st.integers(0, 3))}}
               if order is QueueOrder.TENANT_FAIR else {}),
        },
        "batch": {
            "max_num_seqs": max_num_seqs,
            "max_num_batched_tokens": budget,
            "phase_mode": draw(st.sampled_from(modes or list(PhaseMode))).value,
            "prefill_share": prefill_share,
        },
        "chunking": {
            "enabled": chunking,
            "long_prefill_token_threshold": draw(st.integers(0, max_model_len)) if chunking and draw(st.booleans()) else 0,
            "threshold_when_alone": draw(st.booleans()),
            "threshold_adaptive": draw(st.booleans()),
        },
        "kv": {
            "num_blocks": draw(st.integers(1, 24)),
            "block_size": draw(st.sampled_from([1, 2, 4, 4, 8])),
            "allocation": draw(st.sampled_from([Allocation.ON_DEMAND, Allocation.ON_DEMAND,
                                                Allocation.FULL_RESERVATION])).value,
            "watermark": draw(st.sampled_from([0.0, 0.0, 0.1, 0.3])),
            "check_allocation": draw(st.sampled_from([True, True, True, False])) or not triggers,
            "swap_blocks": draw(st.integers(1, 20)) if swap else 0,
        },
        "preemption": {
            "triggers": [t.value for t in triggers],
            "victim": draw(st.sampled_from(list(Victim))).value,
            "mode": (PreemptMode.SWAP if swap else PreemptMode.RECOMPUTE).value,
            "block_admission_after_preempt": draw(st.booleans()),
            "priority_inversion_threshold": draw(st.integers(0, 2)),
        },
        "cancellation": {"release_lag_steps": draw(st.integers(0, 3))},
        "timeouts": {"queue_timeout_ms": draw(st.none() | st.integers(1, 12))},
    }
    return Policy.model_validate(data)


@dataclass(frozen=True)
class Scenario:
    policy: Policy
    specs: list[RequestSpec]
    num_tenants: int
    step_us: int  # fixed time per step, so timeouts and aging (in ms) fire within a few steps


@st.composite
def small_sglang_policies(draw: st.DrawFn) -> Policy:
    """Small policies under SGLang's rules (scheduler: sglang): pages of 1-8 tokens, pools of a few pages, every
    queue order, priority preemption, mixed chunk, chunking on or off, and ratio knobs that reach retraction."""
    page = draw(st.sampled_from([1, 2, 4, 8]))
    max_model_len = draw(st.integers(16, 80))
    chunking = draw(st.booleans())
    max_num_seqs = draw(st.integers(1, 5))
    prefill = draw(st.integers(8, 64))
    budget = page * draw(st.integers(1, 64 // page)) if chunking else max_model_len + prefill  # a page multiple
    priority = draw(st.booleans())
    preempts = priority and draw(st.booleans())
    data = {
        "name": "generated_sglang", "scheduler": "sglang", "max_model_len": max_model_len,
        "queue": {"order": "priority" if priority else "fcfs",
                  "priority_polarity": draw(st.sampled_from(list(Polarity))).value},
        "batch": {"max_num_seqs": max_num_seqs, "max_num_batched_tokens": budget, "phase_mode": "prefill_first"},
        "chunking": {"enabled": chunking},
        "kv": {"block_size": page, "num_blocks": draw(st.integers(max(2, 16 // page), max(3, 160 // page)))},
        "preemption": {"triggers": ["kv_growth_fails"] + (["priority_inversion"] if preempts else []),
                       "priority_inversion_threshold": draw(st.integers(0, 2)),
                       "victim": draw(st.sampled_from(["fewest_generated", "lowest_priority"]))
                       if priority else "fewest_generated"},
        "sglang": {"schedule_policy": draw(st.sampled_from(["fcfs", "lof"])), "max_prefill_tokens": prefill,
                   "mixed_chunk": chunking and draw(st.booleans()),
                   "init_new_token_ratio": draw(st.sampled_from([0.05, 0.3, 0.7, 1.0])),
                   "new_token_ratio_decay_steps": draw(st.sampled_from([3, 20, 600])),
                   "retract_decode_steps": draw(st.sampled_from([0, 2, 20])),
                   "clip_max_new_tokens": draw(st.sampled_from([4, 4096]))},
    }
    return Policy.model_validate(data)


@st.composite
def small_scenarios(draw: st.DrawFn, max_requests: int = 5, modes: list[PhaseMode] | None = None) -> Scenario:
    policy = draw(small_policies(modes))
    step_us = 1000
    n = draw(st.integers(1, max_requests))
    arrivals = sorted(draw(st.lists(st.integers(0, 8), min_size=n, max_size=n)))
    specs = []
    for rid, arrival_step in enumerate(arrivals):
        output = draw(st.integers(1, 16))
        cancel = draw(st.none() | st.integers(0, 12))
        specs.append(RequestSpec(
            rid=rid, arrival_us=arrival_step * step_us,
            prompt_len=draw(st.integers(1, policy.max_model_len // 2) | st.integers(1, policy.max_model_len + 4)),
            output_len=output, max_output=output + draw(st.integers(0, 6)),
            priority=draw(st.integers(0, 3)), tenant=draw(st.integers(0, 1)), cls=0,
            cancel_us=None if cancel is None else (arrival_step + cancel) * step_us))
    return Scenario(policy, specs, 2, step_us)
