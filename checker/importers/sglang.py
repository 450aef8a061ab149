"""SGLang server arguments (``python -m sglang.launch_server ...``) -> policy.

Semantics: shared/reference/serving-schedulers.md section 2. SGLang runs a prefill batch whenever one
forms (prefill-first), chunks at most one request at a time, admits against an *estimate* of the running
requests' future growth and retracts the requests with the fewest output tokens when decode runs out of
KV. The estimate and the retraction's re-queueing have no exact counterpart in the policy model: both are
reported as approximations on every import.
"""

from __future__ import annotations

import math
from typing import Any

from checker.errors import UsageError
from checker.importers.common import (
    Arg,
    Draft,
    Given,
    Machine,
    Opt,
    Table,
    take_listed,
    missing,
    parse_cli,
    pool_tokens,
    refuse,
    take_length_limit,
    take_weight_offload,
)
from checker.importers.refusals import refuse_later

SYSTEM = "sglang"
POLICIES = ("fcfs", "lpm", "dfs-weight", "lof", "random", "priority", "hrrn", "shortest-prefill-first",
            "routing-key")


def _o(name: str, kind: str = "int", **kw: Any) -> Opt:
    return Opt(name, kind, **kw)


OPTIONS = [
    _o("context-length", minimum=2),
    _o("schedule-policy", "choice", choices=POLICIES),
    _o("chunked-prefill-size", minimum=-1),
    _o("max-prefill-tokens", minimum=1),
    _o("max-running-requests", minimum=1),
    _o("max-total-tokens", minimum=1),
    _o("max-queued-requests", minimum=1),
    _o("page-size", minimum=1),
    _o("mem-fraction-static", "float", minimum=0.0),
    _o("enable-priority-scheduling", "bool"),
    _o("schedule-low-priority-values-first", "bool"),
    _o("priority-scheduling-preemption-threshold", minimum=0),
    _o("disable-priority-preemption", "bool"),
    _o("retraction-policy", "choice", choices=("length", "priority")),
    _o("default-priority-value"),
    _o("abort-on-priority-when-disabled", "bool"),
    _o("schedule-conservativeness", "float", minimum=0.0),
    _o("disable-radix-cache", "bool"),
    _o("radix-eviction-policy", "str"),
    _o("enable-mixed-chunk", "bool"),
    _o("disable-overlap-schedule", "bool"),
    _o("tensor-parallel-size", aliases=("tp-size", "tp"), minimum=1),
    _o("pipeline-parallel-size", aliases=("pp-size",), minimum=1),
    _o("data-parallel-size", aliases=("dp-size", "dp"), minimum=1),
    _o("enable-dp-attention", "bool"),
    _o("speculative-algorithm", "str"),
    _o("kv-cache-dtype", "str"),
    _o("disaggregation-mode", "choice", choices=("null", "prefill", "decode")),
    _o("disaggregation-transfer-backend", "str"),
    _o("enable-hierarchical-cache", "bool"),
    # environment variables (KEY=VALUE on the command line)
    _o("SGLANG_REQ_WAITING_TIMEOUT", "float"),
    _o("SGLANG_REQ_RUNNING_TIMEOUT", "float"),
    _o("SGLANG_INIT_NEW_TOKEN_RATIO", "float"),
    _o("SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR", "float"),
    _o("SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS", "float"),
    _o("SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION"),
    _o("SGLANG_RETRACT_DECODE_STEPS"),
]
ENV = {o.name: o.name for o in OPTIONS if o.name.startswith("SGLANG_")}
NO_EFFECT = {
    "model-path": "str", "tokenizer-path": "str", "host": "str", "port": "int", "trust-remote-code": "bool",
    "dtype": "str", "served-model-name": "str", "log-level": "str", "random-seed": "int", "quantization": "str",
    "attention-backend": "str", "disable-cuda-graph": "bool", "cuda-graph-max-bs": "int", "enable-metrics": "bool",
    "api-key": "str", "chat-template": "str", "stream-interval": "int", "download-dir": "str", "revision": "str",
    "skip-server-warmup": "bool", "watchdog-timeout": "float", "log-requests": "bool", "enable-torch-compile": "bool",
    "device": "str", "base-gpu-id": "int", "reasoning-parser": "str", "tool-call-parser": "str",
    "grammar-backend": "str", "sleep-on-idle": "bool", "load-format": "str", "tokenizer-mode": "str",
    # production flags that change speed or memory outside the KV pool, never which request is scheduled
    "cuda-graph-bs": "str", "torch-compile-max-bs": "int", "ep-size": "int", "moe-a2a-backend": "str",
    "enable-eplb": "bool", "enable-multimodal": "bool", "mm-attention-backend": "str",
}
# Production flags that can change scheduling and that the policy model does not have: refused with the reason.
LORA = ("LoRA adapters: SGLang's scheduler stops filling a prefill batch when its adapters would exceed "
        "--max-loras-per-batch, which the policy model does not do")
REFUSED = {"enable-lora": ("bool", LORA), "max-loras-per-batch": ("int", LORA), "lora-paths": ("str", LORA)}
OPTIONS += [Opt(name, kind, aliases=("model",) if name == "model-path" else (), tags=frozenset({"no-effect"}))
            for name, kind in NO_EFFECT.items()]
OPTIONS += [Opt(name, kind, refused=why) for name, (kind, why) in REFUSED.items()]
OPTIONS += [Opt("cpu-offload-gb", "float", minimum=0.0)]
TABLE = Table("SGLang", OPTIONS)
KV_DTYPES = {"auto": None, "fp8_e5m2": 1, "fp8_e4m3": 1, "bf16": 2, "bfloat16": 2}


def _chunk_default(machine: Machine) -> tuple[int, str]:
    mem = machine.gpu_memory_gib
    if mem is None:
        return 4096, "SGLang's default when the GPU memory is unknown (--gpu-memory-gib not given)"
    if mem < 35:
        return 2048, f"SGLang's default on a {mem:g} GiB GPU (< 35 GB)"
    if mem < 160:
        return 8192, f"SGLang's default on a {mem:g} GiB GPU (< 160 GB)"
    return 16384, f"SGLang's default on a {mem:g} GiB GPU (>= 160 GB)"


RULES = ("vllm", "sglang")


def import_sglang(args: list[str], machine: Machine, rules: str = "vllm") -> Draft:
    """SGLang's server arguments as a policy. ``rules`` (batchcheck's ``--rules``): vllm maps them onto the
    vLLM-shaped rule sections (approximating SGLang's estimate and retraction); sglang onto the engine's own SGLang
    rules (``scheduler: sglang``, :func:`import_sglang_rules`)."""
    if rules == "sglang":
        return import_sglang_rules(args, machine)
    given = parse_cli(args, TABLE, env=ENV)
    draft = Draft(SYSTEM, "SGLang (prefill-first scheduler with retraction)")
    take_listed(given, TABLE, draft)
    ctx = take_length_limit(given, draft, "context-length", "the model's context length: SGLang reads it from the "
                            "model's config, which batchcheck does not have")
    _refusals(given, draft)

    # --- KV pool (token granularity, pages of --page-size)
    page, total, _, _ = _page_and_pool(given, draft, machine)
    draft.set("kv.num_blocks", total // page, "max_total_tokens / page size")
    draft.set("kv.allocation", "on_demand", "approximated: see the header")
    draft.approximate("kv.allocation", "on_demand", "SGLang admits against free KV minus an estimate of the running "
                      "requests' remaining output (new_token_ratio, 0.7 decaying to about 0.1 over 600 steps); the "
                      "policy model reserves nothing for future output, so it admits more while the ratio is high")
    for name in ("schedule-conservativeness", "SGLANG_INIT_NEW_TOKEN_RATIO", "SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR",
                 "SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS", "SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION",
                 "SGLANG_RETRACT_DECODE_STEPS"):
        arg = given.take(name)
        if arg is not None:
            draft.ignore(arg, "tunes SGLang's admission estimate or retraction, which are approximated")
    if total < ctx:
        draft.approximate("admission.reject_never_fits", False, f"SGLang rejects prompts longer than the pool "
                          f"({total} tokens) at arrival; the policy model leaves them waiting at the head")
    draft.set("admission.reject_never_fits", False)
    draft.set("admission.reserve_full_prompt", True, "the whole uncached prompt must fit the memory budget")

    # --- queue order and priority
    priority = _queue(given, draft)

    # --- budgets
    chunk = _chunk(given, draft, machine)
    chunking = chunk > 0
    mpt_arg = given.take("max-prefill-tokens")
    mpt = 16384 if mpt_arg is None else mpt_arg.value
    if mpt_arg is None:
        draft.assume_input("--max-prefill-tokens", 16384, "SGLang's default; the bound is max(this, context length)")
    input_budget = max(mpt, ctx)
    prefill = min(chunk, input_budget) if chunking else input_budget
    running = _running(given, draft, total, ctx)
    draft.set("batch.max_num_seqs", running, "--max-running-requests (capped at max_total_tokens // 2)"
              if "max-running-requests" in given else "assumed (default)")
    if running <= prefill:
        draft.set("batch.max_num_batched_tokens", prefill,
                  "min(chunked_prefill_size, max(max_prefill_tokens, context))" if chunking
                  else "max(max_prefill_tokens, context length)")
    else:  # decode steps are not under the prefill budget: a larger step budget, prefill capped by a share
        share = prefill / running
        while int(share * running) < prefill:
            share = math.nextafter(share, 1.0)
        draft.set("batch.max_num_batched_tokens", running, "a decode step runs every running request")
        draft.set("batch.prefill_share", share, f"prefill tokens per step <= {prefill}")
    draft.set("batch.phase_mode", "prefill_first", "a prefill batch runs whenever one forms; decodes wait")

    # --- preemption
    threshold_arg, retraction, inversion = _preemption_args(given, draft, priority)
    triggers = ["kv_growth_fails"] + (["priority_inversion"] if inversion else [])
    draft.set("preemption.triggers", triggers, "retraction; and priority preemption" if inversion
              else "retraction when decode runs out of KV")
    by_priority = retraction is not None and retraction.value == "priority"
    if inversion and not by_priority:
        draft.set("preemption.victim", "lowest_priority", "approximated: see the header")
        draft.approximate("preemption.victim", "lowest_priority", "SGLang retracts the request with the fewest "
                          "output tokens on KV exhaustion (--retraction-policy length) but preempts the lowest "
                          "priority on inversion; the policy model has one victim order")
    elif by_priority:
        draft.set("preemption.victim", "lowest_priority", retraction.shown)
    else:
        draft.set("preemption.victim", "fewest_generated", "retract_decode: fewest output tokens, then longest prompt")
    if retraction is None:
        draft.assume_input("--retraction-policy", "length", "SGLang's default: retract the fewest output tokens "
                           "first")
    _threshold(draft, threshold_arg, priority, inversion)
    draft.set("preemption.mode", "recompute", "a retracted request loses its KV")
    draft.set("preemption.block_admission_after_preempt", True, "retraction happens in a decode step")
    draft.set("queue.preempted_requeue", "by_order", "approximated: see the header")
    draft.approximate("queue.preempted_requeue", "by_order", "SGLang appends a retracted request to the waiting "
                      "queue (behind requests of its priority that arrived later); the policy model re-queues it "
                      "at the front or at its arrival order. SGLang also retracts until 20 decode steps fit, the "
                      "policy model until the request fits")
    draft.set("queue.head_of_line", "strict", "the prefill adder stops at the first request that does not fit")

    # --- admission, cancellation, timeouts
    _queue_cap(given, draft, priority)
    draft.set("cancellation.release_lag_steps", 1, "a running abort is filtered out at the next step")
    _waiting_timeout(given, draft)
    given.check_all_taken()
    return draft


def _refusals(given: Given, draft: Draft, sglang_rules: bool = False) -> None:
    """What neither mapping can express: refused by name (exit 2; all of them reported together, refusals.py).
    Under the vllm mapping mixed chunk is refused too, and --disable-overlap-schedule is ignored (the sglang rules
    read it: import_sglang_rules)."""
    who = "by the sglang rules" if sglang_rules else "for SGLang"
    take_weight_offload(given, draft, "cpu-offload-gb", "--max-total-tokens" if "max-total-tokens" in given else None)
    for name in ("pipeline-parallel-size", "data-parallel-size"):
        arg = given.take(name)
        if arg is not None and arg.value > 1:
            refuse_later(refuse(arg, "1: the policy model is one engine running one batch at a time"))
    unsupported = [("enable-dp-attention", "data-parallel attention batches per rank")]
    if not sglang_rules:
        unsupported.append(("enable-mixed-chunk", "mixing decodes into the prefill batch shares its budget in a way "
                                                  "the policy model does not express"))
    unsupported.append(("abort-on-priority-when-disabled", "batchcheck workloads give every request a priority, "
                                                           "which this flag would abort"))
    for name, why in unsupported:
        arg = given.take(name)
        if arg is not None and arg.value:
            refuse_later(refuse(arg, f"false: {why}"))
    arg = given.take("speculative-algorithm")
    if arg is not None:
        refuse_later(refuse(arg, "no speculative decoding: draft tokens per step are not modelled"))
    mode, backend = given.take("disaggregation-mode"), given.take("disaggregation-transfer-backend")
    if mode is not None and mode.value != "null":
        refuse_later(refuse(mode, "null: SGLang's disaggregation queues (the decode side's prealloc and transfer "
                            "queues, which reserve KV before the transfer; the prefill side's bootstrap and inflight "
                            "queues) are not " + ("modelled by the sglang rules" if sglang_rules else
                                                  "modelled; batchcheck's connector model follows vLLM 0.33's rules "
                                                  "(docs/semantics.md)")))
    if backend is not None:
        draft.ignore(backend, "no effect without --disaggregation-mode prefill or decode")
    arg = given.take("enable-hierarchical-cache")
    if arg is not None and arg.value:
        refuse_later(refuse(arg, f"false: HiCache's host-memory KV tier (loads back into the device pool) is not "
                            f"modelled {who}"))
    arg = given.take("SGLANG_REQ_RUNNING_TIMEOUT")
    if arg is not None and arg.value > 0:
        refuse_later(refuse(arg, "0: a timeout on running requests is not modelled (only queue timeouts)"))
    elif arg is not None:
        draft.ignore(arg, "<= 0 disables the timeout")
    if not sglang_rules:
        arg = given.take("disable-overlap-schedule")
        if arg is not None:
            draft.ignore(arg, "the policy model decides each step after the previous one completed, overlap or not")
    arg = given.take("default-priority-value")
    if arg is not None:
        draft.ignore(arg, "batchcheck workloads give every request a priority")


def _page_and_pool(given: Given, draft: Draft, machine: Machine) -> tuple[int, int, Arg | None, Arg | None]:
    """--page-size (kv.block_size) and the pool in tokens (_pool); also the --tp-size and --kv-cache-dtype args
    that sized it."""
    page_arg = given.take("page-size")
    page = 1 if page_arg is None else page_arg.value
    if page_arg is None:
        draft.assume("kv.block_size", 1, "--page-size not given: SGLang's default, one token per page")
    else:
        draft.set("kv.block_size", page, page_arg.shown)
    tp_arg = given.take("tensor-parallel-size")
    tp = 1 if tp_arg is None else tp_arg.value
    dtype_arg = given.take("kv-cache-dtype")
    if dtype_arg is not None and dtype_arg.value not in KV_DTYPES:
        raise refuse(dtype_arg, "one of: " + ", ".join(KV_DTYPES))
    dtype_bytes = None if dtype_arg is None else KV_DTYPES[dtype_arg.value]
    total = _pool(given, draft, machine, tp, page, dtype_bytes)
    if tp_arg is None and machine.given():
        draft.assume_input("--tp-size", 1, "not given: one GPU, which holds all the weights and KV")
    return page, total, tp_arg, dtype_arg


def _chunk(given: Given, draft: Draft, machine: Machine) -> int:
    """--chunked-prefill-size (chunking.enabled); -1 disables chunked prefill."""
    chunk_arg = given.take("chunked-prefill-size")
    if chunk_arg is None:
        chunk, why = _chunk_default(machine)
        draft.assume_input("--chunked-prefill-size", chunk, why)
    else:
        chunk = chunk_arg.value
        if chunk == 0 or chunk < -1:
            raise refuse(chunk_arg, "a chunk size >= 1, or -1 to disable chunked prefill")
    draft.set("chunking.enabled", chunk > 0, chunk_arg.shown if chunk_arg is not None else "assumed (default)")
    return chunk


def _preemption_args(given: Given, draft: Draft, priority: bool) -> tuple[Arg | None, Arg | None, bool]:
    """The priority-preemption flags (ignored without priority scheduling): the threshold arg, the
    --retraction-policy arg, and whether priority preemption is on."""
    threshold_arg = given.take("priority-scheduling-preemption-threshold")
    no_preempt = given.take("disable-priority-preemption")
    retraction = given.take("retraction-policy")
    inversion = priority and not (no_preempt is not None and no_preempt.value)
    if not priority:
        for arg in (threshold_arg, no_preempt):
            if arg is not None:
                draft.ignore(arg, "read only with --enable-priority-scheduling")
    if retraction is not None and retraction.value == "priority" and not priority:
        raise refuse(retraction, "length unless --enable-priority-scheduling is given")
    return threshold_arg, retraction, inversion


def _threshold(draft: Draft, threshold_arg: Arg | None, priority: bool, inversion: bool) -> None:
    if inversion:
        if threshold_arg is None:
            draft.assume("preemption.priority_inversion_threshold", 10, "--priority-scheduling-preemption-threshold "
                         "not given: SGLang's default")
        else:
            draft.set("preemption.priority_inversion_threshold", threshold_arg.value, threshold_arg.shown)
    elif priority and threshold_arg is not None:
        draft.ignore(threshold_arg, "--disable-priority-preemption is given")


def _queue_cap(given: Given, draft: Draft, priority: bool) -> None:
    queued = given.take("max-queued-requests")
    if queued is not None:
        if priority:
            raise refuse(queued, "no queue cap with --enable-priority-scheduling: SGLang then aborts the lowest-"
                         "priority queued request for a higher-priority arrival, which the policy model cannot "
                         "express")
        draft.set("admission.max_queue_len", queued.value, queued.shown)


def _waiting_timeout(given: Given, draft: Draft) -> None:
    waiting = given.take("SGLANG_REQ_WAITING_TIMEOUT")
    if waiting is not None and waiting.value > 0:
        draft.set("timeouts.queue_timeout_ms", max(1, round(waiting.value * 1000)), waiting.shown)
        draft.set("timeouts.action", "reject", "SGLang aborts the request (503)")
    elif waiting is not None:
        draft.ignore(waiting, "<= 0 disables the timeout")


def _queue(given: Given, draft: Draft) -> bool:
    enable = given.take("enable-priority-scheduling")
    priority = enable is not None and enable.value
    low_first = given.take("schedule-low-priority-values-first")
    policy = given.take("schedule-policy")
    radix_off = given.take("disable-radix-cache")
    eviction = given.take("radix-eviction-policy")
    no_radix = radix_off is not None and radix_off.value
    for arg in (radix_off, eviction):
        if arg is not None:
            draft.ignore(arg, "the policy model has no prefix cache: exact when requests share no prefix")
    name = "fcfs" if policy is None else policy.value
    if policy is None:
        draft.assume_input("--schedule-policy", "fcfs", "SGLang's default")
    base = "fcfs"
    if name in ("lpm", "dfs-weight"):
        if not no_radix:
            raise refuse(policy, f"fcfs, or {name} with --disable-radix-cache (SGLang then falls back to fcfs): "
                         f"{name} orders by the radix prefix cache, which the policy model does not have")
        draft.approximate("queue.order", "fcfs", f"--schedule-policy {name} falls back to fcfs when the radix "
                          "cache is disabled (SGLang does this itself)")
    elif name == "shortest-prefill-first":
        if priority:
            raise refuse(policy, "fcfs with --enable-priority-scheduling: priority within shortest-prefill-first "
                         "is not modelled")
        base = "shortest_prompt_first"
        if not no_radix:
            draft.approximate("queue.order", base, "SGLang orders by uncached prefill length; the policy model by "
                              "prompt length (equal when requests share no prefix)")
    elif name == "priority":
        raise refuse(policy, "fcfs with --enable-priority-scheduling (SGLang orders by priority through that flag)")
    elif name != "fcfs":
        why = {"lof": "longest max_new_tokens first", "random": "a random order",
               "hrrn": "the highest response ratio (token-based aging)",
               "routing-key": "grouping by routing key"}[name]
        raise refuse(policy, f"fcfs, or fcfs with --enable-priority-scheduling: {name} orders by {why}, which the "
                     "policy model cannot express")
    if priority:
        draft.set("queue.order", "priority", enable.shown)  # type: ignore[union-attr]
        if low_first is not None and low_first.value:
            draft.set("queue.priority_polarity", "lower_first", low_first.shown)
        else:
            draft.set("queue.priority_polarity", "higher_first", "SGLang: a higher priority value is served first")
    else:
        draft.set("queue.order", base, policy.shown if policy is not None and base != "fcfs" else None)
        if low_first is not None:
            draft.ignore(low_first, "read only with --enable-priority-scheduling")
    return priority


def _pool(given: Given, draft: Draft, machine: Machine, tp: int, page: int, dtype_bytes: int | None) -> int:
    total_arg = given.take("max-total-tokens")
    frac_arg = given.take("mem-fraction-static")
    if total_arg is not None and not machine.given():
        if frac_arg is not None:
            draft.ignore(frac_arg, "--max-total-tokens sizes the pool")
        total = total_arg.value
    else:
        if frac_arg is None:
            fraction = 0.88
            draft.assume_input("--mem-fraction-static", 0.88, "SGLang picks it at start-up (about 0.88); sizes the "
                               "KV pool")
        else:
            fraction = frac_arg.value
            if not 0 < fraction <= 1:
                raise refuse(frac_arg, "a fraction in (0, 1]")
        if total_arg is None and not machine.given():
            raise missing("--max-total-tokens", "the KV pool size in tokens (SGLang's log: max_total_num_tokens), "
                          "or a machine: --gpu-memory-gib, --model-weights-gib, --kv-bytes-per-token or --profile")
        total = pool_tokens(machine, draft, fraction=fraction, fraction_name="--mem-fraction-static", of_free=False,
                            tensor_parallel=tp, server="SGLang", kv_dtype_bytes=dtype_bytes)
        if total_arg is not None:
            total = min(total, total_arg.value)
        draft.approximate("kv.num_blocks", total // page, "computed from the declared machine, not measured: "
                          "SGLang's start-up log prints max_total_num_tokens")
    total = total // page * page
    if total < page:
        arg = total_arg if total_arg is not None else frac_arg
        if arg is not None:
            raise refuse(arg, f"a pool of at least one page ({page} tokens)")
        raise missing("--max-total-tokens", f"a pool of at least one page ({page} tokens)")
    return total


def _running(given: Given, draft: Draft, total: int, ctx: int) -> int:
    arg: Arg | None = given.take("max-running-requests")
    if arg is not None:
        if arg.value > total // 2:
            draft.approximate("batch.max_num_seqs", total // 2, f"{arg.note()} is capped by SGLang at "
                              "max_total_tokens // 2")
        return max(1, min(arg.value, total // 2))
    estimated = max(min(int(total / ctx * 512), 4096), 2048)
    value = max(1, min(estimated, total // 2))
    draft.assume("batch.max_num_seqs", value, "--max-running-requests not given: SGLang's default "
                 "min(clamp(max_total_tokens / context_length x 512, 2048, 4096), max_total_tokens // 2)")
    return value


# ----------------------------------------------------------------------------------------- --rules sglang
# SGLang's environment knobs of the new-token ratio and retraction -> (sglang.* field, default, the range the
# policy accepts, as the refusal says it)
RATIO_ENV = {
    "SGLANG_INIT_NEW_TOKEN_RATIO": ("init_new_token_ratio", 0.7, lambda v: 0 < v <= 1, "a ratio in (0, 1]"),
    "SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR": ("min_new_token_ratio_factor", 0.14, lambda v: 0 <= v <= 1,
                                          "a factor in [0, 1]"),
    "SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS": ("new_token_ratio_decay_steps", 600, lambda v: 0 < v <= 1_000_000,
                                           "a number of steps > 0 and <= 1000000"),
    "SGLANG_RETRACT_DECODE_STEPS": ("retract_decode_steps", 20, lambda v: 0 <= v <= 1_000_000,
                                    "an integer >= 0 and <= 1000000"),
    "SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION": ("clip_max_new_tokens", 4096, lambda v: 1 <= v <= 10_000_000,
                                              "an integer >= 1 and <= 10000000"),
}
CACHE_AWARE = ("lpm", "dfs-weight", "hrrn")
RADIX_ORDERS = ("lpm", "dfs-weight")  # the cache-aware orders the sglang rules model (with the radix cache)


def import_sglang_rules(args: list[str], machine: Machine) -> Draft:
    """SGLang 0.5.23's server arguments onto the engine's SGLang rules (policy ``scheduler: sglang`` and the
    ``sglang:`` section; checker/semantics/sglang.py). Each option known to the table is mapped, ignored with a
    reason, or refused by name."""
    given = parse_cli(args, TABLE, env=ENV)
    draft = Draft(SYSTEM, "SGLang 0.5.23 under batchcheck's SGLang rules (--rules sglang: scheduler sglang)")
    take_listed(given, TABLE, draft)
    ctx = take_length_limit(given, draft, "context-length", "the model's context length: SGLang reads it from the "
                            "model's config, which batchcheck does not have")
    draft.set("scheduler", "sglang", "--rules sglang: SGLang's own loop, prefill adder, ratio and retraction")
    _refusals(given, draft, sglang_rules=True)
    radix = _rules_radix(given, draft)

    # --- the loop: the rules model event_loop_normal
    overlap_off = given.take("disable-overlap-schedule")
    if overlap_off is None or not overlap_off.value:
        draft.approximate("scheduler", "sglang", "SGLang's default loop is the overlap scheduler "
                          "(event_loop_overlap); the sglang rules model the normal loop (--disable-overlap-schedule), "
                          "whose results (finishes, frees, output tokens) come one iteration earlier than the "
                          "overlap loop's")

    # --- KV pool, in pages of --page-size
    page, total, tp_arg, dtype_arg = _page_and_pool(given, draft, machine)
    if not machine.given():
        for arg in (tp_arg, dtype_arg):
            if arg is not None:
                draft.ignore(arg, "sizes the KV pool only from a declared machine (--gpu-memory-gib ...); "
                             "--max-total-tokens gives the pool here")
    draft.set("kv.num_blocks", total // page, "the pool in whole pages (max_total_tokens // page size)")
    if total < ctx:
        draft.approximate("admission.reject_never_fits", False, f"SGLang rejects prompts longer than the pool "
                          f"({total} tokens) at arrival; the policy model leaves them waiting at the head")

    # --- the queue: --schedule-policy and priority scheduling
    priority = _rules_queue(given, draft, radix)

    # --- budgets
    chunk = _chunk(given, draft, machine)
    chunking = chunk > 0
    mpt_arg = given.take("max-prefill-tokens")
    if mpt_arg is None:
        mpt = 16384
        draft.assume("sglang.max_prefill_tokens", mpt, "--max-prefill-tokens not given: SGLang's default")
    else:
        mpt = mpt_arg.value
        draft.set("sglang.max_prefill_tokens", mpt, mpt_arg.shown)
    running = _running(given, draft, total, ctx)
    comment = "--max-running-requests" if "max-running-requests" in given else "assumed (default)"
    draft.set("batch.max_num_seqs", running, comment)  # above the chunk budget too: decode batches are not under it
    if chunking:
        draft.set("batch.max_num_batched_tokens", chunk, "--chunked-prefill-size: the chunk budget of a prefill "
                  "batch")
    else:
        draft.set("batch.max_num_batched_tokens", ctx + mpt, "no chunking: the first request whole (up to the "
                  "context length), the others up to --max-prefill-tokens")
    draft.set("batch.phase_mode", "prefill_first", "a prefill batch runs whenever one forms; decodes wait")
    mixed = given.take("enable-mixed-chunk")
    if mixed is not None and mixed.value and not chunking:
        draft.ignore(mixed, "no effect without chunked prefill: SGLang mixes decodes only into chunked prefill "
                     "batches")
        draft.set("sglang.mixed_chunk", False)
    elif mixed is not None:
        draft.set("sglang.mixed_chunk", bool(mixed.value), mixed.shown)
    else:
        draft.assume("sglang.mixed_chunk", False, "--enable-mixed-chunk not given: SGLang's default")

    # --- the new-token ratio and retraction
    cons = given.take("schedule-conservativeness")
    if cons is None:
        draft.assume("sglang.schedule_conservativeness", 1.0, "--schedule-conservativeness not given: SGLang's "
                     "default")
    else:
        if not 0 < cons.value <= 100:
            raise refuse(cons, "a number > 0 and <= 100")
        draft.set("sglang.schedule_conservativeness", cons.value, cons.shown)
    for env, (key, default, ok, expected) in RATIO_ENV.items():
        arg = given.take(env)
        if arg is None:
            draft.assume(f"sglang.{key}", default, f"{env} not set: SGLang's default")
            continue
        value = arg.value
        if key in ("retract_decode_steps", "clip_max_new_tokens") or (key == "new_token_ratio_decay_steps"
                                                                       and float(value).is_integer()):
            value = int(value)
        if not ok(value):
            raise refuse(arg, expected)
        draft.set(f"sglang.{key}", value, arg.shown)

    # --- preemption: retraction always, priority preemption under priority scheduling
    threshold_arg, retraction, inversion = _preemption_args(given, draft, priority)
    triggers = ["kv_growth_fails"] + (["priority_inversion"] if inversion else [])
    draft.set("preemption.triggers", triggers, "retraction; and priority preemption (PrefillAdder."
              "preempt_to_schedule)" if inversion else "retraction when decode runs out of KV")
    if retraction is None:
        draft.assume("preemption.victim", "fewest_generated", "--retraction-policy not given: SGLang's default "
                     "length: retract the fewest output tokens first, the longest prompt among equals")
    elif retraction.value == "priority":
        draft.set("preemption.victim", "lowest_priority", retraction.shown)
    else:
        draft.set("preemption.victim", "fewest_generated", retraction.shown)
    _threshold(draft, threshold_arg, priority, inversion)

    # --- admission, timeouts
    _queue_cap(given, draft, priority)
    _waiting_timeout(given, draft)
    given.check_all_taken()
    return draft


def _rules_radix(given: Given, draft: Draft) -> bool:
    """--disable-radix-cache -> sglang.radix_cache (on by default); --radix-eviction-policy: lru only. Whether the
    cache is on."""
    radix_off = given.take("disable-radix-cache")
    eviction = given.take("radix-eviction-policy")
    if radix_off is not None and radix_off.value:
        draft.set("sglang.radix_cache", False, radix_off.shown)
        if eviction is not None:
            draft.ignore(eviction, "no effect with --disable-radix-cache")
        return False
    if radix_off is None:
        draft.assume("sglang.radix_cache", True, "--disable-radix-cache not given: SGLang's radix cache is on by "
                     "default")
    else:
        draft.set("sglang.radix_cache", True, radix_off.shown)
    if eviction is None:
        draft.assume_input("--radix-eviction-policy", "lru", "SGLang's default")
    elif eviction.value.lower() != "lru":
        raise refuse(eviction, "lru (the sglang rules evict the radix tree's least recently used leaves first), or "
                     "--disable-radix-cache")
    return True


def _rules_queue(given: Given, draft: Draft, radix: bool) -> bool:
    """--schedule-policy -> sglang.schedule_policy; priority scheduling -> queue.order and its polarity."""
    enable = given.take("enable-priority-scheduling")
    priority = enable is not None and enable.value
    low_first = given.take("schedule-low-priority-values-first")
    policy = given.take("schedule-policy")
    name = "fcfs" if policy is None else policy.value
    if policy is None:
        draft.assume("sglang.schedule_policy", "fcfs", "--schedule-policy not given: SGLang's default")
    elif name in ("fcfs", "lof") or (radix and name in RADIX_ORDERS):
        draft.set("sglang.schedule_policy", name, policy.shown)
    elif radix and name in ("hrrn", "shortest-prefill-first"):
        raise refuse(policy, "fcfs, lof, lpm or dfs-weight with the radix cache: the sglang rules do not model "
                     f"{name}'s order")
    elif name in CACHE_AWARE:
        draft.set("sglang.schedule_policy", "fcfs", f"{policy.note()}: fcfs without the radix cache")
        draft.approximate("sglang.schedule_policy", "fcfs", f"--schedule-policy {name} is cache-aware: SGLang "
                          "itself falls back to fcfs when the radix cache is disabled (SchedulePolicy's validation)")
    elif name == "shortest-prefill-first":
        raise refuse(policy, "fcfs or lof: SGLang refuses shortest-prefill-first with the radix cache disabled")
    elif name == "priority":
        raise refuse(policy, "fcfs with --enable-priority-scheduling (SGLang orders by priority through that flag)")
    else:
        why = {"random": "random shuffles the queue (not reproducible)",
               "routing-key": "routing-key groups the queue by routing key"}[name]
        raise refuse(policy, f"fcfs or lof (with or without --enable-priority-scheduling): {why}, which the sglang "
                     "rules do not model")
    if priority:
        draft.set("queue.order", "priority", enable.shown)  # type: ignore[union-attr]
        if low_first is not None and low_first.value:
            draft.set("queue.priority_polarity", "lower_first", low_first.shown)
        else:
            draft.set("queue.priority_polarity", "higher_first", "SGLang: a higher priority value is served first")
    else:
        draft.set("queue.order", "fcfs", "the queue in entry order (sglang.schedule_policy sorts it)")
        if low_first is not None:
            draft.ignore(low_first, "read only with --enable-priority-scheduling")
    return priority
