"""Hugging Face TGI launcher arguments (``text-generation-launcher ...``, v3 router) -> policy.

Semantics: shared/reference/serving-schedulers.md section 3. One FIFO queue; blocks for prompt +
max_new_tokens are allocated at admission (so nothing is ever preempted); with prefill chunking (the v3
default, PREFILL_CHUNKING=1, when the attention backend supports it) new prefill chunks fill the step
budget the running batch leaves; ``--max-concurrent-requests`` rejects (429) over queued + running
requests; a cancelled request is noticed lazily, when its next token cannot be sent.
"""

from __future__ import annotations

from checker.importers.common import (
    Draft,
    Opt,
    Table,
    take_listed,
    missing,
    parse_cli,
    refuse,
    take_length_limit,
)
from checker.importers.refusals import refuse_later

SYSTEM = "tgi"
BLOCK_SIZES = {"flashinfer": 1, "paged": 16, "flashdecoding": 256}
CHUNKING_BACKENDS = {"flashinfer", "flashdecoding"}

OPTIONS = [
    Opt("max-concurrent-requests", minimum=1),
    Opt("max-batch-prefill-tokens", minimum=1),
    Opt("max-batch-total-tokens", minimum=1),
    Opt("max-input-tokens", aliases=("max-input-length",), minimum=1),
    Opt("max-total-tokens", minimum=2),
    Opt("max-batch-size", minimum=1),
    Opt("waiting-served-ratio", "float", minimum=0.0),
    Opt("max-waiting-tokens", minimum=0),
    Opt("cuda-memory-fraction", "float", minimum=0.0),
    Opt("speculate", minimum=0),
    # environment variables
    Opt("PREFILL_CHUNKING", "bool"),
    Opt("ATTENTION", "choice", choices=tuple(BLOCK_SIZES)),
    Opt("PREFIX_CACHING", "bool"),
]
NO_EFFECT = {
    "model-id": "str", "revision": "str", "port": "int", "hostname": "str", "quantize": "str", "dtype": "str",
    "trust-remote-code": "bool", "max-client-batch-size": "int", "max-best-of": "int", "max-stop-sequences": "int",
    "max-top-n-tokens": "int", "json-output": "bool", "otlp-endpoint": "str", "otlp-service-name": "str",
    "cors-allow-origin": "str", "api-key": "str", "huggingface-hub-cache": "str", "weights-cache-override": "str",
    "disable-custom-kernels": "bool", "validation-workers": "int", "num-shard": "int", "sharded": "bool",
    "shard-uds-path": "str", "master-addr": "str", "master-port": "int", "payload-limit": "int",
    "usage-stats": "str", "lora-adapters": "str", "kv-cache-dtype": "str", "rope-scaling": "str",
    "rope-factor": "float", "tokenizer-config-path": "str", "disable-grammar-support": "bool", "env": "bool",
    # production flags that change speed or memory outside the KV pool, never which request is scheduled
    "cuda-graphs": "str", "enable-prefill-logprobs": "bool",
}
OPTIONS += [Opt(name, kind, tags=frozenset({"no-effect"})) for name, kind in NO_EFFECT.items()]
TABLE = Table("TGI", OPTIONS)
# Every launcher option can also be given as its environment variable (clap), plus the env-only ones.
ENV = {name.upper().replace("-", "_"): name for name in (o.name for o in OPTIONS) if not name.isupper()}
ENV.update({"PREFILL_CHUNKING": "PREFILL_CHUNKING", "ATTENTION": "ATTENTION", "PREFIX_CACHING": "PREFIX_CACHING",
            "USE_PREFIX_CACHING": "PREFIX_CACHING", "MAX_INPUT_LENGTH": "max-input-tokens"})


def import_tgi(args: list[str]) -> Draft:
    given = parse_cli(args, TABLE, env=ENV)
    draft = Draft(SYSTEM, "TGI v3 router")
    take_listed(given, TABLE, draft)
    mml = take_length_limit(given, draft, "max-total-tokens", "the longest prompt + max_new_tokens (TGI derives it "
                            "from the model's config, which batchcheck does not have)")
    input_arg = given.take("max-input-tokens")
    if input_arg is not None and input_arg.value < mml - 1:
        raise refuse(input_arg, f"--max-total-tokens - 1 = {mml - 1}: the policy model has one length limit (prompts "
                     "of max_model_len tokens or more are rejected), not a separate, smaller prompt limit")
    if input_arg is not None and input_arg.value >= mml:
        raise refuse(input_arg, f"< --max-total-tokens={mml} (TGI rejects this configuration)")
    speculate = given.take("speculate")
    if speculate is not None and speculate.value > 0:
        refuse_later(refuse(speculate, "0: speculative decoding (draft tokens per step) is not modelled"))
    elif speculate is not None:
        draft.ignore(speculate, "0 is TGI's default")

    # --- attention backend, block size, chunking
    attention = given.take("ATTENTION")
    backend = "flashinfer" if attention is None else attention.value
    if attention is None:
        draft.assume_input("ATTENTION", "flashinfer", "TGI's default backend where supported")
    block = BLOCK_SIZES[backend]
    draft.set("kv.block_size", block, f"block size of the {backend} attention backend")
    prefix = given.take("PREFIX_CACHING")
    if prefix is not None:
        draft.ignore(prefix, "the policy model has no prefix cache: exact when requests share no prefix")
    chunk_arg = given.take("PREFILL_CHUNKING")
    chunking = backend in CHUNKING_BACKENDS and (chunk_arg is None or chunk_arg.value)
    if chunk_arg is None:
        draft.assume_input("PREFILL_CHUNKING", 1, "TGI v3 default")
    if chunk_arg is not None and chunk_arg.value and backend not in CHUNKING_BACKENDS:
        draft.ignore(chunk_arg, f"the {backend} attention backend does not support prefill chunking")
    draft.set("chunking.enabled", chunking, "PREFILL_CHUNKING with a backend that supports it" if chunking
              else "no prefill chunking")
    ratio, waiting = given.take("waiting-served-ratio"), given.take("max-waiting-tokens")
    if chunking:
        for arg in (ratio, waiting):
            if arg is not None:
                draft.ignore(arg, "TGI ignores it when prefill chunking is active")
    else:
        value = 0.3 if ratio is None else ratio.value
        if value != 0:
            if ratio is None:
                raise missing("--waiting-served-ratio", "0 when prefill chunking is off: TGI then joins new requests "
                              "only when floor(batch size x ratio) of them fit (default 0.3), a gate the policy model "
                              "cannot express")
            raise refuse(ratio, "0 when prefill chunking is off: the join gate (a new batch joins only when "
                         "floor(batch size x ratio) requests fit) is not expressible")
        if waiting is not None:
            draft.ignore(waiting, "no effect with --waiting-served-ratio 0")

    # --- budgets
    prefill_arg = given.take("max-batch-prefill-tokens")
    if prefill_arg is None:
        prefill = 4096
        draft.assume_input("--max-batch-prefill-tokens", 4096, "TGI's fallback default (it may compute a "
                           "compute-optimal value at start-up: take it from the launcher log)")
    else:
        prefill = prefill_arg.value
    rounded = -(-prefill // block) * block
    if rounded != prefill:
        draft.approximate("batch.max_num_batched_tokens", rounded, f"TGI rounds {prefill} up to a multiple of the "
                          f"block size {block}")
    if not chunking and rounded < mml:
        if rounded >= mml - 1:
            draft.approximate("batch.max_num_batched_tokens", mml, f"the policy model needs a whole prompt of up to "
                              f"max_model_len tokens to fit one step without chunking; TGI's {rounded} covers the "
                              f"longest prompt ({mml - 1})")
            rounded = mml
        else:
            culprit = prefill_arg if prefill_arg is not None else input_arg
            if culprit is None:
                raise missing("--max-batch-prefill-tokens", f">= {mml - 1} without prefill chunking (the default "
                              "4096 is too small for the longest prompt)")
            raise refuse(culprit, f">= {mml - 1} (the longest prompt) without prefill chunking: TGI rejects this "
                         "configuration")
    draft.set("batch.max_num_batched_tokens", rounded, "--max-batch-prefill-tokens" if prefill_arg else
              "assumed (default)")
    draft.set("batch.phase_mode", "decode_first" if chunking else "prefill_first",
              "new prefill chunks fill what the running batch leaves" if chunking
              else "a new batch is prefilled alone, the running batch waits")
    concurrent = given.take("max-concurrent-requests")
    inflight = 128 if concurrent is None else concurrent.value
    if concurrent is None:
        draft.assume("admission.max_inflight", 128, "--max-concurrent-requests not given: TGI's default")
    else:
        draft.set("admission.max_inflight", inflight, concurrent.shown)
    size = given.take("max-batch-size")
    seqs = inflight if size is None else min(inflight, size.value)
    if seqs > rounded:
        why = "the policy model shares one step budget between decodes and prefills"
        culprit = size if size is not None and size.value <= inflight else concurrent
        if culprit is not None:
            raise refuse(culprit, f"<= --max-batch-prefill-tokens={rounded}: {why}")
        if prefill_arg is not None:
            raise refuse(prefill_arg, f">= {seqs}, the running cap (--max-concurrent-requests, default 128): {why}")
        raise missing("--max-concurrent-requests", f"<= {rounded}: {why}")
    draft.set("batch.max_num_seqs", seqs, "running <= in flight (--max-concurrent-requests)" if size is None
              else "--max-batch-size")

    # --- KV
    kv_arg = given.take("max-batch-total-tokens")
    fraction = given.take("cuda-memory-fraction")
    if kv_arg is None:
        raise missing("--max-batch-total-tokens", "the KV capacity in tokens: TGI infers it at warm-up; take it from "
                      "the launcher log (\"Setting max batch total tokens to ...\")")
    if fraction is not None:
        draft.ignore(fraction, "--max-batch-total-tokens gives the KV capacity")
    blocks = kv_arg.value // block
    if blocks < 1:
        raise refuse(kv_arg, f">= one block ({block} tokens)")
    draft.set("kv.num_blocks", blocks, f"{kv_arg.shown} / block size {block}" if block > 1 else kv_arg.shown)
    draft.set("kv.allocation", "full_reservation", "blocks for input + max_new_tokens at admission")
    draft.set("admission.reserve_full_prompt", True, "implied by the full reservation")
    draft.set("queue.order", "fcfs", "one FIFO queue")
    draft.set("queue.head_of_line", "strict", "a request that does not fit is pushed back and admission stops")
    draft.set("preemption.triggers", [], "never preempts")
    draft.set("cancellation.release_lag_steps", 1, "lazy: noticed when the next token cannot be sent")
    draft.approximate("max_model_len", mml, "TGI rejects a request whose prompt + max_new_tokens exceeds "
                      "--max-total-tokens; the policy model admits it and stops it at max_model_len")
    given.check_all_taken()
    return draft
