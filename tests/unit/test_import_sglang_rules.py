"""`batchcheck import sglang --rules sglang`: SGLang 0.5.23's server flags onto the engine's own SGLang rules
(policy `scheduler: sglang`, the `sglang:` section). The default (`--rules vllm`) keeps the vLLM-shaped mapping.
Every option the importer knows is mapped, ignored with a reason, or refused by name (exit 2 through the CLI);
the key messages are asserted word for word."""

from __future__ import annotations

import json

import pytest
import yaml

from checker.api import run_import, run_simulation
from checker.cli import main
from checker.errors import InputError, UsageError
from checker.importers import import_policy
from checker.importers.common import Machine
from checker.importers.sglang import TABLE
from tests.helpers import WORKLOADS

BASE = ["--context-length", "8192", "--max-total-tokens", "20000", "--disable-radix-cache"]


def rules(*args: str, **kw):
    return import_policy("sglang", [*BASE, *args], rules="sglang", **kw)


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def refused(capsys, *args: str, base: list[str] = BASE) -> str:
    """The one error line of a refused import (exit 2)."""
    code, out, err = run(capsys, "import", "sglang", "--rules", "sglang", *base, *args)
    assert code == 2, (out, err)
    lines = [line for line in err.splitlines() if line.startswith("batchcheck: error: ")]
    assert len(lines) == 1, err
    return lines[0].removeprefix("batchcheck: error: ")


# ----------------------------------------------------------------------------------------- the mapping
def test_a_full_configuration_maps_onto_the_sglang_rules():
    result = import_policy("sglang", [
        "--model-path", "meta-llama/Llama-3.1-8B-Instruct", "--context-length", "8192", "--max-total-tokens", "20003",
        "--page-size", "16", "--max-running-requests", "48", "--chunked-prefill-size", "4096",
        "--max-prefill-tokens", "8192", "--schedule-policy", "lof", "--enable-mixed-chunk", "--disable-radix-cache",
        "--enable-priority-scheduling", "--schedule-low-priority-values-first",
        "--priority-scheduling-preemption-threshold", "4", "--retraction-policy", "priority",
        "--schedule-conservativeness", "0.5", "--disable-overlap-schedule", "SGLANG_INIT_NEW_TOKEN_RATIO=0.6",
        "SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR=0.2", "SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS=300",
        "SGLANG_RETRACT_DECODE_STEPS=10", "SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION=2048",
        "SGLANG_REQ_WAITING_TIMEOUT=2.5"], rules="sglang")
    assert result.data == {
        "max_model_len": 8192,
        "scheduler": "sglang",
        "sglang": {"radix_cache": False, "schedule_policy": "lof", "max_prefill_tokens": 8192, "mixed_chunk": True,
                   "schedule_conservativeness": 0.5, "init_new_token_ratio": 0.6, "min_new_token_ratio_factor": 0.2,
                   "new_token_ratio_decay_steps": 300, "retract_decode_steps": 10, "clip_max_new_tokens": 2048},
        "kv": {"block_size": 16, "num_blocks": 1250},  # 20003 tokens rounded down to whole pages
        "queue": {"order": "priority", "priority_polarity": "lower_first"},
        "chunking": {"enabled": True},
        "batch": {"max_num_seqs": 48, "max_num_batched_tokens": 4096, "phase_mode": "prefill_first"},
        "preemption": {"triggers": ["kv_growth_fails", "priority_inversion"], "victim": "lowest_priority",
                       "priority_inversion_threshold": 4},
        "timeouts": {"queue_timeout_ms": 2500, "action": "reject"},
    }
    p = result.policy
    assert p.scheduler.value == "sglang" and p.sglang.init_ratio == 0.3
    # the vLLM-only fields keep the values the sglang rules require (policy.SGLANG_UNREAD)
    assert (p.queue.preempted_requeue.value, p.cancellation.release_lag_steps, p.kv.allocation.value,
            p.queue.head_of_line.value, p.batch.prefill_share) == ("front", 0, "on_demand", "strict", None)
    assert result.approximated == []  # the normal loop, a pool above the context length
    assert result.ignored == ["--model-path=meta-llama/Llama-3.1-8B-Instruct (no effect on scheduling)"]
    assert result.assumed == []
    assert result.text.startswith("# Imported by `batchcheck import sglang`: SGLang 0.5.23 under batchcheck's "
                                  "SGLang rules (--rules sglang: scheduler sglang).\n")
    assert yaml.safe_load(result.text)["sglang"]["schedule_policy"] == "lof"


def test_the_defaults_are_assumed_line_by_line(capsys):
    code, out, err = run(capsys, "import", "sglang", "--rules", "sglang", *BASE)
    assert code == 0, err
    assert err.splitlines() == [
        "batchcheck: assumed: kv.block_size=1 (--page-size not given: SGLang's default, one token per page)",
        "batchcheck: assumed: sglang.schedule_policy=fcfs (--schedule-policy not given: SGLang's default)",
        "batchcheck: assumed: --chunked-prefill-size=4096 (SGLang's default when the GPU memory is unknown "
        "(--gpu-memory-gib not given))",
        "batchcheck: assumed: sglang.max_prefill_tokens=16384 (--max-prefill-tokens not given: SGLang's default)",
        "batchcheck: assumed: batch.max_num_seqs=2048 (--max-running-requests not given: SGLang's default "
        "min(clamp(max_total_tokens / context_length x 512, 2048, 4096), max_total_tokens // 2))",
        "batchcheck: assumed: sglang.mixed_chunk=false (--enable-mixed-chunk not given: SGLang's default)",
        "batchcheck: assumed: sglang.schedule_conservativeness=1.0 (--schedule-conservativeness not given: "
        "SGLang's default)",
        "batchcheck: assumed: sglang.init_new_token_ratio=0.7 (SGLANG_INIT_NEW_TOKEN_RATIO not set: SGLang's "
        "default)",
        "batchcheck: assumed: sglang.min_new_token_ratio_factor=0.14 (SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR not set: "
        "SGLang's default)",
        "batchcheck: assumed: sglang.new_token_ratio_decay_steps=600 (SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS not set: "
        "SGLang's default)",
        "batchcheck: assumed: sglang.retract_decode_steps=20 (SGLANG_RETRACT_DECODE_STEPS not set: SGLang's "
        "default)",
        "batchcheck: assumed: sglang.clip_max_new_tokens=4096 (SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION not set: "
        "SGLang's default)",
        "batchcheck: assumed: preemption.victim=fewest_generated (--retraction-policy not given: SGLang's default "
        "length: retract the fewest output tokens first, the longest prompt among equals)",
        "batchcheck: approximated: scheduler=sglang (SGLang's default loop is the overlap scheduler "
        "(event_loop_overlap); the sglang rules model the normal loop (--disable-overlap-schedule), whose results "
        "(finishes, frees, output tokens) come one iteration earlier than the overlap loop's)",
    ]
    data = yaml.safe_load(out)
    assert data["scheduler"] == "sglang" and data["batch"]["phase_mode"] == "prefill_first"
    assert data["preemption"] == {"triggers": ["kv_growth_fails"], "victim": "fewest_generated"}
    assert data["queue"] == {"order": "fcfs"}
    # each stderr line is also a comment in the YAML
    header = out.split("\nmax_model_len:")[0].replace("\n#   ", " ")
    for line in err.splitlines():
        assert "# " + line.removeprefix("batchcheck: ") in header


def test_the_normal_loop_flag_drops_the_overlap_approximation():
    overlap = rules()
    normal = rules("--disable-overlap-schedule")
    assert [a for a in overlap.approximated if a.startswith("scheduler=")] == [
        "scheduler=sglang (SGLang's default loop is the overlap scheduler (event_loop_overlap); the sglang rules "
        "model the normal loop (--disable-overlap-schedule), whose results (finishes, frees, output tokens) come one "
        "iteration earlier than the overlap loop's)"]
    assert not [a for a in normal.approximated if a.startswith("scheduler=")]
    assert normal.policy == overlap.policy


def test_more_running_requests_than_the_chunk_budget_are_kept():
    """Under SGLang's rules max_num_batched_tokens is the prefill chunk budget; a decode batch runs every running
    request beside it (Policy.step_token_bound), so the running cap is not cut to the chunk."""
    result = rules("--chunked-prefill-size", "256", "--max-running-requests", "300")
    assert result.policy.batch.max_num_seqs == 300 and result.policy.batch.max_num_batched_tokens == 256
    assert result.policy.step_token_bound == 300
    assert not [a for a in result.approximated if a.startswith("batch.max_num_seqs")]


def test_without_chunking_the_step_budget_is_the_context_plus_the_prefill_budget():
    result = rules("--chunked-prefill-size", "-1", "--max-prefill-tokens", "1024", "--max-running-requests", "16",
                   "--enable-mixed-chunk")
    b = result.policy.batch
    assert (result.policy.chunking.enabled, b.max_num_batched_tokens, b.max_num_seqs) == (False, 8192 + 1024, 16)
    assert result.policy.sglang.mixed_chunk is False
    assert ("--enable-mixed-chunk=true (no effect without chunked prefill: SGLang mixes decodes only into chunked "
            "prefill batches)") in result.ignored


@pytest.mark.parametrize("name", ["lpm", "dfs-weight", "hrrn"])
def test_a_cache_aware_policy_is_fcfs_as_sglang_itself_falls_back(name):
    result = rules("--schedule-policy", name)
    assert result.policy.sglang.schedule_policy.value == "fcfs"
    assert (f"sglang.schedule_policy=fcfs (--schedule-policy {name} is cache-aware: SGLang itself falls back to fcfs "
            "when the radix cache is disabled (SchedulePolicy's validation))") in result.approximated


def test_priority_scheduling_preemption_and_polarity():
    p = rules("--enable-priority-scheduling").policy
    assert (p.queue.order.value, p.queue.priority_polarity.value) == ("priority", "higher_first")
    assert [t.value for t in p.preemption.triggers] == ["kv_growth_fails", "priority_inversion"]
    assert p.preemption.priority_inversion_threshold == 10 and p.preemption.victim.value == "fewest_generated"
    assert ("preemption.priority_inversion_threshold=10 (--priority-scheduling-preemption-threshold not given: "
            "SGLang's default)") in rules("--enable-priority-scheduling").assumed
    off = rules("--enable-priority-scheduling", "--disable-priority-preemption",
                "--priority-scheduling-preemption-threshold", "3")
    assert [t.value for t in off.policy.preemption.triggers] == ["kv_growth_fails"]
    assert "--priority-scheduling-preemption-threshold=3 (--disable-priority-preemption is given)" in off.ignored
    low = rules("--enable-priority-scheduling", "--schedule-low-priority-values-first").policy
    assert low.queue.priority_polarity.value == "lower_first"
    plain = rules("--schedule-low-priority-values-first", "--priority-scheduling-preemption-threshold", "3")
    assert plain.policy.queue.order.value == "fcfs"
    assert plain.ignored == ["--schedule-low-priority-values-first=true (read only with --enable-priority-scheduling)",
                             "--priority-scheduling-preemption-threshold=3 (read only with "
                             "--enable-priority-scheduling)"]


def test_no_effect_flags_are_ignored_with_the_reason():
    result = rules("--radix-eviction-policy", "lru", "--disaggregation-transfer-backend", "mooncake",
                   "--disaggregation-mode", "null", "SGLANG_REQ_RUNNING_TIMEOUT=0", "--default-priority-value", "5",
                   "--tp-size", "2", "--host", "0.0.0.0", "--enable-metrics")
    assert sorted(result.ignored) == sorted([
        "--host=0.0.0.0 (no effect on scheduling)", "--enable-metrics=true (no effect on scheduling)",
        "--radix-eviction-policy=lru (no effect with --disable-radix-cache)",
        "--disaggregation-transfer-backend=mooncake (no effect without --disaggregation-mode prefill or decode)",
        "SGLANG_REQ_RUNNING_TIMEOUT=0.0 (<= 0 disables the timeout)",
        "--default-priority-value=5 (batchcheck workloads give every request a priority)",
        "--tp-size=2 (sizes the KV pool only from a declared machine (--gpu-memory-gib ...); --max-total-tokens gives "
        "the pool here)"])


def test_the_pool_from_a_machine_under_the_sglang_rules():
    result = rules("--page-size", "16", machine=Machine(gpu_memory_gib=80, model_weights_gib=16,
                                                        kv_bytes_per_token=131072))
    # min(computed, --max-total-tokens 20000), whole pages
    assert result.policy.kv.num_blocks == 1250 and result.policy.kv.block_size == 16
    assert "--chunked-prefill-size=8192 (SGLang's default on a 80 GiB GPU (< 160 GB))" in result.assumed


def test_the_default_rules_are_unchanged_and_explicit_vllm_is_the_same():
    args = ["--context-length", "8192", "--max-total-tokens", "20000"]
    default = import_policy("sglang", args)
    assert import_policy("sglang", args, rules="vllm").data == default.data
    assert default.policy.scheduler.value == "vllm" and "scheduler" not in default.data
    assert run_import("sglang", args).data == default.data
    with pytest.raises(InputError):  # lof stays refused under the vllm-shaped rules
        import_policy("sglang", [*args, "--schedule-policy", "lof"])
    assert import_policy("sglang", [*BASE, "--schedule-policy", "lof"], rules="sglang").policy.sglang \
        .schedule_policy.value == "lof"


def test_an_imported_policy_runs_on_the_engine():
    policy = rules("--page-size", "4", "--max-running-requests", "16", "--chunked-prefill-size", "512",
                   "--disable-overlap-schedule").policy
    result = run_simulation(policy, WORKLOADS / "chat_mixed.yaml", limit=40)
    assert result is not None


@pytest.mark.parametrize("opt", [o for o in TABLE.opts], ids=lambda o: o.name)
def test_every_known_option_is_mapped_ignored_or_refused(opt):
    """No option of the table is dropped under the sglang rules: each given alone is taken (never the internal
    error of an untaken option); a refusal is an input or usage error."""
    values = {"int": "3", "float": "0.5", "str": "x", "bool": "true", "choice": opt.choices[-1] if opt.choices else "x"}
    raw = values.get(opt.kind, "1")
    word = f"{opt.name}={raw}" if opt.name.isupper() else f"--{opt.name}={raw}"
    args = [a for a in BASE if a != "--disable-radix-cache"] + (["--disable-radix-cache"]
                                                               if opt.name != "disable-radix-cache" else [])
    if opt.name == "context-length":
        args = args[2:]
    try:
        import_policy("sglang", [*args, word], rules="sglang")
    except (InputError, UsageError):
        pass


# ----------------------------------------------------------------------------------------- refusals, exit 2
NO_FLAG = [a for a in BASE if a != "--disable-radix-cache"]


def test_the_radix_cache_is_on_by_default_with_an_assumed_line():
    result = import_policy("sglang", NO_FLAG, rules="sglang")
    assert result.policy.sglang.radix_cache is True
    assert any("sglang.radix_cache" in line and "on by default" in line for line in result.assumed), result.assumed
    assert any("--radix-eviction-policy" in line and "lru" in line for line in result.assumed), result.assumed
    assert import_policy("sglang", [*NO_FLAG, "--disable-radix-cache=false"], rules="sglang").policy.sglang.radix_cache
    assert rules().policy.sglang.radix_cache is False


@pytest.mark.parametrize("name", ["lpm", "dfs-weight"])
def test_the_cache_aware_orders_map_with_the_radix_cache(name):
    result = import_policy("sglang", [*NO_FLAG, "--schedule-policy", name], rules="sglang")
    assert result.policy.sglang.schedule_policy.value == name
    assert result.policy.sglang.radix_cache is True
    assert not any("schedule_policy" in line for line in result.approximated)


def test_radix_refusals_name_the_flag(capsys):
    assert refused(capsys, "--radix-eviction-policy", "lfu", base=NO_FLAG) == (
        "--radix-eviction-policy='lfu' (expected lru (the sglang rules evict the radix tree's least recently used "
        "leaves first), or --disable-radix-cache)")
    assert refused(capsys, "--schedule-policy", "hrrn", base=NO_FLAG) == (
        "--schedule-policy='hrrn' (expected fcfs, lof, lpm or dfs-weight with the radix cache: the sglang rules do "
        "not model hrrn's order)")


@pytest.mark.parametrize("args, message", [
    (["--schedule-policy", "random"], "--schedule-policy='random' (expected fcfs or lof (with or without "
     "--enable-priority-scheduling): random shuffles the queue (not reproducible), which the sglang rules do not "
     "model)"),
    (["--schedule-policy", "routing-key"], "--schedule-policy='routing-key' (expected fcfs or lof (with or without "
     "--enable-priority-scheduling): routing-key groups the queue by routing key, which the sglang rules do not "
     "model)"),
    (["--schedule-policy", "shortest-prefill-first"], "--schedule-policy='shortest-prefill-first' (expected fcfs or "
     "lof: SGLang refuses shortest-prefill-first with the radix cache disabled)"),
    (["--schedule-policy", "priority"], "--schedule-policy='priority' (expected fcfs with "
     "--enable-priority-scheduling (SGLang orders by priority through that flag))"),
    (["--retraction-policy", "priority"], "--retraction-policy='priority' (expected length unless "
     "--enable-priority-scheduling is given)"),
    (["--enable-priority-scheduling", "--max-queued-requests", "10"], "--max-queued-requests=10 (expected no queue "
     "cap with --enable-priority-scheduling: SGLang then aborts the lowest-priority queued request for a "
     "higher-priority arrival, which the policy model cannot express)"),
    (["--enable-dp-attention"], "--enable-dp-attention=True (expected false: data-parallel attention batches per "
     "rank)"),
    (["--speculative-algorithm", "EAGLE"], "--speculative-algorithm='EAGLE' (expected no speculative decoding: "
     "draft tokens per step are not modelled)"),
    (["--pp-size", "2"], "--pp-size=2 (expected 1: the policy model is one engine running one batch at a time)"),
    (["--dp", "2"], "--dp=2 (expected 1: the policy model is one engine running one batch at a time)"),
    (["--disaggregation-mode", "prefill"], "--disaggregation-mode='prefill' (expected null: SGLang's disaggregation "
     "queues (the decode side's prealloc and transfer queues, which reserve KV before the transfer; the prefill "
     "side's bootstrap and inflight queues) are not modelled by the sglang rules)"),
    (["--enable-hierarchical-cache"], "--enable-hierarchical-cache=True (expected false: HiCache's host-memory KV "
     "tier (loads back into the device pool) is not modelled by the sglang rules)"),
    (["SGLANG_REQ_RUNNING_TIMEOUT=5"], "SGLANG_REQ_RUNNING_TIMEOUT=5.0 (expected 0: a timeout on running requests "
     "is not modelled (only queue timeouts))"),
    (["--abort-on-priority-when-disabled"], "--abort-on-priority-when-disabled=True (expected false: batchcheck "
     "workloads give every request a priority, which this flag would abort)"),
    (["--chunked-prefill-size", "0"], "--chunked-prefill-size=0 (expected a chunk size >= 1, or -1 to disable "
     "chunked prefill)"),
    (["SGLANG_INIT_NEW_TOKEN_RATIO=1.5"], "SGLANG_INIT_NEW_TOKEN_RATIO=1.5 (expected a ratio in (0, 1])"),
    (["SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR=2"], "SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR=2.0 (expected a factor in [0, 1])"),
    (["SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS=0"], "SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS=0.0 (expected a number of steps > 0 "
     "and <= 1000000)"),
    (["SGLANG_RETRACT_DECODE_STEPS=-1"], "SGLANG_RETRACT_DECODE_STEPS=-1 (expected an integer >= 0 and <= "
     "1000000)"),
    (["SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION=0"], "SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION=0 (expected an integer >= 1 "
     "and <= 10000000)"),
    (["--schedule-conservativeness", "0"], "--schedule-conservativeness=0.0 (expected a number > 0 and <= 100)"),
    (["--kv-cache-dtype", "fp4"], "--kv-cache-dtype='fp4' (expected one of: auto, fp8_e5m2, fp8_e4m3, bf16, "
     "bfloat16)"),
    (["--no-such-flag", "1"], "--no-such-flag='1' (expected an option batchcheck knows for SGLang, listed in "
     "docs/importers.md, or --ignore-unknown)"),
])
def test_what_the_sglang_rules_cannot_express_is_refused_by_name(capsys, args, message):
    assert refused(capsys, *args) == message


def test_the_rules_option_itself(capsys):
    # after SYSTEM (batchcheck's own option, taken out of SGLang's arguments) and before it
    code, out, _ = run(capsys, "import", "sglang", *BASE, "--rules=sglang", "--json")
    assert code == 0 and json.loads(out)["policy"]["scheduler"] == "sglang"
    code, out, _ = run(capsys, "import", "--rules", "vllm", "sglang", *BASE, "--json")
    assert code == 0 and json.loads(out)["policy"]["scheduler"] == "vllm"
    code, _, err = run(capsys, "import", "sglang", *BASE, "--rules", "bogus")
    assert code == 2 and err.splitlines()[-1] == (
        "batchcheck: error: --rules='bogus' (expected vllm (SGLang mapped onto the vLLM-shaped rules, the default) or "
        "sglang (the engine's SGLang rules, scheduler: sglang))")
    code, _, err = run(capsys, "import", "vllm", "--rules", "sglang", "--max-model-len", "4096",
                       "--num-gpu-blocks-override", "100")
    assert code == 2 and err.splitlines()[-1] == ("batchcheck: error: --rules is read by the sglang importer only "
                                                  "(system is vllm)")
    code, _, err = run(capsys, "import", "--rules", "sglang", "sglang", *BASE, "--rules", "vllm")
    assert code == 2 and err.splitlines()[-1] == "batchcheck: error: --rules given twice (before and after sglang)"
    with pytest.raises(SystemExit) as exc:  # before SYSTEM: argparse checks the choice
        main(["import", "--rules", "x", "sglang", *BASE])
    assert exc.value.code == 2 and "argument --rules: invalid choice: 'x'" in capsys.readouterr().err
    code, out, _ = run(capsys, "import", "sglang", "--help")
    assert code == 0 and "--rules {vllm,sglang}" in out
