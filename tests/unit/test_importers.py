"""Importers of real server configurations (docs/importers.md): one realistic configuration per system,
semantic equality with the shipped policies, the assumed defaults, priority polarity, and every option
the policy model cannot express refused with exit 2 and a message asserted word for word."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
import yaml

from checker.api import load_policy, run_import, run_simulation, validate_file
from checker.errors import BatchcheckError, InputError, InternalError, UsageError
from checker.exitcodes import ExitCode
from checker.importers import SYSTEMS, import_policy
from checker.importers.common import GIB, Machine, Opt
from checker.importers.output import write_atomic
from checker.importers.pbtxt import Ident, Message, parse_pbtxt
from tests.helpers import POLICIES, ROOT, WORKLOADS

PROFILE = ROOT / "spec" / "profiles" / "default_linear.json"
LLAMA_8B_KV = 131072  # bytes per token: 2 x 32 layers x 8 KV heads x 128 x 2 bytes


def shipped(name: str):
    """A shipped policy without its name: imports are compared with it field by field."""
    return load_policy(POLICIES / f"{name}.yaml").model_copy(update={"name": None})


def write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


# ----------------------------------------------------------------------------------------- vLLM
VLLM_V1_FLAGS = ["--num-gpu-blocks-override", "2501", "--max-model-len", "16384", "--max-num-batched-tokens", "8192",
                 "--max-num-seqs", "256", "--no-enable-prefix-caching"]


def test_vllm_default_flags_equal_the_shipped_vllm_v1_policy():
    result = import_policy("vllm", VLLM_V1_FLAGS)
    assert result.policy == shipped("vllm_v1")


def test_vllm_default_flags_with_the_default_cache_equal_the_shipped_prefix_caching_policy():
    result = import_policy("vllm", VLLM_V1_FLAGS[:-1])
    assert result.policy == shipped("prefix_caching/vllm_v1")
    assert "kv.prefix_caching.enabled=true (--enable-prefix-caching not given: on by default in V1)" in result.assumed
    assert result.policy.model_copy(update={"kv": result.policy.kv.model_copy(
        update={"prefix_caching": shipped("vllm_v1").kv.prefix_caching})}) == shipped("vllm_v1")


def test_vllm_llm_class_defaults_give_the_shipped_budgets():
    # vllm_v1.yaml is "default knobs of the LLM class on a small GPU": only the pool and length are given
    result = import_policy("vllm", ["--num-gpu-blocks-override", "2501", "--max-model-len", "16384",
                                    "--no-enable-prefix-caching"], usage_context="llm-class")
    assert result.policy == shipped("vllm_v1")
    assert "batch.max_num_seqs=256 (--max-num-seqs not given: vLLM 0.33 default for the LLM class on a GPU under " \
           "70 GiB (--gpu-memory-gib not given))" in result.assumed


def test_vllm_v0_default_flags_equal_the_shipped_v0_policy():
    result = import_policy("vllm", ["--num-gpu-blocks-override", "2501", "--max-model-len", "8192"],
                           vllm_version="0.6.3")
    assert result.policy == shipped("vllm_v0_no_chunking")
    assert result.policy.batch.phase_mode.value == "prefill_first" and result.policy.kv.watermark == 0.01


def test_vllm_lists_every_default_it_filled_in():
    result = import_policy("vllm", ["--max-model-len", "8192", "--num-gpu-blocks-override", "1001"])
    assert result.assumed == [
        "--vllm-version=0.33 (the reference version; pass --vllm-version for another one)",
        "kv.prefix_caching.enabled=true (--enable-prefix-caching not given: on by default in V1)",
        "queue.order=fcfs (--scheduling-policy not given: vLLM's default is fcfs)",
        "chunking.enabled=true (--enable-chunked-prefill not given: on by default in V1)",
        "--usage-context=api-server (engine flags are vllm serve's; the LLM class has larger defaults: "
        "--usage-context llm-class)",
        "batch.max_num_seqs=256 (--max-num-seqs not given: vLLM 0.33 default for vllm serve on a GPU under 70 GiB "
        "(--gpu-memory-gib not given))",
        "batch.max_num_batched_tokens=2048 (--max-num-batched-tokens not given: vLLM 0.33 default for vllm serve "
        "on a GPU under 70 GiB (--gpu-memory-gib not given))",
        "chunking.long_prefill_token_threshold=0 (--long-prefill-token-threshold not given: vLLM's default, no cap)",
        "admission.reserve_full_prompt=true (--scheduler-reserve-full-isl not given: vLLM 0.33 default true)",
        "kv.block_size=16 (--block-size not given: vLLM's CUDA default)",
        "kv.watermark=0.0 (--watermark not given: vLLM 0.33 default)",
    ]
    # the same lines are comments in the YAML, and every given value names its flag
    for line in result.assumed:
        assert f"# assumed: {line[:60]}" in result.text.replace("\n#   ", " ")
    assert "max_model_len: 8192                 # --max-model-len" in result.text
    assert "num_blocks: 1000                  # --num-gpu-blocks-override 1001 minus vLLM's null block" in result.text


def test_vllm_realistic_serve_command_with_a_config_file(tmp_path):
    # a production-style `vllm serve` line: model positional, a YAML config in mixed key styles, flags on top
    config = write(tmp_path, "vllm.yaml", "max_model_len: 32k\nmax-num-seqs: 128\nenable_chunked_prefill: true\n"
                                          "scheduling-policy: priority\nblock_size: 16\ngpu-memory-utilization: 0.9\n")
    result = import_policy("vllm", ["meta-llama/Llama-3.1-8B-Instruct", "--max-num-seqs", "64", "--port", "8000",
                                    "-tp", "2", "--enable-prefix-caching", "--long-prefill-token-threshold", "2048"],
                           config, machine=Machine(gpu_memory_gib=80, model_weights_gib=16, profile=PROFILE))
    p = result.policy
    assert p.max_model_len == 32000  # a lower-case k is 1000, as in vLLM
    assert p.batch.max_num_seqs == 64  # the command line wins over the config file
    assert p.batch.max_num_batched_tokens == 8192  # vllm serve on an 80 GiB GPU
    assert (p.queue.order.value, p.queue.priority_polarity.value, p.queue.preempted_requeue.value) == \
        ("priority", "lower_first", "by_order")
    assert (p.preemption.victim.value, [t.value for t in p.preemption.triggers]) == \
        ("lowest_priority", ["kv_growth_fails"])  # V1 never preempts for priority inversion
    # 0.9 x 80 GiB - 16 GiB / 2 = 64 GiB per GPU, 64 KiB of KV per token per GPU: 1,048,576 tokens
    assert p.kv.num_blocks == 1_048_576 // 16 - 1
    assert p.chunking.long_prefill_token_threshold == 2048
    assert "--port=8000 (no effect on scheduling)" in result.ignored
    assert p.kv.prefix_caching.enabled  # --enable-prefix-caching is mapped, no longer ignored
    assert not any("prefix" in line for line in result.ignored + result.approximated)
    assert not p.chunking.threshold_when_alone  # vLLM 0.33 applies the cap only with more than one request


def test_vllm_pool_from_a_declared_machine():
    result = import_policy("vllm", ["--max-model-len", "8192"],
                           machine=Machine(gpu_memory_gib=24, model_weights_gib=16, kv_bytes_per_token=LLAMA_8B_KV))
    # 0.92 x 24 GiB - 16 GiB = 6.08 GiB = 49,807 tokens of 128 KiB = 3,112 blocks, one of them the null block
    assert result.policy.kv.num_blocks == 3111
    assert "--gpu-memory-utilization=0.92 (vLLM 0.33 default; sizes kv.num_blocks)" in result.assumed
    assert any(a.startswith("--overhead-gib=0.0 (activation peak") for a in result.assumed)
    same = import_policy("vllm", ["--max-model-len", "8192"],
                         machine=Machine(gpu_memory_gib=24, model_weights_gib=16, profile=PROFILE))
    assert same.policy.kv.num_blocks == 3111  # the profile's model shape is Llama-3-8B-shaped
    fp8 = import_policy("vllm", ["--max-model-len", "8192", "--kv-cache-dtype", "fp8"],
                        machine=Machine(gpu_memory_gib=24, model_weights_gib=16, profile=PROFILE))
    assert fp8.policy.kv.num_blocks == 99614 // 16 - 1  # one byte per element: twice the tokens


def test_vllm_v0_swap_space_becomes_swap_blocks():
    flags = ["--max-model-len", "8192", "--num-gpu-blocks-override", "2501", "--preemption-mode", "swap"]
    result = import_policy("vllm", flags, vllm_version="0.6", machine=Machine(kv_bytes_per_token=LLAMA_8B_KV))
    assert result.policy.preemption.mode.value == "swap"
    assert result.policy.kv.swap_blocks == 4 * GIB // (LLAMA_8B_KV * 16)  # the default 4 GiB: 2,048 blocks
    assert "--swap-space=4.0 (vLLM V0 default, GiB of CPU swap space per GPU)" in result.assumed
    tp2 = import_policy("vllm", flags + ["--swap-space", "2", "-tp", "2"], vllm_version="0.6",
                        machine=Machine(kv_bytes_per_token=LLAMA_8B_KV))
    assert tp2.policy.kv.swap_blocks == 2048  # half the swap space, half the KV per GPU


def test_vllm_versions_change_the_semantics():
    flags = ["--max-model-len", "8192", "--num-gpu-blocks-override", "2501", "--scheduling-policy", "priority"]
    v0 = import_policy("vllm", flags, vllm_version="0.7.3").policy
    early = import_policy("vllm", flags, vllm_version="0.9.2").policy
    now = import_policy("vllm", flags).policy
    assert [t.value for t in v0.preemption.triggers] == ["kv_growth_fails", "priority_inversion"]
    assert [t.value for t in early.preemption.triggers] == ["kv_growth_fails"]
    assert (v0.batch.phase_mode.value, early.batch.phase_mode.value) == ("prefill_first", "decode_first")
    assert (v0.kv.watermark, early.kv.watermark, now.kv.watermark) == (0.01, 0.0, 0.0)
    assert (v0.admission.reserve_full_prompt, early.admission.reserve_full_prompt,
            now.admission.reserve_full_prompt) == (True, False, True)
    # VLLM_USE_V1=0 selects the V0 engine on 0.8-0.10
    legacy = import_policy("vllm", flags + ["VLLM_USE_V1=0"], vllm_version="0.9").policy
    assert legacy == v0


# ----------------------------------------------------------------------------------------- SGLang
SGLANG_FLAGS = ["--model-path", "meta-llama/Llama-3.1-8B-Instruct", "--context-length", "8192",
                "--max-total-tokens", "120000", "--chunked-prefill-size", "4096", "--max-running-requests", "256",
                "--max-prefill-tokens", "16384", "--page-size", "16", "--enable-priority-scheduling",
                "--max-queued-requests", "0", "--port", "30000"]


def test_sglang_realistic_server_args():
    flags = [f for f in SGLANG_FLAGS if f not in ("--max-queued-requests", "0")]
    result = import_policy("sglang", flags)
    p = result.policy
    assert p.max_model_len == 8192
    assert (p.kv.num_blocks, p.kv.block_size, p.kv.allocation.value) == (120000 // 16, 16, "on_demand")
    assert (p.batch.max_num_seqs, p.batch.max_num_batched_tokens, p.batch.phase_mode.value) == \
        (256, 4096, "prefill_first")
    assert p.chunking.enabled and p.batch.prefill_share is None
    assert (p.queue.order.value, p.queue.priority_polarity.value) == ("priority", "higher_first")
    assert [t.value for t in p.preemption.triggers] == ["kv_growth_fails", "priority_inversion"]
    assert p.preemption.priority_inversion_threshold == 10
    assert p.cancellation.release_lag_steps == 1
    assert ("preemption.priority_inversion_threshold=10 (--priority-scheduling-preemption-threshold not given: "
            "SGLang's default)") in result.assumed
    assert [a.split(" (")[0] for a in result.approximated] == \
        ["kv.allocation=on_demand", "preemption.victim=lowest_priority", "queue.preempted_requeue=by_order"]


def test_sglang_fcfs_defaults_and_decode_steps_larger_than_the_prefill_budget():
    result = import_policy("sglang", ["--context-length", "8192", "--max-total-tokens", "120000",
                                      "--chunked-prefill-size", "1024", "--max-queued-requests", "64",
                                      "SGLANG_REQ_WAITING_TIMEOUT=2.5"])
    p = result.policy
    # default max_running_requests: min(clamp(120000 / 8192 x 512, 2048, 4096), 120000 // 2) = 4096
    assert p.batch.max_num_seqs == 4096
    # a decode step runs all of them; prefill tokens stay within the 1024-token chunk
    assert (p.batch.max_num_batched_tokens, p.batch.prefill_token_cap) == (4096, 1024)
    assert (p.queue.order.value, p.preemption.victim.value) == ("fcfs", "fewest_generated")
    assert p.admission.max_queue_len == 64 and p.timeouts.queue_timeout_ms == 2500
    assert "kv.block_size=1 (--page-size not given: SGLang's default, one token per page)" in result.assumed


def test_sglang_pool_and_chunk_from_a_declared_machine():
    result = import_policy("sglang", ["--context-length", "8192"],
                           machine=Machine(gpu_memory_gib=80, model_weights_gib=16, kv_bytes_per_token=LLAMA_8B_KV))
    # 0.88 x 80 - 16 = 54.4 GiB of 128 KiB tokens
    assert result.policy.kv.num_blocks == int(54.4 * GIB) // LLAMA_8B_KV
    assert result.policy.batch.max_num_batched_tokens == 8192  # chunked_prefill_size on an 80 GiB GPU
    assert "--mem-fraction-static=0.88 (SGLang picks it at start-up (about 0.88); sizes the KV pool)" in result.assumed


def test_sglang_lpm_without_radix_cache_is_sglangs_own_fcfs_fallback():
    result = import_policy("sglang", ["--context-length", "8192", "--max-total-tokens", "100000",
                                      "--schedule-policy", "lpm", "--disable-radix-cache"])
    assert result.policy.queue.order.value == "fcfs"
    assert ("queue.order=fcfs (--schedule-policy lpm falls back to fcfs when the radix cache is disabled (SGLang "
            "does this itself))") in result.approximated


# ----------------------------------------------------------------------------------------- TGI
TGI_FLAGS = ["--model-id", "meta-llama/Llama-3.1-8B-Instruct", "--max-concurrent-requests", "128",
             "--max-batch-prefill-tokens", "4096", "--max-batch-total-tokens", "40000", "--max-input-tokens", "8191",
             "--max-total-tokens", "8192", "--waiting-served-ratio", "0.3"]


def test_tgi_launcher_args_equal_the_shipped_tgi_router_policy():
    result = import_policy("tgi", TGI_FLAGS)
    assert result.policy == shipped("tgi_router")
    assert result.assumed == ["ATTENTION=flashinfer (TGI's default backend where supported)",
                              "PREFILL_CHUNKING=1 (TGI v3 default)"]
    assert "--waiting-served-ratio=0.3 (TGI ignores it when prefill chunking is active)" in result.ignored


def test_tgi_paged_attention_without_chunking():
    result = import_policy("tgi", ["--max-total-tokens", "4096", "--max-input-tokens", "4095",
                                   "--max-batch-prefill-tokens", "4095", "--max-batch-total-tokens", "40000",
                                   "--waiting-served-ratio", "0", "ATTENTION=paged", "MAX_CONCURRENT_REQUESTS=64"])
    p = result.policy
    assert (p.kv.block_size, p.kv.num_blocks) == (16, 2500)
    assert not p.chunking.enabled and p.batch.phase_mode.value == "prefill_first"
    assert p.batch.max_num_batched_tokens == 4096  # 4095 rounded up to the 16-token block
    assert p.admission.max_inflight == 64 and p.batch.max_num_seqs == 64


# ----------------------------------------------------------------------------------------- TensorRT-LLM
TRT_NO_EVICT = """\
# trtllm-serve --extra_llm_api_options
max_batch_size: 2048
max_num_tokens: 8192
max_seq_len: 8192
enable_chunked_prefill: false
kv_cache_config:
  tokens_per_block: 32
  max_tokens: 40000
  enable_block_reuse: true
scheduler_config:
  capacity_scheduler_policy: GUARANTEED_NO_EVICT
print_iter_log: true
"""


def test_trtllm_guaranteed_no_evict_equals_the_shipped_policy(tmp_path):
    result = import_policy("trtllm", [], write(tmp_path, "llm_api.yaml", TRT_NO_EVICT))
    assert result.policy == shipped("trtllm_guaranteed_no_evict")


def test_trtllm_max_utilization_with_chunking_equals_the_shipped_policy(tmp_path):
    text = TRT_NO_EVICT.replace("GUARANTEED_NO_EVICT", "MAX_UTILIZATION").replace(
        "enable_chunked_prefill: false", "enable_chunked_prefill: true")
    result = import_policy("trtllm", [write(tmp_path, "llm_api.yaml", text)])  # the YAML as a positional file
    assert result.policy == shipped("trtllm_max_utilization")


def test_trtllm_static_batch_and_a_pool_from_the_machine(tmp_path):
    config = write(tmp_path, "static.yaml", "max_seq_len: 4096\nmax_batch_size: 64\nscheduler_config:\n"
                                            "  capacity_scheduler_policy: static_batch\n")
    result = import_policy("trtllm", ["--kv_cache_free_gpu_memory_fraction", "0.5"], config,
                           machine=Machine(gpu_memory_gib=80, model_weights_gib=16, kv_bytes_per_token=LLAMA_8B_KV))
    p = result.policy
    assert (p.batch.phase_mode.value, p.kv.allocation.value, p.preemption.triggers) == \
        ("static", "full_reservation", [])
    assert p.kv.num_blocks == int(0.5 * 64 * GIB // LLAMA_8B_KV) // 32  # half of what the weights leave


# ----------------------------------------------------------------------------------------- Triton
TRITON_STATIC = """\
name: "llama_hf"
backend: "python"
max_batch_size: 8
input [ { name: "text_input" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "text_output" data_type: TYPE_STRING dims: [ 1 ] } ]
dynamic_batching {
  max_queue_delay_microseconds: 0
}
instance_group [ { count: 1, kind: KIND_GPU, gpus: [ 0 ] } ]
"""


def test_triton_dynamic_batcher_equals_the_shipped_static_batching_policy(tmp_path):
    result = import_policy("triton", [write(tmp_path, "config.pbtxt", TRITON_STATIC), "--max-model-len", "8192"])
    assert result.policy == shipped("static_batching")


def test_triton_priority_levels_queue_policy_and_timeout(tmp_path):
    text = TRITON_STATIC.replace("  max_queue_delay_microseconds: 0\n", """\
  priority_levels: 3
  default_priority_level: 2
  default_queue_policy {
    timeout_action: REJECT
    default_timeout_microseconds: 3000000
    allow_timeout_override: true
  }
""")
    result = import_policy("triton", ["--max-model-len", "8192"], write(tmp_path, "config.pbtxt", text))
    p = result.policy
    assert (p.queue.order.value, p.queue.priority_polarity.value) == ("priority", "lower_first")
    assert (p.timeouts.queue_timeout_ms, p.timeouts.action.value) == (3000, "reject")
    single = import_policy("triton", ["--max-model-len", "8192"], write(tmp_path, "one.pbtxt", TRITON_STATIC.replace(
        "  max_queue_delay_microseconds: 0\n", "  default_queue_policy { max_queue_size: 16 }\n")))
    assert single.policy.admission.max_queue_len == 16 and single.policy.queue.order.value == "fcfs"


# ----------------------------------------------------------------------------------------- polarity
@pytest.mark.parametrize("system,args,polarity", [
    ("vllm", ["--max-model-len", "4096", "--num-gpu-blocks-override", "500", "--scheduling-policy", "priority"],
     "lower_first"),
    ("sglang", ["--context-length", "4096", "--max-total-tokens", "50000", "--enable-priority-scheduling"],
     "higher_first"),
    ("sglang", ["--context-length", "4096", "--max-total-tokens", "50000", "--enable-priority-scheduling",
                "--schedule-low-priority-values-first"], "lower_first"),
])
def test_priority_polarity_is_normalised(system, args, polarity):
    p = import_policy(system, args).policy
    assert p.queue.order.value == "priority" and p.queue.priority_polarity.value == polarity


def test_triton_level_one_is_the_highest_priority(tmp_path):
    text = TRITON_STATIC.replace("  max_queue_delay_microseconds: 0\n", "  priority_levels: 2\n"
                                 "  default_priority_level: 1\n")
    p = import_policy("triton", ["--max-model-len", "8192"], write(tmp_path, "c.pbtxt", text)).policy
    assert p.queue.priority_polarity.value == "lower_first"


# ----------------------------------------------------------------------------------------- refused
REFUSED = [
    ("vllm", ["--max-model-len", "4096", "--num-gpu-blocks-override", "500", "--max-num-seqz", "8"], None,
     "--max-num-seqz='8' (expected an option batchcheck knows for vLLM, listed in docs/importers.md, or "
     "--ignore-unknown; did you mean --max-num-seqs?)"),
    ("vllm", ["--num-gpu-blocks-override", "500"], None,
     "--max-model-len=<missing> (expected the model's context length: vLLM reads it from the model's config, which "
     "batchcheck does not have)"),
    ("vllm", ["--max-model-len", "4096", "--num-gpu-blocks-override", "500", "--swap-space", "8"], None,
     "--swap-space=8.0 (expected an option of vLLM 0.33: it went away with the V0 engine)"),
    ("vllm", ["--max-model-len", "4096", "--num-gpu-blocks-override", "500", "--prefill-schedule-interval", "4"],
     None, "--prefill-schedule-interval=4 (expected 1: admitting prefills only every N steps is not modelled)"),
    ("vllm", ["--max-model-len", "4096", "--num-gpu-blocks-override", "500", "--pipeline-parallel-size", "2"], None,
     "--pipeline-parallel-size=2 (expected 1: the policy model is one engine running one batch at a time (pipeline "
     "stages and data-parallel engines are not modelled))"),
    ("vllm", ["--max-model-len", "8192", "--num-gpu-blocks-override", "500", "--no-enable-chunked-prefill",
              "--max-num-batched-tokens", "4096"], None,
     "--max-num-batched-tokens=4096 (expected >= --max-model-len=8192 when chunked prefill is off: vLLM rejects this "
     "configuration (a whole prompt must fit one step))"),
    ("sglang", ["--context-length", "8192", "--max-total-tokens", "100000", "--schedule-policy", "lof"], None,
     "--schedule-policy='lof' (expected fcfs, or fcfs with --enable-priority-scheduling: lof orders by longest "
     "max_new_tokens first, which the policy model cannot express)"),
    ("sglang", ["--context-length", "8192", "--max-total-tokens", "100000", "--schedule-policy", "lpm"], None,
     "--schedule-policy='lpm' (expected fcfs, or lpm with --disable-radix-cache (SGLang then falls back to fcfs): "
     "lpm orders by the radix prefix cache, which the policy model does not have)"),
    ("sglang", ["--context-length", "8192", "--max-total-tokens", "100000", "--enable-priority-scheduling",
                "--max-queued-requests", "32"], None,
     "--max-queued-requests=32 (expected no queue cap with --enable-priority-scheduling: SGLang then aborts the "
     "lowest-priority queued request for a higher-priority arrival, which the policy model cannot express)"),
    ("sglang", ["--context-length", "8192", "--max-total-tokens", "100000", "--enable-mixed-chunk"], None,
     "--enable-mixed-chunk=True (expected false: mixing decodes into the prefill batch shares its budget in a way the "
     "policy model does not express)"),
    ("tgi", ["--max-total-tokens", "2048", "--max-input-tokens", "1024", "--max-batch-total-tokens", "40000"], None,
     "--max-input-tokens=1024 (expected --max-total-tokens - 1 = 2047: the policy model has one length limit (prompts "
     "of max_model_len tokens or more are rejected), not a separate, smaller prompt limit)"),
    ("tgi", ["--max-total-tokens", "4096", "--max-batch-total-tokens", "40000", "PREFILL_CHUNKING=0"], None,
     "--waiting-served-ratio=<missing> (expected 0 when prefill chunking is off: TGI then joins new requests only "
     "when floor(batch size x ratio) of them fit (default 0.3), a gate the policy model cannot express)"),
    ("tgi", ["--max-total-tokens", "4096"], None,
     "--max-batch-total-tokens=<missing> (expected the KV capacity in tokens: TGI infers it at warm-up; take it from "
     "the launcher log (\"Setting max batch total tokens to ...\"))"),
]


@pytest.mark.parametrize("system,args,config,message", REFUSED, ids=[f"{r[0]}-{i}" for i, r in enumerate(REFUSED)])
def test_options_the_policy_model_cannot_express_exit_2(system, args, config, message):
    with pytest.raises(InputError) as err:
        import_policy(system, args, config)
    assert err.value.exit_code == ExitCode.INPUT_ERROR
    assert str(err.value) == message


def test_refused_options_in_config_files_name_file_and_line(tmp_path):
    trt = write(tmp_path, "llm_api.yaml", "max_seq_len: 8192\nenable_chunked_prefill: true\nkv_cache_config:\n"
                                          "  max_tokens: 40000\nscheduler_config:\n"
                                          "  context_chunking_policy: EQUAL_PROGRESS\n")
    with pytest.raises(InputError) as err:
        import_policy("trtllm", [], trt)
    assert str(err.value) == (f"{trt}:6: scheduler_config.context_chunking_policy='EQUAL_PROGRESS' (expected "
                              "FIRST_COME_FIRST_SERVED: handing out chunk units round-robin is not modelled)")
    delay = write(tmp_path, "config.pbtxt", TRITON_STATIC.replace(
        "  max_queue_delay_microseconds: 0\n", "  default_queue_policy {\n    timeout_action: DELAY\n"
                                               "    default_timeout_microseconds: 500000\n  }\n"))
    with pytest.raises(InputError) as err:
        import_policy("triton", ["--max-model-len", "8192"], delay)
    assert str(err.value) == (f"{delay}:8: dynamic_batching.default_queue_policy.timeout_action='DELAY' (expected "
                              "REJECT: DELAY moves a timed-out request behind the others (it may wait forever); the "
                              "policy model only rejects timed-out requests)")
    vllm = write(tmp_path, "vllm.yaml", "max-model-len: 4096\nnum_gpu_blocks_override: 500\nscheduler-cls: my.Sched\n")
    with pytest.raises(InputError) as err:
        import_policy("vllm", [], vllm)
    assert str(err.value) == (f"{vllm}:3: scheduler-cls='my.Sched' (expected no scheduler-cls: a custom scheduler "
                              "class cannot be imported)")


def test_machine_options_for_a_system_that_does_not_read_them_are_a_usage_error():
    with pytest.raises(UsageError) as err:
        import_policy("tgi", ["--max-total-tokens", "4096"], machine=Machine(gpu_memory_gib=80))
    assert str(err.value) == ("--gpu-memory-gib is not read by the tgi importer (expected it only for sglang, trtllm, "
                              "vllm): see docs/importers.md for how tgi's KV pool is given")


# ----------------------------------------------------------------------------------------- no option is dropped
def _sample(opt: Opt) -> str:
    return {"bool": "true", "float": "0.5", "choice": opt.choices[0] if opt.choices else "x", "str": "x",
            "any": "x"}.get(opt.kind, "2")


def _base(system: str, tmp_path: Path) -> tuple[list[str], str | None]:
    if system == "vllm":
        return ["--max-model-len", "4096", "--num-gpu-blocks-override", "500"], None
    if system == "sglang":
        return ["--context-length", "4096", "--max-total-tokens", "50000"], None
    if system == "tgi":
        return ["--max-total-tokens", "4096", "--max-batch-total-tokens", "40000"], None
    if system == "trtllm":
        return ["--max_seq_len", "4096", "--kv_cache_config.max_tokens", "40000"], None
    return ["--max-model-len", "4096"], write(tmp_path, "c.pbtxt", TRITON_STATIC)


@pytest.mark.parametrize("system", SYSTEMS)
def test_every_known_option_is_mapped_reported_or_refused(system, tmp_path):
    """Each option of each table, alone on top of a minimal configuration: the import succeeds (and the
    option shows up as a field, an assumption, an approximation or an ignored line) or is refused with
    exit 2. An option an importer forgot would be an internal error (Given.check_all_taken)."""
    import importlib

    table = importlib.import_module(f"checker.importers.{system}").TABLE
    base, config = _base(system, tmp_path)
    versions = ["0.33", "0.9", "0.6"] if system == "vllm" else [None]
    for opt in table.opts:
        for version in versions:
            flag = opt.name if opt.name.isupper() else f"--{opt.name}"
            extra = [f"{flag}={_sample(opt)}"]
            try:
                result = import_policy(system, base + extra, config, vllm_version=version)
            except (InputError, UsageError) as exc:
                assert exc.exit_code == ExitCode.INPUT_ERROR
                continue
            except InternalError as exc:  # pragma: no cover - the failure this test exists for
                pytest.fail(f"{system} {version} {flag}: {exc}")
            assert result.text


# ----------------------------------------------------------------------------------------- output
def _realistic(tmp_path: Path) -> dict[str, tuple[list[str], str | None]]:
    return {
        "vllm": (VLLM_V1_FLAGS + ["--scheduling-policy", "priority"], None),
        "sglang": ([f for f in SGLANG_FLAGS if f not in ("--max-queued-requests", "0")], None),
        "tgi": (TGI_FLAGS, None),
        "trtllm": ([], write(tmp_path, "llm_api.yaml", TRT_NO_EVICT)),
        "triton": (["--max-model-len", "8192"], write(tmp_path, "config.pbtxt", TRITON_STATIC)),
    }


@pytest.mark.parametrize("system", SYSTEMS)
def test_imported_yaml_round_trips_validates_and_simulates(system, tmp_path):
    args, config = _realistic(tmp_path)[system]
    out = tmp_path / f"imported_{system}.yaml"
    result = run_import(system, args, config, out=out)
    assert out.read_text() == result.text
    assert yaml.safe_load(result.text) == result.data  # the comments are comments only
    assert validate_file(out) == "policy"
    assert load_policy(out) == result.policy.model_copy(update={"name": out.stem})
    sim = run_simulation(out, workload=WORKLOADS / "chat_mixed.yaml", limit=60)
    summary = sim.summary()["overall"]
    assert summary["requests"] == 60 and summary["finished"] > 0


def test_the_name_option_names_the_policy():
    result = import_policy("vllm", VLLM_V1_FLAGS, name="prod-vllm")
    assert result.text.splitlines()[result.text.splitlines().index("name: prod-vllm")] == "name: prod-vllm"
    assert result.policy.name == "prod-vllm"


def test_write_atomic_replaces_the_whole_file_or_nothing(tmp_path, monkeypatch):
    target = tmp_path / "p.yaml"
    target.write_text("old\n")
    target.chmod(0o640)
    write_atomic(target, "new\n")
    assert target.read_text() == "new\n" and stat.S_IMODE(target.stat().st_mode) == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.yaml"]

    def fail(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(InputError) as err:
        write_atomic(target, "newer\n")
    assert str(err.value) == f"--out='{target}' (expected a writable file path (No space left on device))"
    assert target.read_text() == "new\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.yaml"]  # the temporary file is gone


def test_write_atomic_into_a_missing_directory(tmp_path):
    with pytest.raises(InputError) as err:
        write_atomic(tmp_path / "nope" / "p.yaml", "x\n")
    assert str(err.value).startswith(f"--out='{tmp_path / 'nope' / 'p.yaml'}' (expected a file in an existing, "
                                     "writable directory")


# ----------------------------------------------------------------------------------------- the pbtxt reader
def test_pbtxt_reader_covers_the_config_syntax():
    msg = parse_pbtxt('a: 1 b: -2.5e3 c: "x\\"y" \'z\' d: ENUM e: true\nf { g: [1, 2,] }\nh [ { i: 0x10 } ]\n'
                      'j: { k: 1 }; l < m: 2 > # comment\nf { g: 3 }\n', "c.pbtxt")
    assert [f.name for f in msg.fields] == ["a", "b", "c", "d", "e", "f", "h", "j", "l", "f"]
    values = {f.name: f.value for f in msg.fields}
    assert values["a"] == 1 and values["b"] == -2500.0 and values["c"] == 'x"yz'
    assert isinstance(values["d"], Ident) and values["e"] == "true"
    assert [f.value.fields[0].value for f in msg.all("f")] == [[1, 2], 3]
    assert values["h"][0].fields[0].value == 16 and isinstance(values["l"], Message)
    assert [f.line for f in msg.fields] == [1, 1, 1, 1, 1, 2, 3, 4, 4, 5]


@pytest.mark.parametrize("text,message", [
    ("a {\n b: 1\n", "c.pbtxt:1: (document)=<end of file> (expected '}' closing the message opened on line 1)"),
    ("a: 1\nb: $\n", "c.pbtxt:2: (document)='$' (expected protobuf text format)"),
    ("a: [1,\n 2\n", "c.pbtxt:2: (document)=<end of file> (expected ']' closing the list opened on line 1)"),
    ("a: 1\n: 2\n", "c.pbtxt:2: (document)=':' (expected a field name)"),
])
def test_pbtxt_syntax_errors_name_the_line(text, message):
    with pytest.raises(InputError) as err:
        parse_pbtxt(text, "c.pbtxt")
    assert str(err.value) == message


def test_every_error_is_a_batchcheck_error():
    for system in SYSTEMS:
        with pytest.raises(BatchcheckError):
            import_policy(system, ["--definitely-not-an-option", "1"])


def test_vllm_production_flags_are_mapped_ignored_or_refused_by_name():
    base = ["--max-model-len", "4096", "--num-gpu-blocks-override", "101"]
    result = import_policy("vllm", base + ["--kv-cache-dtype", "fp8", "--cuda-graph-sizes", "8,16",
                                           "--compilation-config", "{}", "--reasoning-parser", "deepseek_r1",
                                           "--tokenizer-mode", "auto", "--enable-expert-parallel",
                                           "--cpu-offload-gb", "4", "--limit-mm-per-prompt", "image=2"])
    # fp8 KV never vanishes silently: with a fixed pool it is reported as not changing it
    assert ("--kv-cache-dtype=fp8 (--num-gpu-blocks-override fixes the pool: the KV dtype would only change how "
            "many blocks fit in the GPU's memory)") in result.ignored
    assert "--cuda-graph-sizes=8,16 (no effect on scheduling)" in result.ignored
    assert len([line for line in result.ignored if "(no effect on scheduling)" in line]) == 6
    assert ("--cpu-offload-gb=4.0 (--num-gpu-blocks-override fixes the pool: offloaded weights would only change how "
            "much GPU memory is left for KV)") in result.ignored
    for flags, name in ((["--enable-lora", "--max-loras", "4"], "--enable-lora"), (["--max-loras", "4"], "--max-loras")):
        with pytest.raises(InputError, match=f"expected no {name}: "):
            import_policy("vllm", base + flags)


@pytest.mark.parametrize("config, kind", [
    ('{"kv_connector": "NixlConnector", "kv_role": "kv_consumer"}', "decode_node"),
    ('{"kv_connector": "NixlConnector", "kv_role": "kv_producer"}', "prefill_node"),
    ('{"kv_connector": "NixlConnector", "kv_role": "kv_both"}', "both"),
    ('{"kv_connector": "OffloadingConnector", "kv_role": "kv_both"}', "offload"),
    ('{"kv_connector": "LMCacheConnectorV1"}', "offload"),
])
def test_vllm_kv_transfer_config_maps_onto_the_connector(config, kind):
    result = import_policy("vllm", ["--max-model-len", "4096", "--num-gpu-blocks-override", "101",
                                    "--kv-transfer-config", config])
    assert result.policy.connector.kind.value == kind
    assert ("connector.holders_first=true (vLLM 0.33 scans the requests holding KV (kv_holding_waiting) before the "
            "waiting queue)") in result.assumed


def test_vllm_kv_offloading_size_is_the_offloading_connector():
    result = import_policy("vllm", ["--max-model-len", "4096", "--num-gpu-blocks-override", "101",
                                    "--kv-offloading-size", "8"])
    assert result.policy.connector.kind.value == "offload"


@pytest.mark.parametrize("flags, message", [
    (["--kv-transfer-config", '{"kv_connector": "P2pNcclConnector", "kv_role": "kv_both"}'],
     "--kv-transfer-config='{\"kv_connector\": \"P2pNcclConnector\", \"kv_role\": \"kv_both\"}' (expected "
     "kv_connector one of NixlConnector, FakeKVConnector, OffloadingConnector, LMCacheConnectorV1 (the connectors "
     "whose scheduler side the model has; P2pNcclConnector is not modelled))"),
    (["--kv-transfer-config", '{"kv_connector": "NixlConnector", "kv_role": "kv_sideways"}'],
     "expected kv_role one of kv_consumer, kv_producer, kv_both (it is kv_sideways)"),
    (["--kv-transfer-config", "{}"], "--kv-transfer-config='{}' (expected a JSON object naming its \"kv_connector\")"),
    (["--kv-transfer-config", "nope"], "expected a JSON object, e.g."),
    (["--kv-offloading-size", "0"], "--kv-offloading-size=0.0 (expected a size > 0 GiB)"),
    (["--kv-offloading-size", "4", "--kv-transfer-config", '{"kv_connector": "NixlConnector"}'],
     "expected no --kv-offloading-size with --kv-transfer-config"),
])
def test_vllm_connector_flags_the_model_lacks_are_refused_by_name(flags, message):
    with pytest.raises(InputError) as err:
        import_policy("vllm", ["--max-model-len", "4096", "--num-gpu-blocks-override", "101"] + flags)
    assert message in str(err.value)


@pytest.mark.parametrize("flags, message", [
    (["--disaggregation-mode", "decode"], "--disaggregation-mode='decode' (expected null: SGLang's disaggregation queues"),
    (["--disaggregation-mode", "prefill"], "--disaggregation-mode='prefill' (expected null: SGLang's disaggregation"),
    (["--enable-hierarchical-cache"], "--enable-hierarchical-cache=True (expected false: HiCache's host-memory KV tier"),
])
def test_sglang_disaggregation_and_hicache_are_refused_by_name(flags, message):
    with pytest.raises(InputError) as err:
        import_policy("sglang", ["--context-length", "4096", "--max-total-tokens", "20000"] + flags)
    assert message in str(err.value)


def test_sglang_disaggregation_mode_null_is_the_plain_server():
    result = import_policy("sglang", ["--context-length", "4096", "--max-total-tokens", "20000",
                                      "--disaggregation-mode", "null"])
    assert result.policy.connector.kind.value == "none"
