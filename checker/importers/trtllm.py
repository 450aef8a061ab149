"""TensorRT-LLM LLM-API options (the YAML of ``trtllm-serve --extra_llm_api_options``, and the
``trtllm-serve`` flags) -> policy.

Semantics: shared/reference/serving-schedulers.md section 4. The capacity scheduler decides who runs:
GUARANTEED_NO_EVICT (the default) admits in arrival order while the remaining blocks to completion fit and
never pauses a started request; MAX_UTILIZATION allocates only the next step's blocks and pauses the last
started request when one does not fit; STATIC_BATCH admits only when nothing runs. The micro-batch
scheduler then applies ``max_batch_size`` and ``max_num_tokens``, generation requests before contexts.
"""

from __future__ import annotations

from checker.errors import InputError, Problem, UsageError
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
    parse_mapping,
    pool_tokens,
    refuse,
)
from checker.importers.refusals import refuse_later

SYSTEM = "trtllm"
CAPACITY = ("GUARANTEED_NO_EVICT", "MAX_UTILIZATION", "STATIC_BATCH")

OPTIONS = [
    Opt("max_batch_size", minimum=1),
    Opt("max_num_tokens", minimum=1),
    Opt("max_seq_len", minimum=2),
    Opt("max_input_len", minimum=1),
    Opt("max_beam_width", minimum=1),
    Opt("enable_chunked_prefill", "bool"),
    Opt("tensor_parallel_size", aliases=("tp_size",), minimum=1),
    Opt("pipeline_parallel_size", aliases=("pp_size",), minimum=1),
    Opt("enable_attention_dp", "bool"),
    Opt("speculative_config", "any"),
    Opt("extra_llm_api_options", "str"),
    Opt("kv_cache_config.tokens_per_block", minimum=1),
    Opt("kv_cache_config.max_tokens", minimum=1),
    Opt("kv_cache_config.free_gpu_memory_fraction", "float", aliases=("kv_cache_free_gpu_memory_fraction",),
        minimum=0.0),
    Opt("kv_cache_config.enable_block_reuse", "bool"),
    Opt("kv_cache_config.host_cache_size", minimum=0),
    Opt("kv_cache_config.dtype", "str"),
    Opt("scheduler_config.capacity_scheduler_policy", "choice", choices=CAPACITY, fold_case=True),
    Opt("scheduler_config.context_chunking_policy", "choice", choices=("FIRST_COME_FIRST_SERVED", "EQUAL_PROGRESS"),
        fold_case=True),
    Opt("scheduler_config.waiting_queue_policy", "str"),
]
NO_EFFECT = {
    "model": "str", "backend": "str", "tokenizer": "str", "trust_remote_code": "bool", "dtype": "str",
    "cuda_graph_config": "any", "print_iter_log": "bool", "disable_overlap_scheduler": "bool",
    "enable_iter_perf_stats": "bool", "return_perf_metrics": "bool", "stream_interval": "int",
    "attn_backend": "str", "host": "str", "port": "int", "log_level": "str", "num_postprocess_workers": "int",
    "moe_config": "any", "skip_tokenizer_init": "bool", "reasoning_parser": "str", "revision": "str",
    "postprocess_tokenizer_dir": "str", "enable_autotuner": "bool",
    # production flags that change speed or memory outside the KV pool, never which request is scheduled
    "torch_compile_config": "any", "moe_expert_parallel_size": "int", "moe_tensor_parallel_size": "int",
    "tokenizer_mode": "str",
}
OPTIONS += [Opt(name, kind, tags=frozenset({"no-effect"})) for name, kind in NO_EFFECT.items()]
# Production options that can change scheduling and that the policy model does not have: refused with the reason.
LORA = ("LoRA: the capacity scheduler also admits against the PEFT cache's pages, which the policy model does not "
        "have")
OPTIONS += [Opt("lora_config", "any", refused=LORA), Opt("enable_lora", "bool", refused=LORA)]
TABLE = Table("TensorRT-LLM", OPTIONS, fold_underscores=True)
KV_DTYPES = {"auto": None, "fp8": 1, "float16": 2, "bfloat16": 2}


def parse(args: list[str], config: str | None) -> tuple[Given, str | None]:
    """trtllm-serve flags, then the LLM-API YAML over them (trtllm-serve applies the extra options last)."""
    positional: list[str] = []
    cli = parse_cli(args, TABLE, positional=positional.append)
    files = [p for p in positional if p.endswith((".yaml", ".yml"))]
    models = [p for p in positional if p not in files]
    extra = cli.args.pop("extra_llm_api_options", None)
    sources = [s for s in ([config] if config else []) + ([extra.value] if extra else []) + files]
    if len(sources) > 1:
        raise UsageError(f"one LLM-API YAML file, please (got {', '.join(sources)})")
    if len(models) > 1:
        raise InputError(Problem("(argument)", models[-1], "--option VALUE: trtllm-serve takes one positional "
                                 "argument, the model"))
    given = Given(cli.args)
    if models:
        given.args["model"] = Arg("model", models[0], "MODEL")
    source = sources[0] if sources else None
    if source is not None:
        from checker.loading import parse_yaml, read_text

        data, lines = parse_yaml(read_text(source), source)
        given.update(parse_mapping(data, lines, TABLE, source, nested=("kv_cache_config", "scheduler_config")))
    return given, source


def import_trtllm(args: list[str], config: str | None, machine: Machine) -> Draft:
    given, source = parse(args, config)
    capacity = given.take("scheduler_config.capacity_scheduler_policy")
    policy = "GUARANTEED_NO_EVICT" if capacity is None else capacity.value
    draft = Draft(SYSTEM, f"TensorRT-LLM batch manager, capacity scheduler {policy}")
    take_listed(given, TABLE, draft)
    if capacity is None:
        draft.assume_input("scheduler_config.capacity_scheduler_policy", policy, "the LLM API's default")

    seq = given.take("max_seq_len")
    if seq is None:
        raise missing("max_seq_len", "the longest prompt + output (TensorRT-LLM derives it from the model's config, "
                      "which batchcheck does not have)", source)
    mml = seq.value
    draft.set("max_model_len", mml, seq.shown)
    max_input = given.take("max_input_len")
    if max_input is not None and max_input.value < mml - 1:
        raise refuse(max_input, f"max_seq_len - 1 = {mml - 1} or more: the policy model has one length limit "
                     "(prompts of max_model_len tokens or more are rejected), not a separate, smaller prompt limit")
    if max_input is not None:
        draft.ignore(max_input, "no smaller than max_seq_len - 1: the policy model's limit covers it")
    for name, ok, why in (("pipeline_parallel_size", 1, "pipeline stages (several batches in flight) are not "
                                                        "modelled"),
                          ("max_beam_width", 1, "beam search is not modelled")):
        arg = given.take(name)
        if arg is not None and arg.value != ok:
            refuse_later(refuse(arg, f"{ok}: {why}"))
    for name, why in (("enable_attention_dp", "attention data parallelism batches per rank"),):
        arg = given.take(name)
        if arg is not None and arg.value:
            refuse_later(refuse(arg, f"false: {why}"))
    spec = given.take("speculative_config")
    if spec is not None:
        refuse_later(spec.error("no speculative_config: draft tokens per step are not modelled", "{...}"))
    waiting = given.take("scheduler_config.waiting_queue_policy")
    if waiting is not None and str(waiting.value).lower() != "fcfs":
        refuse_later(refuse(waiting, "fcfs: the only waiting-queue policy of the TensorRT-LLM versions read"))
    host = given.take("kv_cache_config.host_cache_size")
    if host is not None and host.value > 0:
        refuse_later(refuse(host, "0: KV offload to host memory is not modelled"))
    reuse = given.take("kv_cache_config.enable_block_reuse")
    if reuse is not None:
        draft.ignore(reuse, "the policy model has no prefix cache: exact when requests share no prefix")

    # --- budgets and chunking
    size = given.take("max_batch_size")
    tokens = given.take("max_num_tokens")
    seqs = 2048 if size is None else size.value
    budget = 8192 if tokens is None else tokens.value
    if size is None:
        draft.assume("batch.max_num_seqs", 2048, "max_batch_size not given: the LLM API's default")
    else:
        draft.set("batch.max_num_seqs", seqs, size.shown)
    if tokens is None:
        draft.assume("batch.max_num_batched_tokens", 8192, "max_num_tokens not given: the LLM API's default")
    else:
        draft.set("batch.max_num_batched_tokens", budget, tokens.shown)
    if seqs > budget:
        why = "the policy model needs a token per running request in every step"
        if size is not None:
            raise refuse(size, f"<= max_num_tokens={budget}: {why}")
        raise refuse(tokens, f">= max_batch_size={seqs} (the default): {why}")
    chunk = given.take("enable_chunked_prefill")
    chunking = False if chunk is None else chunk.value
    if chunk is None:
        draft.assume("chunking.enabled", False, "enable_chunked_prefill not given: the LLM API's default")
    else:
        draft.set("chunking.enabled", chunking, chunk.shown)
    chunk_policy = given.take("scheduler_config.context_chunking_policy")
    if chunking:
        if chunk_policy is not None and chunk_policy.value == "EQUAL_PROGRESS":
            raise refuse(chunk_policy, "FIRST_COME_FIRST_SERVED: handing out chunk units round-robin is not modelled")
        if chunk_policy is None:
            draft.assume_input("scheduler_config.context_chunking_policy", "FIRST_COME_FIRST_SERVED",
                               "the default when chunking is on")
        draft.approximate("chunking.enabled", True, "TensorRT-LLM rounds each chunk down to a multiple of "
                          "tokens_per_block; the policy model does not align chunks")
    else:
        if chunk_policy is not None:
            draft.ignore(chunk_policy, "read only with enable_chunked_prefill")
        if budget < mml:
            why = ("when enable_chunked_prefill is false: a context request needs its whole prompt in one "
                   "iteration (the policy model requires it)")
            if tokens is not None:
                raise refuse(tokens, f">= max_seq_len={mml} {why}")
            raise refuse(seq, f"<= max_num_tokens={budget} (the default) {why}")

    # --- KV pool
    block_arg = given.take("kv_cache_config.tokens_per_block")
    block = 32 if block_arg is None else block_arg.value
    if block_arg is None:
        draft.assume("kv.block_size", 32, "tokens_per_block not given: the LLM API's default")
    else:
        draft.set("kv.block_size", block, block_arg.shown)
    blocks, comment = _pool(given, draft, machine, block, source)
    draft.set("kv.num_blocks", blocks, comment)

    # --- the capacity scheduler
    draft.set("queue.order", "fcfs", "active requests in arrival order")
    draft.approximate("queue.order", "fcfs", "TensorRT-LLM requests carry a priority in [0, 1], higher first "
                      "(default 0.5), believed to order only the executor's pending queue; the capacity scheduler "
                      "scans active requests in arrival order, so workload priorities are not used")
    draft.set("queue.head_of_line", "strict", "the scan breaks at the first request that does not fit")
    draft.set("admission.reserve_full_prompt", True)
    if policy == "MAX_UTILIZATION":
        draft.set("queue.preempted_requeue", "front", "a paused request keeps its place at the front")
        draft.set("batch.phase_mode", "decode_first", "generation requests precede new contexts")
        draft.set("kv.allocation", "on_demand", "blocks for the next step only")
        draft.set("preemption.triggers", ["kv_growth_fails"], "a request's next blocks do not fit")
        draft.set("preemption.victim", "last_admitted", "pause the last started request")
        draft.set("preemption.mode", "recompute", "a paused request re-runs its context")
        draft.set("preemption.block_admission_after_preempt", False, "scheduling goes on in the step that paused")
    else:
        static = policy == "STATIC_BATCH"
        draft.set("batch.phase_mode", "static" if static else "decode_first",
                  "new requests only when none is active" if static else "generation requests precede new contexts")
        draft.set("kv.allocation", "full_reservation", "remaining blocks to completion are reserved")
        draft.set("preemption.triggers", [], "a started request is never paused")
    draft.set("cancellation.release_lag_steps", 0, "cancelRequest ends the request at the next iteration boundary")
    given.check_all_taken()
    return draft


def _pool(given: Given, draft: Draft, machine: Machine, block: int, source: str | None) -> tuple[int, str]:
    max_tokens = given.take("kv_cache_config.max_tokens")
    fraction_arg = given.take("kv_cache_config.free_gpu_memory_fraction")
    tp_arg = given.take("tensor_parallel_size")
    tp = 1 if tp_arg is None else tp_arg.value
    dtype = given.take("kv_cache_config.dtype")
    if dtype is not None and dtype.value not in KV_DTYPES:
        raise refuse(dtype, "one of: " + ", ".join(KV_DTYPES))
    dtype_bytes = None if dtype is None else KV_DTYPES[dtype.value]
    if max_tokens is not None and not machine.given():
        if fraction_arg is not None:
            draft.ignore(fraction_arg, "max_tokens is taken as the pool (batchcheck has no machine to apply the "
                         "fraction to)")
        tokens, comment = max_tokens.value, f"{max_tokens.shown} / tokens_per_block"
        if fraction_arg is None:
            draft.assume_input("kv_cache_config.free_gpu_memory_fraction", 0.9, "the LLM API's default, not "
                               "applied: TensorRT-LLM takes min(max_tokens, the fraction's pool); declare the "
                               "machine (--gpu-memory-gib ...) to apply it")
    else:
        if max_tokens is None and not machine.given():
            raise missing("kv_cache_config.max_tokens", "the KV pool size in tokens, or a machine: --gpu-memory-gib, "
                          "--model-weights-gib, --kv-bytes-per-token or --profile", source)
        if fraction_arg is None:
            fraction = 0.9
            draft.assume_input("kv_cache_config.free_gpu_memory_fraction", 0.9, "the LLM API's default; sizes the "
                               "KV pool")
        else:
            fraction = fraction_arg.value
            if not 0 < fraction <= 1:
                raise refuse(fraction_arg, "a fraction in (0, 1]")
        if tp_arg is None:
            draft.assume_input("tensor_parallel_size", 1, "not given: one GPU, which holds all the weights and KV")
        tokens = pool_tokens(machine, draft, fraction=fraction, fraction_name="free_gpu_memory_fraction",
                             of_free=True, tensor_parallel=tp, server="TensorRT-LLM", kv_dtype_bytes=dtype_bytes)
        comment = "min(max_tokens, the fraction's pool) / tokens_per_block" if max_tokens is not None \
            else "free_gpu_memory_fraction of the memory left after the weights / tokens_per_block"
        if max_tokens is not None:
            tokens = min(tokens, max_tokens.value)
        draft.approximate("kv.num_blocks", tokens // block, "computed from the declared machine, not measured")
    blocks = tokens // block
    if blocks < 1:
        culprit = max_tokens if max_tokens is not None else fraction_arg
        if culprit is not None:
            raise refuse(culprit, f"a pool of at least one block ({block} tokens)")
        raise missing("kv_cache_config.max_tokens", f"a pool of at least one block ({block} tokens)", source)
    return blocks, comment
