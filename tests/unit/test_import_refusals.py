"""Every refused option of one import reported at once, ``--ignore-unknown``, and the common production flags
mapped, ignored or refused by name, for every importer (issue 19): messages asserted word for word."""

from __future__ import annotations

from pathlib import Path

import pytest

from checker.cli import main
from checker.errors import InputError
from checker.exitcodes import ExitCode
from checker.importers import import_policy
from checker.importers.common import Machine
from checker.importers.refusals import Refused

UNKNOWN_IGNORED = "(unknown to batchcheck, ignored by --ignore-unknown: it may change scheduling)"
VLLM_BASE = ["--max-model-len", "4096", "--num-gpu-blocks-override", "500"]
SGLANG_BASE = ["--context-length", "4096", "--max-total-tokens", "20000"]
SGLANG_LORA = ("LoRA adapters: SGLang's scheduler stops filling a prefill batch when its adapters would exceed "
               "--max-loras-per-batch, which the policy model does not do")
VLLM_LORA = ("LoRA adapters: the scheduler skips a request whose adapter would exceed --max-loras, which the policy "
             "model does not do")
TRITON = """\
name: "llama_hf"
backend: "python"
max_batch_size: 8
dynamic_batching {
  max_queue_delay_microseconds: 0
  frobnicate: 3
}
colour: BLUE
"""


def refused(system: str, args: list[str], config: str | None = None, **kw) -> str:
    with pytest.raises(InputError) as err:
        import_policy(system, args, config, **kw)
    assert err.value.exit_code == ExitCode.INPUT_ERROR
    return str(err.value)


def test_vllm_reports_every_unknown_and_refused_option_at_once():
    message = refused("vllm", VLLM_BASE + ["--max-num-seqz", "8", "--enable-lora", "--frobnicate",
                                           "--pipeline-parallel-size", "2", "--swap-space", "4"])
    assert message == (
        "5 options cannot be imported:\n"
        "  --max-num-seqz='8' (expected an option batchcheck knows for vLLM, listed in docs/importers.md, or "
        "--ignore-unknown; did you mean --max-num-seqs?)\n"
        "  --frobnicate=<unknown option> (expected an option batchcheck knows for vLLM, listed in docs/importers.md, "
        "or --ignore-unknown)\n"
        "  --swap-space=4.0 (expected an option of vLLM 0.33: it went away with the V0 engine)\n"
        f"  --enable-lora=True (expected no --enable-lora: {VLLM_LORA})\n"
        "  --pipeline-parallel-size=2 (expected 1: the policy model is one engine running one batch at a time "
        "(pipeline stages and data-parallel engines are not modelled))")


def test_a_refusal_found_later_in_the_import_is_listed_after_the_gathered_ones():
    # the misspelt --max-model-len is unknown; the import goes on and then misses --max-model-len itself
    message = refused("vllm", ["--max-model-lenn", "4096", "--num-gpu-blocks-override", "500"])
    assert message == (
        "2 options cannot be imported:\n"
        "  --max-model-lenn='4096' (expected an option batchcheck knows for vLLM, listed in docs/importers.md, or "
        "--ignore-unknown; did you mean --max-model-len?)\n"
        "  --max-model-len=<missing> (expected the model's context length: vLLM reads it from the model's config, "
        "which batchcheck does not have)")


def test_ignore_unknown_lists_each_unknown_option_as_ignored_and_still_refuses_known_ones():
    result = import_policy("vllm", VLLM_BASE + ["--frobnicate", "--max-num-seqz", "8", "VLLM_USE_V1=1"],
                           ignore_unknown=True)
    assert result.ignored[:2] == [f"--frobnicate {UNKNOWN_IGNORED}", f"--max-num-seqz=8 {UNKNOWN_IGNORED}"]
    assert result.policy.batch.max_num_seqs == 256  # the misspelt value is not used
    assert refused("vllm", VLLM_BASE + ["--frobnicate", "--max-loras", "4"], ignore_unknown=True) == (
        "--max-loras=4 (expected no --max-loras: the scheduler skips requests beyond this many LoRA adapters per "
        "batch (not modelled))")


def test_vllm_cpu_offload_is_ignored_with_a_fixed_pool_and_refused_when_the_pool_is_computed():
    fixed = import_policy("vllm", VLLM_BASE + ["--cpu-offload-gb", "4", "--no-enable-lora"])
    assert fixed.ignored == [
        "--no-enable-lora=false (off)",
        "--cpu-offload-gb=4.0 (--num-gpu-blocks-override fixes the pool: offloaded weights would only change how much "
        "GPU memory is left for KV)"]
    machine = Machine(gpu_memory_gib=80, model_weights_gib=16, kv_bytes_per_token=131072)
    assert refused("vllm", ["--max-model-len", "4096", "--cpu-offload-gb", "4", "--lora-modules", "a=b"],
                   machine=machine) == (
        "2 options cannot be imported:\n"
        f"  --lora-modules='a=b' (expected no --lora-modules: {VLLM_LORA})\n"
        "  --cpu-offload-gb=4.0 (expected 0, or a fixed KV pool: offloading weights to the CPU leaves more GPU memory "
        "for KV than the pool computed from the declared machine (give the pool the server's log prints))")


def test_sglang_reports_every_refusal_at_once_and_maps_production_flags():
    message = refused("sglang", SGLANG_BASE + ["--enable-lora", "--max-loras-per-batch", "4", "--pp-size", "2",
                                               "--speculative-algorithm", "EAGLE", "--no-such", "1", "FOO_TIMEOUT=3"])
    assert message == (
        "6 options cannot be imported:\n"
        "  --no-such='1' (expected an option batchcheck knows for SGLang, listed in docs/importers.md, or "
        "--ignore-unknown)\n"
        "  FOO_TIMEOUT='3' (expected an environment variable batchcheck knows for SGLang, listed in "
        "docs/importers.md, or --ignore-unknown)\n"
        f"  --enable-lora=True (expected no --enable-lora: {SGLANG_LORA})\n"
        f"  --max-loras-per-batch=4 (expected no --max-loras-per-batch: {SGLANG_LORA})\n"
        "  --pp-size=2 (expected 1: the policy model is one engine running one batch at a time)\n"
        "  --speculative-algorithm='EAGLE' (expected no speculative decoding: draft tokens per step are not "
        "modelled)")
    result = import_policy("sglang", SGLANG_BASE + ["--cuda-graph-bs", "1,2", "--ep-size", "2", "--cpu-offload-gb",
                                                    "2", "--no-such", "1", "FOO_TIMEOUT=3", "--reasoning-parser",
                                                    "qwen3", "--tokenizer-mode", "auto", "--enable-multimodal"],
                           ignore_unknown=True)
    assert result.ignored == [
        f"--no-such=1 {UNKNOWN_IGNORED}", f"FOO_TIMEOUT=3 {UNKNOWN_IGNORED}",
        "--cuda-graph-bs=1,2 (no effect on scheduling)", "--ep-size=2 (no effect on scheduling)",
        "--reasoning-parser=qwen3 (no effect on scheduling)", "--tokenizer-mode=auto (no effect on scheduling)",
        "--enable-multimodal=true (no effect on scheduling)",
        "--cpu-offload-gb=2.0 (--max-total-tokens fixes the pool: offloaded weights would only change how much GPU "
        "memory is left for KV)"]


def test_sglang_rules_mapping_gathers_its_refusals_too():
    message = refused("sglang", SGLANG_BASE + ["--disable-radix-cache", "--lora-paths", "a", "--dp-size", "2"],
                      rules="sglang")
    assert message == (
        "2 options cannot be imported:\n"
        f"  --lora-paths='a' (expected no --lora-paths: {SGLANG_LORA})\n"
        "  --dp-size=2 (expected 1: the policy model is one engine running one batch at a time)")


def test_tgi_reports_every_unknown_option_and_ignores_cuda_graphs():
    assert refused("tgi", ["--max-total-tokens", "4096", "--max-batch-total-tokens", "40000", "--frobnicate",
                           "--max-batch-sizee", "4"]) == (
        "2 options cannot be imported:\n"
        "  --frobnicate=<unknown option> (expected an option batchcheck knows for TGI, listed in docs/importers.md, "
        "or --ignore-unknown)\n"
        "  --max-batch-sizee='4' (expected an option batchcheck knows for TGI, listed in docs/importers.md, or "
        "--ignore-unknown; did you mean --max-batch-size?)")
    result = import_policy("tgi", ["--max-total-tokens", "4096", "--max-batch-total-tokens", "40000", "--cuda-graphs",
                                   "1,2", "--frobnicate"], ignore_unknown=True)
    assert result.ignored[:2] == [f"--frobnicate {UNKNOWN_IGNORED}", "--cuda-graphs=1,2 (no effect on scheduling)"]


def test_trtllm_gathers_refusals_from_the_command_line_and_the_yaml(tmp_path: Path):
    config = tmp_path / "llm_api.yaml"
    config.write_text("max_seq_len: 4096\nkv_cache_config:\n  max_tokens: 40000\n  colour: blue\nlora_config: {}\n"
                      "torch_compile_config: {}\nmoe_expert_parallel_size: 4\n")
    assert refused("trtllm", ["--max_beam_width", "4", "--zap", "1"], str(config)) == (
        "4 options cannot be imported:\n"
        "  --zap='1' (expected an option batchcheck knows for TensorRT-LLM, listed in docs/importers.md, or "
        "--ignore-unknown)\n"
        f"  {config}:4: kv_cache_config.colour='blue' (expected an option batchcheck knows for TensorRT-LLM, listed "
        "in docs/importers.md, or --ignore-unknown)\n"
        f"  {config}:5: lora_config={{}} (expected no lora_config: LoRA: the capacity scheduler also admits against "
        "the PEFT cache's pages, which the policy model does not have)\n"
        "  --max_beam_width=4 (expected 1: beam search is not modelled)")
    config.write_text("max_seq_len: 4096\nkv_cache_config:\n  max_tokens: 40000\n  colour: blue\n"
                      "torch_compile_config: {}\nmoe_expert_parallel_size: 4\n")
    result = import_policy("trtllm", [], str(config), ignore_unknown=True)
    assert result.ignored[:3] == [f"kv_cache_config.colour=blue {UNKNOWN_IGNORED}",
                                  "torch_compile_config=\"{}\" (no effect on scheduling)",
                                  "moe_expert_parallel_size=4 (no effect on scheduling)"]


def test_triton_reports_every_unknown_field_and_ignores_them_on_request(tmp_path: Path):
    config = tmp_path / "config.pbtxt"
    config.write_text(TRITON)
    message = refused("triton", ["--max-model-len", "8192"], str(config))
    assert message.splitlines() == [
        "2 options cannot be imported:",
        f"  {config}:8: colour='BLUE' (expected a field batchcheck knows here: backend, batch_input, batch_output, "
        "cc_model_filenames, default_model_filename, dynamic_batching, ensemble_scheduling, input, instance_group, "
        "max_batch_size, metric_tags, model_operations, model_repository_agents, model_transaction_policy, "
        "model_warmup, name, optimization, output, parameters, platform, response_cache, runtime, sequence_batching, "
        "version_policy (see docs/importers.md), or --ignore-unknown)",
        f"  {config}:6: dynamic_batching.frobnicate=3 (expected a field batchcheck knows here: default_priority_level, "
        "default_queue_policy, max_queue_delay_microseconds, preferred_batch_size, preserve_ordering, "
        "priority_levels, priority_queue_policy (see docs/importers.md), or --ignore-unknown)"]
    result = import_policy("triton", ["--max-model-len", "8192"], str(config), ignore_unknown=True)
    assert result.ignored[:2] == [f"colour=BLUE {UNKNOWN_IGNORED}", f"dynamic_batching.frobnicate=3 {UNKNOWN_IGNORED}"]


def test_a_single_refusal_reads_as_it_did_alone():
    error = Refused([InputError([], None)])
    assert str(error) == ""
    assert refused("vllm", VLLM_BASE + ["--max-loras", "2"]) == (
        "--max-loras=2 (expected no --max-loras: the scheduler skips requests beyond this many LoRA adapters per "
        "batch (not modelled))")


def test_cli_ignore_unknown_after_the_system_prints_ignored_lines(capsys, tmp_path: Path):
    out = tmp_path / "p.yaml"
    code = main(["import", "vllm", *VLLM_BASE, "--frobnicate", "2", "--ignore-unknown", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == ExitCode.OK and out.exists()
    assert f"batchcheck: ignored: --frobnicate=2 {UNKNOWN_IGNORED}\n" in err
    code = main(["import", "vllm", *VLLM_BASE, "--frobnicate", "2", "--max-num-seqz", "3"])
    assert code == ExitCode.INPUT_ERROR
    assert capsys.readouterr().err.startswith("batchcheck: error: 2 options cannot be imported:\n  --frobnicate='2' ")


def test_tgi_trtllm_and_triton_gather_their_refusals_by_name(tmp_path: Path):
    assert refused("tgi", ["--max-total-tokens", "4096", "--max-batch-total-tokens", "40000", "--speculate", "2",
                           "--frob", "1"]) == (
        "2 options cannot be imported:\n"
        "  --frob='1' (expected an option batchcheck knows for TGI, listed in docs/importers.md, or --ignore-unknown)\n"
        "  --speculate=2 (expected 0: speculative decoding (draft tokens per step) is not modelled)")
    llm = tmp_path / "l.yaml"
    llm.write_text("max_seq_len: 4096\nkv_cache_config:\n  max_tokens: 40000\n  host_cache_size: 100\n"
                   "scheduler_config:\n  waiting_queue_policy: priority\nspeculative_config: {decoding_type: Eagle}\n")
    assert refused("trtllm", [], str(llm)) == (
        "3 options cannot be imported:\n"
        f"  {llm}:7: speculative_config='{{...}}' (expected no speculative_config: draft tokens per step are not "
        "modelled)\n"
        f"  {llm}:6: scheduler_config.waiting_queue_policy='priority' (expected fcfs: the only waiting-queue policy "
        "of the TensorRT-LLM versions read)\n"
        f"  {llm}:4: kv_cache_config.host_cache_size=100 (expected 0: KV offload to host memory is not modelled)")
    pbtxt = tmp_path / "c.pbtxt"
    pbtxt.write_text('name: "m"\nbackend: "python"\nmax_batch_size: 8\nsequence_batching { }\ncolour: BLUE\n')
    lines = refused("triton", ["--max-model-len", "8192"], str(pbtxt)).splitlines()
    assert lines[0] == "2 options cannot be imported:" and lines[1].startswith(f"  {pbtxt}:5: colour='BLUE' ")
    assert lines[2] == (f"  {pbtxt}:4: sequence_batching='{{...}}' (expected no sequence_batching: the sequence "
                        "batcher (stateful sequences) is not modelled)")
