"""vLLM engine arguments (``vllm serve`` flags or its ``--config`` YAML) -> policy.

Three eras with different scheduler semantics (shared/reference/vllm-v1-scheduler.md, serving-schedulers.md
section 1): V0 (< 0.8: prefill-first without chunking, swap preemption, priority-inversion preemption, a
1 % watermark), early V1 (0.8-0.11: the long-prefill cap always applies, no watermark, no full-sequence
admission check) and V1 as of 0.33 (the reference version; later 0.x versions are read as 0.33).
"""

from __future__ import annotations

import json
from typing import Any

from checker.errors import InputError, Problem, UsageError
from checker.loading import parse_json
from checker.importers.common import (
    GIB,
    Arg,
    Draft,
    Given,
    Machine,
    Opt,
    Table,
    take_listed,
    parse_cli,
    parse_mapping,
    parse_version,
    pool_tokens,
    refuse,
    take_length_limit,
    take_weight_offload,
)
from checker.importers.refusals import refuse_later

SYSTEM = "vllm"
V0, V1_EARLY, V1 = "v0", "v1-early", "v1"
ALL = frozenset({V0, V1_EARLY, V1})
OLD = frozenset({V0, V1_EARLY})  # options that went away with the V0 engine
NEW = frozenset({V1})  # options of the 2026 releases (the reference describes them for 0.33)
V1_ALL = frozenset({V1_EARLY, V1})
REFERENCE_VERSION = (0, 33)
ASYNC_DEFAULT_SINCE = (0, 29)  # async scheduling on unless --no-async-scheduling (docs/speculative.md)
USAGE_CONTEXTS = ("api-server", "llm-class")


def _o(name: str, kind: str = "int", eras: frozenset[str] = ALL, **kw: Any) -> Opt:
    return Opt(name, kind, tags=eras, **kw)


OPTIONS = [
    # mapped to policy fields
    _o("max-model-len", "tokens", minimum=2),
    _o("max-num-seqs", minimum=1),
    _o("max-num-batched-tokens", minimum=1),
    _o("enable-chunked-prefill", "bool"),
    _o("scheduling-policy", "choice", choices=("fcfs", "priority")),
    _o("block-size", minimum=1),
    _o("long-prefill-token-threshold", minimum=0),
    _o("gpu-memory-utilization", "float", minimum=0.0),
    _o("num-gpu-blocks-override", minimum=2),
    _o("kv-cache-memory-bytes", "tokens", V1_ALL, minimum=1),
    _o("kv-cache-dtype", "str"),
    _o("tensor-parallel-size", aliases=("tp",), minimum=1),
    _o("pipeline-parallel-size", aliases=("pp",), minimum=1),
    _o("data-parallel-size", aliases=("dp",), eras=V1_ALL, minimum=1),
    _o("enable-prefix-caching", "bool"),
    _o("prefix-caching-hash-algo", "choice", V1_ALL, choices=("sha256", "sha256_cbor", "xxhash", "xxhash_cbor",
                                                               "builtin", "sha256_cbor_64bit")),
    _o("async-scheduling", "bool", V1_ALL),
    _o("speculative-config", "str"),
    _o("scheduler-cls", "str"),
    # V0 only (early V1 still accepted them and ignored them)
    _o("preemption-mode", "choice", OLD, choices=("recompute", "swap")),
    _o("swap-space", "float", OLD, minimum=0.0),
    _o("num-scheduler-steps", eras=OLD, minimum=1),
    _o("scheduler-delay-factor", "float", OLD, minimum=0.0),
    _o("max-num-partial-prefills", eras=OLD, minimum=1),
    _o("max-long-partial-prefills", eras=OLD, minimum=1),
    # 2026 releases
    _o("watermark", "float", NEW, minimum=0.0),
    _o("scheduler-reserve-full-isl", "bool", NEW),
    _o("max-num-scheduled-tokens", eras=NEW, minimum=1),
    _o("max-num-active-seqs", eras=NEW, minimum=1),
    _o("prefill-schedule-interval", eras=NEW, minimum=1),
    _o("long-prefill-token-threshold-adaptive", "bool", NEW),
    _o("max-num-queued-reqs", eras=NEW, minimum=1),
    _o("max-num-queued-tokens", eras=NEW, minimum=1),
    # the V0/V1 switch of 0.8-0.10 (an environment variable)
    _o("VLLM_USE_V1", "bool"),
]
# Options with no effect on the scheduler: accepted and reported as ignored.
NO_EFFECT = {
    "model": "str", "host": "str", "port": "int", "served-model-name": "str", "dtype": "str",
    "trust-remote-code": "bool", "seed": "int", "quantization": "str", "max-logprobs": "int",
    "enforce-eager": "bool", "disable-log-requests": "bool", "enable-log-requests": "bool",
    "disable-log-stats": "bool", "api-key": "str", "download-dir": "str", "tokenizer": "str", "revision": "str",
    "chat-template": "str", "uvicorn-log-level": "str", "generation-config": "str",
    "enable-auto-tool-choice": "bool", "tool-call-parser": "str", "load-format": "str",
    "disable-custom-all-reduce": "bool", "distributed-executor-backend": "str", "max-seq-len-to-capture": "int",
    "response-role": "str", "stream-interval": "int", "disable-chunked-mm-input": "bool",
    # production flags that change speed or memory outside the KV pool, never which request is scheduled
    "cuda-graph-sizes": "str", "max-cudagraph-capture-size": "int", "compilation-config": "str",
    "reasoning-parser": "str", "tokenizer-mode": "str", "enable-expert-parallel": "bool",
    "limit-mm-per-prompt": "str", "enable-prompt-tokens-details": "bool", "enable-sleep-mode": "bool",
    "otlp-traces-endpoint": "str", "structured-outputs-config": "str", "guided-decoding-backend": "str",
    "hf-overrides": "str", "override-generation-config": "str", "mm-processor-kwargs": "str",
    "disable-mm-preprocessor-cache": "bool", "allowed-local-media-path": "str", "ssl-keyfile": "str",
    "ssl-certfile": "str", "root-path": "str", "max-parallel-loading-workers": "int",
    "enable-server-load-tracking": "bool", "kv-events-config": "str",
}
# Production flags that can change scheduling and that the policy model does not have: refused with the reason.
REFUSED = {
    "enable-lora": ("bool", "LoRA adapters: the scheduler skips a request whose adapter would exceed --max-loras, "
                    "which the policy model does not do"),
    "max-loras": ("int", "the scheduler skips requests beyond this many LoRA adapters per batch (not modelled)"),
    "lora-modules": ("str", "LoRA adapters: the scheduler skips a request whose adapter would exceed --max-loras, "
                     "which the policy model does not do"),
}
OPTIONS += [Opt(name, kind, aliases=("q",) if name == "quantization" else (), tags=ALL | {"no-effect"})
            for name, kind in NO_EFFECT.items()]
OPTIONS += [Opt(name, kind, tags=ALL, refused=why) for name, (kind, why) in REFUSED.items()]
OPTIONS += [_o("kv-transfer-config", "str", V1_ALL), _o("kv-offloading-size", "float", V1_ALL),
            _o("cpu-offload-gb", "float", minimum=0.0)]

# --kv-transfer-config: the connectors whose scheduler-side behaviour the connector model has (docs/importers.md).
# kv_role -> connector.kind for the P/D connectors; the offloading ones load (kind offload) and never pin.
PD_CONNECTORS = ("NixlConnector", "FakeKVConnector")  # FakeKVConnector: tests/vllm_connector_driver.py
OFFLOAD_CONNECTORS = ("OffloadingConnector", "LMCacheConnectorV1")
ROLE_KINDS = {"kv_consumer": "decode_node", "kv_producer": "prefill_node", "kv_both": "both"}
TABLE = Table("vLLM", OPTIONS, fold_underscores=True)
ENV = {"VLLM_USE_V1": "VLLM_USE_V1"}

# kv-cache-dtype -> bytes per element (None: the model's dtype)
KV_DTYPES = {"auto": None, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "fp8_inc": 1, "bfloat16": 2, "float16": 2,
             "half": 2, "float32": 4, "float": 4}


def parse(args: list[str], config: str | None) -> Given:
    """The config file first, then the command line over it (vLLM: command-line args take precedence)."""
    given = Given()
    if config is not None:
        from checker.loading import parse_yaml, read_text

        data, lines = parse_yaml(read_text(config), config)
        given.update(parse_mapping(data, lines, TABLE, config))
    positional: list[str] = []
    given.update(parse_cli(args, TABLE, env=ENV, positional=positional.append))
    if positional:  # `vllm serve MODEL ...`: the model tag is the one positional argument
        if len(positional) > 1 or "model" in given.args:
            raise InputError(Problem("(argument)", positional[-1], "--option VALUE: vllm serve takes one "
                                     "positional argument, the model"))
        given.args["model"] = Arg("model", positional[0], "MODEL")
    return given


def _era(version: tuple[int, int], use_v1: Arg | None, label: str) -> str:
    era = V0 if version < (0, 8) else V1_EARLY if version <= (0, 11) else V1
    if use_v1 is None:
        return era
    if use_v1.value is False:
        if version >= (0, 11):
            raise use_v1.error(f"1 or unset: vLLM {label} has no V0 engine (removed in 0.11)")
        return V0
    if version < (0, 8):
        raise use_v1.error(f"0 or unset: the V1 engine of vLLM {label} is an alpha that batchcheck does not model")
    return era


def _era_check(arg: Arg, opt: Opt, era: str, label: str) -> bool:
    """Whether the option is one of this era's; if not, it is refused (reported with the other refusals)."""
    if era in opt.tags:
        return True
    if era == V1:
        refuse_later(arg.error(f"an option of vLLM {label}: it went away with the V0 engine"))
    elif NEW >= opt.tags:
        refuse_later(arg.error(f"an option of vLLM {label}: it is new in vLLM's 2026 releases"))
    else:
        refuse_later(arg.error(f"an option of vLLM {label}"))
    return False


def _gpu_class(machine: Machine) -> tuple[str, str]:
    mem = machine.gpu_memory_gib
    if mem is None:
        return "small", "a GPU under 70 GiB (--gpu-memory-gib not given)"
    if mem >= 160:
        return "huge", f"a {mem:g} GiB GPU (>= 160 GiB)"
    if mem >= 70:
        return "large", f"a {mem:g} GiB GPU (>= 70 GiB, taken as H100/H200-class: an A100 gets the small-GPU " \
                        "defaults, pass the flags)"
    return "small", f"a {mem:g} GiB GPU (under 70 GiB)"


# (max_num_batched_tokens, max_num_seqs) by GPU class and usage context, V1 (reference section 2)
V1_DEFAULTS = {
    ("small", "api-server"): (2048, 256), ("small", "llm-class"): (8192, 256),
    ("large", "api-server"): (8192, 1024), ("large", "llm-class"): (16384, 1024),
    ("huge", "api-server"): (16384, 1024), ("huge", "llm-class"): (16384, 1024),
}


def import_vllm(args: list[str], config: str | None, machine: Machine, version: str | None,
                usage_context: str | None) -> Draft:
    given = parse(args, config)
    if version is None:
        ver, label = REFERENCE_VERSION, "0.33"
    else:
        ver, label = parse_version(version), version.strip().lstrip("v")
    era = _era(ver, given.take("VLLM_USE_V1"), label)
    engine = "V0 scheduler" if era == V0 else "V1 scheduler"
    draft = Draft(SYSTEM, f"vLLM {label} ({engine})")
    if version is None:
        draft.assume_input("--vllm-version", "0.33", "the reference version; pass --vllm-version for another one")
    elif era == V1 and ver != REFERENCE_VERSION:
        draft.approximate("--vllm-version", label, "read with vLLM 0.33's scheduler semantics and defaults: the "
                          "reference describes 0.33 and 0.8-0.11")
    for arg in list(given.args.values()):
        opt = TABLE.lookup(arg.name)
        assert opt is not None
        if not _era_check(arg, opt, era, label):
            del given.args[arg.name]  # refused (with the others): the rest of the import goes on without it
    take_listed(given, TABLE, draft)
    mml = take_length_limit(given, draft, "max-model-len", "the model's context length: vLLM reads it from the "
                            "model's config, which batchcheck does not have")
    tp_arg = given.take("tensor-parallel-size")
    tp = 1 if tp_arg is None else tp_arg.value
    for name in ("pipeline-parallel-size", "data-parallel-size"):
        arg = given.take(name)
        if arg is not None and arg.value > 1:
            refuse_later(refuse(arg, "1: the policy model is one engine running one batch at a time (pipeline "
                                "stages and data-parallel engines are not modelled)"))
    for name, why in (("scheduler-cls", "a custom scheduler class cannot be imported"),):
        arg = given.take(name)
        if arg is not None and arg.value is not False:
            raise refuse(arg, f"no {arg.shown}: {why}")
    _unsupported_old(given, draft, era)
    _unsupported_new(given, draft)
    _prefix_caching(given, draft, era)
    _connector(given, draft)
    _speculative(given, draft)
    _async_scheduling(given, draft, era, ver)

    # --- queue and preemption
    policy_arg = given.take("scheduling-policy")
    priority = policy_arg is not None and policy_arg.value == "priority"
    order_comment = policy_arg.shown if policy_arg is not None else None
    if policy_arg is None:
        draft.assume("queue.order", "fcfs", "--scheduling-policy not given: vLLM's default is fcfs")
    else:
        draft.set("queue.order", policy_arg.value, order_comment)
    draft.set("queue.priority_polarity", "lower_first", "vLLM: a lower priority value is served first")
    draft.set("queue.head_of_line", "strict", "admission stops at the first request that does not fit")
    draft.set("queue.preempted_requeue", "by_order" if priority else "front",
              "priority heap order" if priority else "waiting.prepend_request")

    # --- chunking and budgets
    chunk_arg = given.take("enable-chunked-prefill")
    if chunk_arg is not None:
        chunking = chunk_arg.value
        draft.set("chunking.enabled", chunking, chunk_arg.shown)
    elif era == V0:
        chunking = False
        draft.assume("chunking.enabled", False, "--enable-chunked-prefill not given: off by default in V0 (V0 API "
                     "servers turned it on by themselves for contexts over 32K: pass the flag then)")
    else:
        chunking = True
        draft.assume("chunking.enabled", True, "--enable-chunked-prefill not given: on by default in V1")
    if era == V0 and chunking and priority:
        raise refuse(policy_arg, "fcfs with --enable-chunked-prefill on vLLM < 0.8: the V0 chunked-prefill "
                     "scheduler's priority handling is not modelled")
    _budgets(given, draft, era, label, machine, usage_context, chunking, mml)
    threshold = given.take("long-prefill-token-threshold")
    if threshold is not None:
        if threshold.value > mml:
            raise refuse(threshold, f"<= --max-model-len={mml} (vLLM rejects a larger threshold)")
        if threshold.value and not chunking:
            raise refuse(threshold, "0 when chunked prefill is off: the cap splits prompts into chunks")
        draft.set("chunking.long_prefill_token_threshold", threshold.value, threshold.shown)
        if era == V1 and threshold.value:
            draft.set("chunking.threshold_when_alone", False,
                      "vLLM 0.33 applies the cap only while more than one request is running or waiting")
        adaptive = given.take("long-prefill-token-threshold-adaptive")
        if adaptive is not None:
            draft.set("chunking.threshold_adaptive", adaptive.value, adaptive.shown)
    else:
        draft.assume("chunking.long_prefill_token_threshold", 0, "--long-prefill-token-threshold not given: "
                     "vLLM's default, no cap")
        adaptive = given.take("long-prefill-token-threshold-adaptive")
        if adaptive is not None:
            draft.ignore(adaptive, "no --long-prefill-token-threshold to floor")

    # --- admission
    draft.set("admission.reject_never_fits", False, "vLLM never rejects a queued request that cannot fit")
    if era == V0:
        draft.set("admission.reserve_full_prompt", True, "V0 allocates the whole prompt at admission")
    elif era == V1_EARLY:
        draft.set("admission.reserve_full_prompt", False, "before scheduler_reserve_full_isl (2026): blocks for "
                  "the first chunk only")
    else:
        isl = given.take("scheduler-reserve-full-isl")
        if isl is None:
            draft.assume("admission.reserve_full_prompt", True, "--scheduler-reserve-full-isl not given: vLLM 0.33 "
                         "default true")
        else:
            draft.set("admission.reserve_full_prompt", isl.value, isl.shown)
        for name, field in (("max-num-queued-reqs", "admission.max_inflight"),
                            ("max-num-queued-tokens", "admission.max_queued_tokens")):
            arg = given.take(name)
            if arg is not None:
                draft.set(field, arg.value, arg.shown)
                what = "in-flight requests" if name == "max-num-queued-reqs" else "prompt tokens of waiting requests"
                draft.approximate(field, arg.value, f"vLLM sheds at the API server (503) by {what}; the policy "
                                  "model rejects the arrival at the scheduler")

    # --- KV
    block_arg = given.take("block-size")
    block = block_arg.value if block_arg is not None else 16
    if block_arg is None:
        draft.assume("kv.block_size", 16, "--block-size not given: vLLM's CUDA default")
    else:
        draft.set("kv.block_size", block, block_arg.shown)
    dtype_arg = given.take("kv-cache-dtype")
    dtype_bytes = _kv_dtype(dtype_arg)
    if dtype_arg is not None and given.peek("num-gpu-blocks-override") is not None:
        draft.ignore(dtype_arg, "--num-gpu-blocks-override fixes the pool: the KV dtype would only change how "
                     "many blocks fit in the GPU's memory")
    fixed = next((f"--{name}" for name in ("num-gpu-blocks-override", "kv-cache-memory-bytes") if name in given), None)
    take_weight_offload(given, draft, "cpu-offload-gb", fixed)
    blocks, comment = _pool(given, draft, era, label, machine, block, tp, dtype_bytes, mml)
    draft.set("kv.num_blocks", blocks, comment)
    draft.set("kv.allocation", "on_demand", "blocks for the tokens scheduled in the step")
    if era == V0:
        draft.set("kv.watermark", 0.01, "V0 block-manager watermark")
    elif era == V1_EARLY:
        draft.set("kv.watermark", 0.0, "no admission watermark before 2026")
    else:
        wm = given.take("watermark")
        if wm is None:
            draft.assume("kv.watermark", 0.0, "--watermark not given: vLLM 0.33 default")
        elif wm.value >= 1.0:
            raise refuse(wm, "a fraction in [0, 1)")
        else:
            draft.set("kv.watermark", wm.value, wm.shown)

    # --- preemption
    swap_blocks = _swap(given, draft, era, machine, block, tp, dtype_bytes)
    if tp_arg is None and (swap_blocks or not comment.startswith("--num-gpu-blocks-override")):
        draft.assume_input("--tensor-parallel-size", 1, "not given: one GPU, which holds all the weights and KV")
    triggers = ["kv_growth_fails"]
    if era == V0 and priority:
        triggers.append("priority_inversion")
    draft.set("preemption.triggers", triggers, "V0 priority: a waiting request that outranks a running one "
              "preempts it" if len(triggers) == 2 else "a running request cannot get its next blocks")
    draft.set("preemption.victim", "lowest_priority" if priority else "last_admitted",
              "max(running, key=(priority, arrival))" if priority else "running[-1]")
    if era == V0 and "preemption-mode" not in given:
        draft.assume("preemption.mode", "recompute", "--preemption-mode not given: V0 recomputes single-sequence "
                     "requests")
    else:
        draft.set("preemption.mode", "swap" if swap_blocks else "recompute",
                  "--preemption-mode swap" if swap_blocks else
                  ("V1 only recomputes" if era != V0 else "--preemption-mode"))
    if swap_blocks:
        draft.set("kv.swap_blocks", swap_blocks, "--swap-space / (KV bytes per token x block size)")
    if era == V0 and priority:
        draft.set("preemption.priority_inversion_threshold", 0, "any priority difference")
    draft.set("preemption.block_admission_after_preempt", True, "no admissions in a step that preempted")
    draft.set("batch.phase_mode", "prefill_first" if era == V0 and not chunking else "decode_first",
              "V0 without chunking: a step runs prefills or decodes" if era == V0 and not chunking
              else "running requests before waiting ones")
    draft.set("cancellation.release_lag_steps", 0, "aborts free their blocks before the next schedule()")
    given.check_all_taken()
    return draft


def _unsupported_old(given: Given, draft: Draft, era: str) -> None:
    """The V0-only knobs: refused in V0 where they change the scheduler, ignored (as vLLM does) in early V1."""
    for name, default, why in (
            ("num-scheduler-steps", 1, "multi-step scheduling (several decode steps per schedule) is not modelled"),
            ("scheduler-delay-factor", 0.0, "delaying prompt admission by a factor of the last prompt's latency "
                                            "is not modelled"),
            ("max-num-partial-prefills", 1, "limits on concurrent partial prefills are not modelled"),
            ("max-long-partial-prefills", 1, "limits on concurrent long partial prefills are not modelled")):
        arg = given.take(name)
        if arg is None:
            continue
        if era == V1_EARLY:
            draft.ignore(arg, "the V1 scheduler does not read it")
        elif arg.value != default:
            refuse_later(refuse(arg, f"{default}: {why}"))


def _unsupported_new(given: Given, draft: Draft) -> None:
    for name, ok, why in (
            ("prefill-schedule-interval", 1, "admitting prefills only every N steps is not modelled"),):
        arg = given.take(name)
        if arg is not None and arg.value != ok:
            raise refuse(arg, f"{str(ok).lower()}: {why}")


def _async_scheduling(given: Given, draft: Draft, era: str, ver: tuple) -> None:
    """--async-scheduling onto pipeline.in_flight 1 (vLLM's AsyncScheduler, one batch in flight); where the model
    has no async rules (speculative decoding, a KV connector) it stays synchronous, approximated. Not given: vLLM
    0.33 turns async scheduling on by default (config/vllm.py, VllmConfig.__post_init__), the import keeps
    synchronous scheduling (docs/importers.md says why) and says so."""
    arg = given.take("async-scheduling")
    if era == V0:
        if arg is not None and arg.value:
            draft.ignore(arg, "the V0 engine has no async scheduling")
        return
    unmodelled = "a KV connector" if draft.value("connector.kind", "none") != "none" else None
    if arg is not None and not arg.value:
        draft.set("pipeline.in_flight", 0, arg.shown)
    elif arg is not None and unmodelled is None:
        draft.set("pipeline.in_flight", 1, arg.shown)
    elif arg is not None:
        draft.approximate("--async-scheduling", True, f"modelled as synchronous scheduling: async scheduling with "
                          f"{unmodelled} is not modelled yet (each step decided after the previous one completed)")
    elif tuple(ver[:2]) >= ASYNC_DEFAULT_SINCE:
        draft.approximate("--async-scheduling", "not given", "vLLM turns async scheduling on by default since 0.29; "
                          "the import models synchronous scheduling unless --async-scheduling is given (the z3 "
                          "encoding does not cover async scheduling yet); "
                          "--no-async-scheduling says the server runs synchronously")


def _prefix_caching(given: Given, draft: Draft, era: str) -> None:
    arg = given.take("enable-prefix-caching")
    if era == V0:
        if arg is not None:
            draft.ignore(arg, "V0's prefix cache is not modelled: exact when requests share no prefix")
        return
    if arg is not None:
        draft.set("kv.prefix_caching.enabled", arg.value, arg.shown)
    else:
        draft.assume("kv.prefix_caching.enabled", True, "--enable-prefix-caching not given: on by default in V1")
    algo = given.take("prefix-caching-hash-algo")
    if algo is not None:
        draft.ignore(algo, "the hash function does not change which blocks match (batchcheck compares the "
                     "block chains themselves)")


def _connector(given: Given, draft: Draft) -> None:
    """--kv-transfer-config (a JSON object: kv_connector, kv_role) and --kv-offloading-size onto policy.connector."""
    config, offloading = given.take("kv-transfer-config"), given.take("kv-offloading-size")
    if config is None and offloading is None:
        return
    if config is not None and offloading is not None:
        raise refuse(offloading, "no --kv-offloading-size with --kv-transfer-config (vLLM builds an "
                     "OffloadingConnector from it: one connector)")
    if offloading is not None:
        if not offloading.value > 0:
            raise refuse(offloading, "a size > 0 GiB")
        kind, why = "offload", f"{offloading.shown}: vLLM's OffloadingConnector (a CPU tier)"
    else:
        try:
            data = parse_json(str(config.value), config.source or "--kv-transfer-config", config.line)
        except json.JSONDecodeError:
            raise refuse(config, 'a JSON object, e.g. {"kv_connector": "NixlConnector", "kv_role": "kv_both"}') from None
        if not isinstance(data, dict) or not isinstance(data.get("kv_connector"), str):
            raise refuse(config, 'a JSON object naming its "kv_connector"')
        name, role = data["kv_connector"], data.get("kv_role", "kv_both")
        if name in OFFLOAD_CONNECTORS:
            kind = "offload"
        elif name in PD_CONNECTORS:
            if role not in ROLE_KINDS:
                raise config.error(f"kv_role one of {', '.join(ROLE_KINDS)} (it is {role})")
            kind = ROLE_KINDS[role]
        else:
            raise config.error(f"kv_connector one of {', '.join(PD_CONNECTORS + OFFLOAD_CONNECTORS)} (the connectors "
                               f"whose scheduler side the model has; {name} is not modelled)")
        why = f"{name} with kv_role {role}"
        failure = data.get("kv_load_failure_policy")
        if failure is not None:
            if failure not in ("fail", "recompute"):
                raise config.error(f"kv_load_failure_policy fail or recompute (it is {failure})")
            draft.set("connector.load_failure", failure, f"kv_load_failure_policy {failure}")
    draft.set("connector.kind", kind, why)
    draft.assume("connector.holders_first", True, "vLLM 0.33 scans the requests holding KV (kv_holding_waiting) "
                 "before the waiting queue")
    draft.assume("connector.reserve_inflight", True, "vLLM 0.33 admits a load only within the free blocks less "
                 "the in-flight prefills' remaining blocks")
    draft.assume("connector.release", "on_completion", "vLLM 0.33 frees an aborted load's blocks when its "
                 "finished_recving arrives, a pinned request's when finished_sending arrives")
    draft.assume("connector.max_load_steps", 4, "not a vLLM setting: the longest transfer verification lets the "
                 "environment choose")


# --speculative-config methods the policy model has: vLLM's name -> speculative.method (docs/speculative.md)
SPEC_METHODS = {"ngram": "ngram", "draft_model": "draft", "eagle": "eagle", "eagle3": "eagle", "mtp": "mtp"}


def _speculative(given: Given, draft: Draft) -> None:
    """--speculative-config (a JSON object: method, num_speculative_tokens) onto policy.speculative."""
    config = given.take("speculative-config")
    if config is None or config.value is False:
        return
    example = '{"method": "eagle", "num_speculative_tokens": 3}'
    try:
        data = parse_json(str(config.value), config.source or "--speculative-config", config.line)
    except json.JSONDecodeError:
        raise refuse(config, f"a JSON object, e.g. {example}") from None
    if not isinstance(data, dict):
        raise refuse(config, f"a JSON object, e.g. {example}")
    method = data.get("method")
    if method is None and data.get("model") is not None:
        method = "draft_model"  # vLLM: a draft model named without a method
    if method not in SPEC_METHODS:
        raise config.error(f"method one of {', '.join(SPEC_METHODS)} (the drafters whose scheduling the model has; "
                           f"{method} is not modelled)")
    k = data.get("num_speculative_tokens")
    if k.__class__ is not int or not 1 <= k <= 64:
        raise config.error(f"num_speculative_tokens a whole number from 1 to 64 (it is {k})")
    for key in ("parallel_drafting", "num_speculative_tokens_per_batch_size"):
        if data.get(key):
            raise config.error(f"no {key} (it changes the drafting slots per step: not modelled)")
    why = f"--speculative-config method {method}"
    draft.set("speculative.method", SPEC_METHODS[method], why)
    draft.set("speculative.num_tokens", k, why + f", num_speculative_tokens {k}")


def _budgets(given: Given, draft: Draft, era: str, label: str, machine: Machine, usage: str | None,
             chunking: bool, mml: int) -> None:
    seqs_arg, mnbt_arg = given.take("max-num-seqs"), given.take("max-num-batched-tokens")
    if usage is not None and usage not in USAGE_CONTEXTS:
        raise InputError(Problem("--usage-context", usage, "one of: " + ", ".join(USAGE_CONTEXTS)))
    if era == V0:
        default_seqs, why_seqs = 256, f"vLLM {label} default"
        if chunking:
            default_mnbt, why_mnbt = 2048, (f"vLLM {label} default with chunked prefill (0.6-0.7; older V0 releases "
                                            "used 512: pass the flag for them)")
        else:
            default_mnbt, why_mnbt = max(mml, 2048), f"vLLM {label} default without chunking: max(max_model_len, 2048)"
    else:
        gpu, gpu_why = _gpu_class(machine)
        context = usage or "api-server"
        default_mnbt, default_seqs = V1_DEFAULTS[(gpu, context)]
        whose = "vllm serve" if context == "api-server" else "the LLM class"
        if usage is None and (seqs_arg is None or mnbt_arg is None):
            draft.assume_input("--usage-context", "api-server", "engine flags are vllm serve's; the LLM class has "
                               "larger defaults: --usage-context llm-class")
        why_seqs = why_mnbt = f"vLLM {label} default for {whose} on {gpu_why}"
        if not chunking and default_mnbt < mml:
            default_mnbt, why_mnbt = mml, f"vLLM {label}: at least max_model_len when chunked prefill is off"
    seqs = default_seqs if seqs_arg is None else seqs_arg.value
    mnbt = default_mnbt if mnbt_arg is None else mnbt_arg.value
    if not chunking and mnbt < mml:
        raise refuse(mnbt_arg, f">= --max-model-len={mml} when chunked prefill is off: vLLM rejects this "
                     "configuration (a whole prompt must fit one step)")
    if seqs > mnbt:
        if seqs_arg is not None:
            raise refuse(seqs_arg, f"<= --max-num-batched-tokens={mnbt}: vLLM rejects a sequence cap above the "
                         "token budget")
        raise refuse(mnbt_arg, f">= --max-num-seqs={seqs}: vLLM rejects a token budget below the sequence cap")
    budget, budget_note = mnbt, (mnbt_arg.shown if mnbt_arg is not None else None)
    scheduled = given.take("max-num-scheduled-tokens")
    if scheduled is not None:
        if scheduled.value > mnbt:
            raise refuse(scheduled, f"<= --max-num-batched-tokens={mnbt}")
        if not chunking and scheduled.value < mml:
            raise refuse(scheduled, f">= --max-model-len={mml} when chunked prefill is off (a whole prompt must "
                         "fit one step)")
        budget, budget_note = scheduled.value, scheduled.shown
        if seqs > budget:
            raise refuse(scheduled, f">= --max-num-seqs={seqs}: every running request needs a token per step")
    active = given.take("max-num-active-seqs")
    cap, cap_note = seqs, (seqs_arg.shown if seqs_arg is not None else None)
    if active is not None:
        if active.value > seqs:
            raise refuse(active, f"<= --max-num-seqs={seqs}")
        cap, cap_note = active.value, active.shown
    if cap_note is None:
        draft.assume("batch.max_num_seqs", cap, f"--max-num-seqs not given: {why_seqs}")
    else:
        draft.set("batch.max_num_seqs", cap, cap_note)
    if budget_note is None:
        draft.assume("batch.max_num_batched_tokens", budget, f"--max-num-batched-tokens not given: {why_mnbt}")
    else:
        draft.set("batch.max_num_batched_tokens", budget, budget_note)


def _kv_dtype(arg) -> int | None:
    if arg is None:
        return None
    if arg.value not in KV_DTYPES:
        raise refuse(arg, "one of: " + ", ".join(KV_DTYPES))
    return KV_DTYPES[arg.value]


def _pool(given: Given, draft: Draft, era: str, label: str, machine: Machine, block: int, tp: int,
          dtype_bytes: int | None, mml: int) -> tuple[int, str]:
    override = given.take("num-gpu-blocks-override")
    util = given.take("gpu-memory-utilization")
    kv_bytes = given.take("kv-cache-memory-bytes")
    if override is not None:
        for arg in (util, kv_bytes):
            if arg is not None:
                draft.ignore(arg, "--num-gpu-blocks-override fixes the pool")
        if machine.given():
            draft.ignored.append(f"{', '.join(machine.given())} (--num-gpu-blocks-override fixes the pool)")
        return override.value - 1, f"{override.shown} {override.value} minus vLLM's null block"
    if kv_bytes is not None:
        if util is not None:
            draft.ignore(util, "--kv-cache-memory-bytes sizes the pool")
        kv = machine.kv_bytes(dtype_bytes)
        if kv is None:
            raise refuse(kv_bytes, "a pool that batchcheck can turn into blocks: pass --kv-bytes-per-token or "
                         "--profile with a model shape")
        gpu_blocks = int(kv_bytes.value // (kv[0] / tp * block))
        comment = f"{kv_bytes.shown} / ({kv[1]} / TP x block size) - 1"
    else:
        default_util = 0.92 if era == V1 else 0.9
        if util is None:
            fraction = default_util
            draft.assume_input("--gpu-memory-utilization", default_util, f"vLLM {label} default; sizes kv.num_blocks")
        else:
            fraction = util.value
            if not 0 < fraction <= 1:
                raise refuse(util, "a fraction in (0, 1]")
        tokens = pool_tokens(machine, draft, fraction=fraction, fraction_name="--gpu-memory-utilization",
                             of_free=False, tensor_parallel=tp, server="vLLM", kv_dtype_bytes=dtype_bytes)
        gpu_blocks = tokens // block
        comment = "from the declared GPU memory, weights and KV bytes per token, minus the null block"
        draft.approximate("kv.num_blocks", gpu_blocks - 1, "computed from the declared machine, not measured: "
                          "vLLM's start-up log prints the real figure (GPU KV cache size)")
    usable = gpu_blocks - 1
    if usable < 1:
        raise UsageError(f"the declared machine leaves {gpu_blocks} KV blocks: vLLM needs at least 2 (one is its "
                         "null block)")
    if usable * block < mml:
        raise InputError(Problem("--max-model-len", mml, f"<= {usable * block} tokens, the KV pool computed for the "
                                 "declared machine: vLLM refuses to start when one max_model_len sequence does not "
                                 "fit (--num-gpu-blocks-override skips that check)"))
    return usable, comment


def _swap(given: Given, draft: Draft, era: str, machine: Machine, block: int, tp: int,
          dtype_bytes: int | None) -> int:
    mode, space = given.take("preemption-mode"), given.take("swap-space")
    if era != V0:
        for arg in (mode, space):
            if arg is not None:
                draft.ignore(arg, "the V1 scheduler only recomputes")
        return 0
    if mode is None or mode.value == "recompute":
        if space is not None:
            draft.ignore(space, "used only with --preemption-mode swap")
        return 0
    if space is None:
        gib = 4.0
        draft.assume_input("--swap-space", 4.0, "vLLM V0 default, GiB of CPU swap space per GPU")
    else:
        gib = space.value
    kv = machine.kv_bytes(dtype_bytes)
    if kv is None:
        raise refuse(space if space is not None else mode, "a swap space batchcheck can turn into blocks: pass "
                     "--kv-bytes-per-token or --profile with a model shape (swap blocks = swap bytes / "
                     "(KV bytes per token / TP x block size))")
    blocks = int(gib * GIB // (kv[0] / tp * block))
    if blocks < 1:
        raise refuse(space if space is not None else mode, "a swap space of at least one block")
    return blocks
