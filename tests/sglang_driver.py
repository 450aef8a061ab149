#!/usr/bin/env python3
"""Drive SGLang 0.5.23's real scheduler (CPU only, no model, no weights) with a synthetic trace.

Standalone: run it with the SGLang venv's python (tools/sglang_setup.sh builds it); it never imports batchcheck.

What is real and what is stubbed (docs/sglang-harness.md says why):
- real: ``Scheduler.get_next_batch_to_run`` / ``get_new_batch_prefill`` / ``_get_new_batch_prefill_raw`` /
  ``update_running_batch`` / ``_add_request_to_queue`` / ``abort_request`` / ``process_pending_chunked_abort``
  (the methods of ``sglang.srt.managers.scheduler.Scheduler``, called on a subclass whose ``__init__`` sets only
  the attributes those methods read), ``SchedulePolicy``, ``PrefillAdder``, ``PrefillBudget``, ``ScheduleBatch``
  (``init_new``, ``prepare_for_extend``, ``prepare_for_decode``, ``check_decode_mem``, ``retract_decode``,
  ``filter_batch``, ``merge_batch``, ``mix_with_running``), ``Req``, ``NewTokenRatioTracker``, ``ReqToTokenPool``,
  ``MHATokenToKVPool`` (1 layer, 1 head, head_dim 1), ``TokenToKVPoolAllocator`` / ``PagedTokenToKVPoolAllocator``,
  and the tree cache the default factory builds (``create_unified_radix_cache`` -> ``UnifiedRadixCache``, with
  ``disable=True`` when the radix cache is off), ``release_kv_cache`` / ``checkpoint_kv_cache``.
- stubbed: the model (a fake forward samples token SAMPLED_TOKEN for every request that completes its prompt
  or decodes), the batch-result processor (``process_batch_result_prefill/decode`` are re-done in
  ``fake_forward`` below, the KV branches line for line: finished -> ``release_kv_cache``, unfinished prefill ->
  ``checkpoint_kv_cache``, middle chunk -> ``inflight_middle_chunks -= 1``), the output streamer, metrics,
  grammar, LoRA, disaggregation, DP attention, HiCache, and the import of ``torchvision`` (only multimodal model
  configs import it; its PyPI wheel is CUDA-linked and does not load next to the CPU torch).

Input: a JSON list of requests {"id"?, "arrival_step", "prompt_tokens", "output_tokens", "priority"?, "ignore_eos"?,
"abort_step"?, "prefix_group"?, "hash_ids"?, "hash_block_tokens"?}, as the vLLM driver takes.

Each step s:
  1. requests with arrival_step == s are queued with the real ``_add_request_to_queue`` (file order),
  2. requests with abort_step == s are aborted with the real ``abort_request`` (waiting: removed and released
     now; running: ``to_finish = FINISH_ABORT`` and released when the next result is processed; the chunked
     request: aborted at the top of the next ``get_next_batch_to_run``),
  3. ``get_next_batch_to_run(running_batch, last_batch)`` is called (the body of ``event_loop_normal``),
  4. the fake forward + result processing runs on the batch; no batch -> ``on_idle``'s ratio reset.
Under --overlap, step 4 follows event_loop_overlap instead: the batch is queued and the previous one processed.
Output: one JSON line per step (stdout or --out):
  {"step", "kind": prefill|decode|mixed|idle, "scheduled": {id: tokens}, "retracted": [ids], "preempted": [ids],
   "finished": [ids],
   "aborted": [ids], "running", "waiting", "available_tokens", "evictable_tokens", "protected_tokens",
   "held_tokens", "new_token_ratio", "chunked": id|null}
and a JSON summary on stderr (steps, steps/s of the scheduling loop, setup seconds).
"""

from __future__ import annotations

import argparse
import collections
import importlib.abc
import importlib.machinery
import json
import logging
import os
import sys
import tempfile
import time
import types
import warnings
from array import array

warnings.filterwarnings("ignore")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("SGLANG_LOGGING_LEVEL", "ERROR")

SAMPLED_TOKEN = 7  # never an EOS or stop token (the tiny config's EOS is 2)
HASH_BLOCK_TOKENS = 512
TINY_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
    "num_attention_heads": 4, "num_key_value_heads": 4, "num_hidden_layers": 2, "vocab_size": 1 << 30,
    "max_position_embeddings": 1 << 20, "rms_norm_eps": 1e-6, "torch_dtype": "float16", "bos_token_id": 1,
    "eos_token_id": 2,
}

# ---------------------------------------------------------------------------------------------------------------
# Import stubs. Only `torchvision` is stubbed: sglang.srt.configs (imported by schedule_batch through
# dllm/config.py -> configs/model_config.py) imports multimodal configs (deepseek_ocr, internvl_utils, ...)
# that do `import torchvision.transforms` at module level. The PyPI torchvision wheel is built against CUDA
# torch and fails to load (`operator torchvision::nms does not exist`) next to torch 2.13.0+cpu. Nothing on
# the scheduling path uses it. The stub answers any attribute with an inert object; `__version__` is set so
# transformers' version probe (is_torchvision_greater_or_equal) parses it.
STUBBED_MODULES = ("torchvision",)


class _Inert:
    def __init__(self, *a, **k):
        pass

    def __call__(self, *a, **k):
        return _Inert()

    def __getattr__(self, name):
        return _Inert()

    def __mro_entries__(self, bases):
        return (object,)


class _StubModule(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Inert()


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path, target=None):
        if any(fullname == m or fullname.startswith(m + ".") for m in STUBBED_MODULES):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _StubModule(spec.name)
        module.__path__ = []
        module.__version__ = "0.0.0"
        return module

    def exec_module(self, module):
        pass


def install_stubs():
    if not any(isinstance(f, _StubFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _StubFinder())


def ensure_tiny_model(folder: str) -> str:
    path = os.path.join(folder, "config.json")
    if not os.path.exists(path):
        os.makedirs(folder, exist_ok=True)
        with open(path, "w") as f:
            json.dump(TINY_CONFIG, f)
    return folder


# ---------------------------------------------------------------------------------------------------------------
# Small stand-ins for the Scheduler's non-scheduling collaborators.
class _Passthrough:
    """dp_attn_adapter / ngram_embedding_manager: with DP attention and ngram embeddings off, the real
    methods return the batch unchanged."""

    def maybe_prepare_mlp_sync_batch(self, batch, need_sync=False):
        return batch

    def maybe_convert_decode_to_extend(self, batch):
        return batch

    def prepare_for_forward(self, batch, chunked_req=None):
        return batch

    def drop_sync_wait_carry(self):
        pass


class _Nothing:
    """Collaborators whose every method is a no-op here (metrics, grammar, beam groups, load reporting)."""

    enable_metrics = False
    num_retracted_reqs = 0

    def has_waiting_grammars(self):
        return False

    def pending_member_rows(self, batch):
        return 0

    def _get_num_pending_tokens(self, **kw):
        return 0

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return lambda *a, **k: None


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("trace")
    ap.add_argument("--page-size", type=int, default=1)
    ap.add_argument("--pool-tokens", type=int, default=16384, help="KV pool size in tokens (max_total_num_tokens)")
    ap.add_argument("--max-running-requests", type=int, default=32)
    ap.add_argument("--req-pool-size", type=int, default=None,
                    help="ReqToTokenPool rows (default: max running requests, as SGLang sizes it)")
    ap.add_argument("--chunked-prefill-size", type=int, default=2048, help="-1 disables chunked prefill")
    ap.add_argument("--max-prefill-tokens", type=int, default=16384)
    ap.add_argument("--schedule-policy", default="fcfs",
                    choices=["fcfs", "lof", "lpm", "dfs-weight", "random", "hrrn"])
    ap.add_argument("--schedule-conservativeness", type=float, default=1.0)
    ap.add_argument("--init-new-token-ratio", type=float, default=None, help="SGLANG_INIT_NEW_TOKEN_RATIO (0.7)")
    ap.add_argument("--min-new-token-ratio-factor", type=float, default=None,
                    help="SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR (0.14)")
    ap.add_argument("--new-token-ratio-decay-steps", type=int, default=None,
                    help="SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS (600)")
    ap.add_argument("--retract-decode-steps", type=int, default=None, help="SGLANG_RETRACT_DECODE_STEPS (20)")
    ap.add_argument("--clip-max-new-tokens", type=int, default=None,
                    help="SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION (4096)")
    ap.add_argument("--disable-radix-cache", action="store_true")
    ap.add_argument("--tree-core", choices=["rust", "python"], default=None,
                    help="SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND: the radix tree's core (SGLang's default: the "
                         "compiled Rust one shipped in the wheel; python: unified_cache/unified_tree_core.py)")
    ap.add_argument("--enable-mixed-chunk", action="store_true")
    ap.add_argument("--enable-priority-scheduling", action="store_true")
    ap.add_argument("--schedule-low-priority-values-first", action="store_true")
    ap.add_argument("--priority-scheduling-preemption-threshold", type=int, default=10)
    ap.add_argument("--disable-priority-preemption", action="store_true")
    ap.add_argument("--retraction-policy", choices=["length", "priority"], default="length")
    ap.add_argument("--ignore-eos", action="store_true",
                    help="requests set ignore_eos (then the new-token ratio does not apply to them, and with the "
                         "radix cache disabled add_one_req_ignore_eos is used)")
    ap.add_argument("--overlap", action="store_true",
                    help="event_loop_overlap's order (SGLang's GPU default): a batch's result is processed one "
                         "iteration after it is scheduled")
    ap.add_argument("--max-context-len", type=int, default=65536)
    ap.add_argument("--arrival-checks", action="store_true",
                    help="run the real Scheduler.init_req_max_new_tokens on each request before it is queued "
                         "(handle_generate_request does: max_new_tokens capped at max_req_len - prompt - 1, "
                         "max_req_len = min(context length, pool) - 1)")
    ap.add_argument("--max-steps", type=int, default=100000)
    ap.add_argument("--max-stalled-steps", type=int, default=1000,
                    help="stop after this many steps in a row that schedule nothing once every request arrived "
                         "(a request that can never be admitted waits forever in SGLang too)")
    ap.add_argument("--out", default="-")
    ap.add_argument("--model-dir", default=None, help="where the config-only model directory goes")
    ap.add_argument("--quiet", action="store_true")
    return ap.parse_args(argv)


_ENV_FLAGS = (
    ("init_new_token_ratio", "SGLANG_INIT_NEW_TOKEN_RATIO"),
    ("min_new_token_ratio_factor", "SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR"),
    ("new_token_ratio_decay_steps", "SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS"),
    ("retract_decode_steps", "SGLANG_RETRACT_DECODE_STEPS"),
    ("clip_max_new_tokens", "SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION"),
    ("tree_core", "SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND"),
)


def set_env(args, sg):
    """envs.X.get() reads os.environ at each call; CLIP_MAX_NEW_TOKENS is read once, when schedule_policy.py is
    imported, so it is set on the module too (4096 when the flag is absent, as at import without the variable)."""
    for attr, name in _ENV_FLAGS:
        value = getattr(args, attr)
        if value is not None:
            os.environ[name] = str(value)
        else:
            os.environ.pop(name, None)
    clip = args.clip_max_new_tokens
    sg.schedule_policy.CLIP_MAX_NEW_TOKENS = int(clip) if clip is not None else 4096


_IMPORTED = {}


def sglang():
    """Import SGLang once (about 30 s on two cores) and return the names the driver uses."""
    if _IMPORTED:
        return types.SimpleNamespace(**_IMPORTED)
    install_stubs()
    import torch

    from sglang.srt import runtime_context
    from sglang.srt.managers import schedule_policy
    from sglang.srt.managers.io_struct import AbortReq
    from sglang.srt.managers.schedule_batch import FINISH_ABORT, Req, ScheduleBatch
    from sglang.srt.managers.scheduler import Scheduler
    from sglang.srt.managers.scheduler_components.new_token_ratio_tracker import NewTokenRatioTracker
    from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator
    from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    from sglang.srt.mem_cache.common import checkpoint_kv_cache, release_kv_cache
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
    from sglang.srt.mem_cache.registry import TreeCacheBuildContext, create_tree_cache
    from sglang.srt.sampling.sampling_params import SamplingParams
    from sglang.srt.server_args import ServerArgs
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    for name in ("sglang", "sglang.srt"):
        logging.getLogger(name).setLevel(logging.ERROR)
    _IMPORTED.update(locals())
    return types.SimpleNamespace(**_IMPORTED)


# ServerArgs fields taken from the flag of the same name.
_SERVER_ARG_FLAGS = (
    "page_size", "max_running_requests", "chunked_prefill_size", "max_prefill_tokens", "schedule_policy",
    "schedule_conservativeness", "disable_radix_cache", "enable_mixed_chunk", "enable_priority_scheduling",
    "schedule_low_priority_values_first", "priority_scheduling_preemption_threshold", "disable_priority_preemption",
    "retraction_policy",
)


def server_args(sg, args, model_dir):
    fields = {name: getattr(args, name) for name in _SERVER_ARG_FLAGS}
    return sg.ServerArgs(model_path=model_dir, device="cpu", skip_tokenizer_init=True,
                         max_total_tokens=args.pool_tokens, disable_overlap_schedule=not args.overlap, disable_cuda_graph=True,
                         context_length=args.max_context_len, **fields)


def pool_tokens(args) -> int:
    """model_executor/pool_configurator.py rounds max_total_num_tokens down to whole pages."""
    return args.pool_tokens // args.page_size * args.page_size


def build_pools(sg, args):
    import torch

    total = pool_tokens(args)

    req_pool = sg.ReqToTokenPool(
        size=args.req_pool_size or args.max_running_requests,
        max_context_len=args.max_context_len + 4,
        device="cpu",
        enable_memory_saver=False,
    )
    kv = sg.MHATokenToKVPool(
        total, page_size=args.page_size, dtype=torch.float16, head_num=1, head_dim=1, layer_num=1,
        device="cpu", enable_memory_saver=False, enable_alt_stream=False,
    )
    if args.page_size == 1:
        allocator = sg.TokenToKVPoolAllocator(total, torch.float16, "cpu", kv, need_sort=False)
    else:
        allocator = sg.PagedTokenToKVPoolAllocator(total, args.page_size, torch.float16, "cpu", kv,
                                                   need_sort=False)
    return req_pool, allocator


def make_scheduler(sg, args, sa):
    from sglang.srt.disaggregation.utils import DisaggregationMode
    from sglang.srt.managers.schedule_policy import SchedulePolicy

    req_pool, allocator = build_pools(sg, args)
    chunked = None if args.chunked_prefill_size is None or args.chunked_prefill_size <= 0 \
        else args.chunked_prefill_size
    params = sg.CacheInitParams(
        disable=args.disable_radix_cache,
        req_to_token_pool=req_pool,
        token_to_kv_pool_allocator=allocator,
        page_size=args.page_size,
        chunked_prefill_size=chunked,
    )
    ctx = sg.TreeCacheBuildContext(
        server_args=sa, params=params, is_hybrid_swa=False, is_hybrid_ssm=False, enable_hierarchical_cache=False,
        disable_radix_cache=args.disable_radix_cache, tp_worker=None, model_config=None, tp_size=1, tp_rank=0,
        tp_group=None,
    )
    tree_cache = sg.create_tree_cache(ctx)

    class _DriverScheduler(sg.Scheduler):
        def __init__(self):  # noqa: D401 - the real __init__ loads a model; only what the loop reads is set
            self.server_args = sa
            self.page_size = args.page_size
            self.req_to_token_pool = req_pool
            self.token_to_kv_pool_allocator = allocator
            self.tree_cache = tree_cache
            self.max_running_requests = args.max_running_requests
            self.max_prefill_tokens = args.max_prefill_tokens
            # tp_worker.get_worker_info: max_req_len = min(context_len - 1, kv capacity - 1)
            self.max_req_len = min(args.max_context_len - 1, allocator.size - 1)
            self.max_req_input_len = self.max_req_len - 5
            self.max_new_tokens_limit = None
            self.max_total_num_tokens = allocator.size
            self.kv_shard_widening = 1
            self.sliding_window_size = None
            self.chunked_prefill_size = chunked
            self.is_mixed_chunk = chunked is not None and args.enable_mixed_chunk
            self.enable_priority_scheduling = args.enable_priority_scheduling
            self.schedule_low_priority_values_first = args.schedule_low_priority_values_first
            self.priority_scheduling_preemption_threshold = args.priority_scheduling_preemption_threshold
            # init_schedule_policy: preemption is on by default under priority scheduling
            self.enable_priority_preemption = args.enable_priority_scheduling and not args.disable_priority_preemption
            self.abort_on_priority_when_disabled = False
            self.new_token_ratio_tracker = sg.NewTokenRatioTracker.from_config()
            self.policy = SchedulePolicy(
                args.schedule_policy, tree_cache, False, args.enable_priority_scheduling,
                args.schedule_low_priority_values_first,
            )
            self.waiting_queue = []
            self.running_batch = sg.ScheduleBatch(reqs=[], batch_is_full=False)
            self.last_batch = None
            self.chunked_req = None
            self._pending_chunked_abort_req = None
            self.processed_tokens_counter = 0
            self.forward_ct = 0
            self.device = "cpu"
            self.model_config = types.SimpleNamespace(vocab_size=TINY_CONFIG["vocab_size"],
                                                      is_encoder_decoder=False, is_multimodal=False)
            self.enable_overlap = args.overlap
            self.spec_algorithm = sg.SpeculativeAlgorithm.NONE
            self.truncation_align_size = None
            self.max_prefill_bs = 0
            self.max_queued_requests = None
            self.disaggregation_mode = DisaggregationMode.NULL
            self.dllm_config = None
            self.enable_hisparse = False
            self.hisparse_coordinator = None
            self.enable_hierarchical_cache = False
            self.enable_hicache_storage = False
            self.enable_lmcache = False
            self.enable_unified_cache_external_linker = False
            self.enable_lora = False
            self.enable_lora_overlap_loading = False
            self.lora_drainer = None
            self.is_hybrid_swa = False
            self.require_mlp_sync = False
            self.enable_skip_finishing_decode = args.overlap  # event_loop_overlap sets it
            self.enable_continuous_input_polling = False
            self.result_queue = collections.deque() if args.overlap else None
            self.prefill_delayer = None
            self.min_free_slots_delayer = None
            self.dynamic_chunk_sizer = None
            self.prefill_decode_interval = 0
            self.prefill_decode_interval_min_bs = 0
            self._prefill_decode_interval_remaining = 0
            self.decode_offload_manager = None
            self.mm_receiver = None
            self.dp_attn_adapter = _Passthrough()
            self.ngram_embedding_manager = _Passthrough()
            self.grammar_manager = _Nothing()
            self.beam_coordinator = _Nothing()
            self.metrics_reporter = _Nothing()
            self.load_inquirer = _Nothing()
            self.tp_worker = types.SimpleNamespace(model_runner=types.SimpleNamespace(
                attn_backend=None, prefill_aware_swa=False))
            self.scheduler_stage_metrics = None  # the stage-timing decorator skips recording when None
            self.aborted_now = []

        def send_abort_output(self, abort_req, req):
            self.aborted_now.append(req.rid)

    return _DriverScheduler()


def make_requests(trace):
    reqs = []
    for i, t in enumerate(trace):
        rid = str(t.get("id", i))
        n = int(t["prompt_tokens"])
        if "hash_ids" in t:
            hb = int(t.get("hash_block_tokens", HASH_BLOCK_TOKENS))
            ids = list(t["hash_ids"])
            prompt = [(10 + ids[j // hb]) * 1_000_000 + (j % hb) if j // hb < len(ids)
                      else (1000 + i) * 1_000_000 + j for j in range(n)]
        else:
            base = (int(t["prefix_group"]) if "prefix_group" in t else 1000 + i) * 1_000_000
            prompt = [base + j for j in range(n)]
        reqs.append((rid, int(t["arrival_step"]), t.get("abort_step"), prompt, int(t["output_tokens"]),
                     t.get("priority"), t.get("ignore_eos")))
    return reqs


def new_req(sg, rid, prompt, output_tokens, priority, ignore_eos):
    sp = sg.SamplingParams(max_new_tokens=output_tokens, ignore_eos=ignore_eos, temperature=0.0)
    sp.normalize(None)
    sp.verify(TINY_CONFIG["vocab_size"])
    # "$" ends every rid: abort_request matches by rid prefix, and "r1" is a prefix of "r10".
    return sg.Req(rid + "$", "", array("q", prompt), sp, vocab_size=TINY_CONFIG["vocab_size"], priority=priority,
                  eos_token_ids={TINY_CONFIG["eos_token_id"]})


_RETRACTED: list = []
_PREEMPTED: list = []


def _is_abort(req) -> bool:
    return isinstance(req.finished_reason, _IMPORTED["FINISH_ABORT"])


def record_retractions(sg):
    """Wrap ScheduleBatch.retract_decode (the real method runs unchanged) to learn which requests it retracted
    and which it aborted, in the order it picked them."""
    if getattr(sg.ScheduleBatch.retract_decode, "_driver_wrapped", False):
        return
    real = sg.ScheduleBatch.retract_decode

    def retract_decode(self):
        retracted, ratio, to_abort = real(self)
        _RETRACTED.extend(r.rid[:-1] for r in retracted)
        return retracted, ratio, to_abort

    retract_decode._driver_wrapped = True
    sg.ScheduleBatch.retract_decode = retract_decode

    real_preempt = sg.schedule_policy.PrefillAdder.preempt_to_schedule

    def preempt_to_schedule(self, req):
        before = len(self.preempt_list)
        ok = real_preempt(self, req)
        _PREEMPTED.extend(r.rid[:-1] for r in self.preempt_list[before:])
        return ok

    sg.schedule_policy.PrefillAdder.preempt_to_schedule = preempt_to_schedule


def fake_forward(sg, sched, batch):
    """The model step and process_batch_result_{prefill,decode}'s request/KV handling
    (managers/scheduler_components/batch_result_processor.py); under --overlap it runs on the batch.copy() that
    event_loop_overlap queues, one iteration after the batch was scheduled."""
    allocator = sched.token_to_kv_pool_allocator
    allocator.free_group_begin()
    if batch.forward_mode.is_decode():
        for req in batch.reqs:
            if sched.enable_overlap and (req.finished() or req.is_retracted):
                continue  # process_batch_result_decode under overlap: ended while its forward was in flight
            req.output_ids.append(SAMPLED_TOKEN)
            req.update_finish_state(1)
            if req.finished():
                sg.release_kv_cache(req, sched.tree_cache, checkpoint=True)
    else:
        decoding = batch.decoding_reqs or []
        for req in batch.reqs:
            if (req.finished() and req.inflight_middle_chunks <= 0) or req.is_retracted:
                continue
            if req.inflight_middle_chunks <= 0:
                req.output_ids.append(SAMPLED_TOKEN)
                req.update_finish_state()
                if req.finished():
                    sg.release_kv_cache(req, sched.tree_cache, checkpoint=True)
                elif req not in decoding:
                    sg.checkpoint_kv_cache(req, sched.tree_cache)
            else:
                req.inflight_middle_chunks -= 1
        sched.processed_tokens_counter += sum(batch.extend_lens or [])
    allocator.free_group_end()
    sched.tree_cache.flush_pending_backups()


def on_idle(sched):
    """Scheduler.on_idle resets the ratio when is_fully_idle(): nothing running, no chunked request, the previous
    step's batch empty (last_batch is still the previous one when this runs), nothing waiting."""
    if (sched.running_batch.is_empty() and sched.chunked_req is None and not sched.waiting_queue
            and (sched.last_batch is None or sched.last_batch.is_empty())):
        sched.new_token_ratio_tracker.reset()


def overlap_step(sg, sched, batch):
    """The rest of one event_loop_overlap iteration (scheduler.py, event_loop_overlap) after
    get_next_batch_to_run: the previous batch's result is processed after this batch is scheduled and launched,
    or before it when is_disable_overlap_for_batch says so (two extend batches in a row with
    SGLANG_DISABLE_CONSECUTIVE_PREFILL_OVERLAP)."""
    disable = sched.is_disable_overlap_for_batch(batch, last_batch=sched.last_batch)
    if disable:
        fake_forward(sg, sched, sched.result_queue.popleft()[0])
    if batch is not None:
        sched.result_queue.append((batch.copy(), None))  # (batch, result); the fake forward needs no result
        sched.forward_ct += 1
    if sched.last_batch is not None:
        if not disable:
            fake_forward(sg, sched, sched.result_queue.popleft()[0])
    elif batch is None:
        on_idle(sched)


def pool_counts(sched):
    tc = sched.tree_cache
    return (int(sched.token_to_kv_pool_allocator.available_size()), int(tc.evictable_size()),
            int(tc.protected_size()))


def held_tokens(reqs, page_size):
    """KV the requests hold outside the tree: ReqKvInfo's own range [cache_protected_len, kv_allocated_len), in
    whole pages (cache_protected_len is page-aligned)."""
    held = 0
    for req in reqs:
        kv = req.kv
        if kv.holds_kv:
            held += -(-kv.kv_allocated_len // page_size) * page_size - kv.cache_protected_len
    return held


def running_count(sched, batch):
    """Requests that hold a running slot after the step: the running batch plus the prefill batch that merges
    into it at the next get_next_batch_to_run (the chunked request included), less those that finished."""
    reqs = list(sched.running_batch.reqs)
    if batch is not None and not batch.forward_mode.is_decode() and batch is not sched.running_batch:
        reqs += [r for r in batch.reqs if r not in reqs]
    return sum(1 for r in reqs if not r.finished())


def batch_kind(batch):
    if batch is None:
        return "idle"
    if batch.forward_mode.is_decode():
        return "decode"
    if batch.forward_mode.is_mixed():
        return "mixed"
    return "prefill"


def scheduled_tokens(batch):
    out = {}
    if batch is None:
        return out
    if batch.forward_mode.is_decode():
        for r in batch.reqs:
            out[r.rid[:-1]] = 1
        return out
    for r, n in zip(batch.reqs, batch.extend_lens):
        out[r.rid[:-1]] = int(n)
    for r in batch.decoding_reqs or []:
        out[r.rid[:-1]] = 1
    return out


def run(args, out, sg=None):
    sg = sg or sglang()
    set_env(args, sg)
    with open(args.trace) as f:
        trace = json.load(f)
    model_dir = ensure_tiny_model(args.model_dir or os.path.join(tempfile.gettempdir(), "sglang-driver-tiny"))
    t_setup = time.perf_counter()
    sa = server_args(sg, args, model_dir)
    sg.runtime_context.publish(sa, role="scheduler")
    # Scheduler.__init__ (scheduler.py, after get_worker_info) sets the PP micro-batch default the same way.
    rc = sg.runtime_context
    if not rc.get_parallel().pp_max_micro_batch_size:
        rc.get_context().override("scheduler.pp_max_micro_batch_size_default",
                                  pp_max_micro_batch_size=max(args.max_running_requests // rc.get_parallel().pp_size, 1))
    sched = make_scheduler(sg, args, sa)
    record_retractions(sg)
    _RETRACTED.clear()
    _PREEMPTED.clear()
    setup_s = time.perf_counter() - t_setup

    by_arrival, aborts = {}, {}
    pending = make_requests(trace)
    for rid, arrival, abort_step, prompt, n_out, prio, ignore_eos in pending:
        by_arrival.setdefault(arrival, []).append((rid, prompt, n_out, prio, args.ignore_eos if ignore_eos is None
                                                   else bool(ignore_eos)))
        if abort_step is not None:
            aborts.setdefault(int(abort_step), []).append(rid)
    last_arrival = max(by_arrival) if by_arrival else 0
    done: set[str] = set()
    live: dict[str, object] = {}
    open_reqs: dict[str, object] = {}  # arrived, neither finished nor aborted yet
    loop_s, steps, stalled = 0.0, 0, 0
    for step in range(args.max_steps):
        t0 = time.perf_counter()
        sched.aborted_now = []
        for rid, prompt, n_out, prio, ignore_eos in by_arrival.get(step, []):
            req = new_req(sg, rid, prompt, n_out, prio, ignore_eos)
            if args.arrival_checks:
                sched.init_req_max_new_tokens(req)
            live[rid] = open_reqs[rid] = req
            sched._add_request_to_queue(req)
        for rid in aborts.get(step, []):
            if rid not in done and rid in live:
                sched.abort_request(sg.AbortReq(rid=rid + "$"))
        if step > last_arrival and len(done) >= len(pending) and not sched.aborted_now:
            break
        if step > last_arrival and stalled >= args.max_stalled_steps:
            break
        plan = sched.get_next_batch_to_run(running_batch=sched.running_batch, last_batch=sched.last_batch)
        sched.running_batch = plan.running_batch
        batch = plan.batch_to_run
        retracted, preempted = list(_RETRACTED), list(_PREEMPTED)
        _RETRACTED.clear()
        _PREEMPTED.clear()
        if batch is not None and batch.is_empty():
            batch = None
        if args.overlap:
            overlap_step(sg, sched, batch)
        elif batch is not None:
            fake_forward(sg, sched, batch)
            sched.forward_ct += 1
        else:
            on_idle(sched)
        # Outcomes: send_abort_output reports the waiting-queue aborts and retract_decode's abort of the last
        # request; process_pending_chunked_abort only sets finished_reason; the rest finish in fake_forward.
        finished, aborted = [], []
        reported = {rid[:-1] for rid in sched.aborted_now}
        for rid in list(open_reqs):
            req = open_reqs[rid]
            if rid in reported or (req.finished() and _is_abort(req)):
                aborted.append(rid)
            elif req.finished():
                finished.append(rid)
            else:
                continue
            del open_reqs[rid]
        sched.last_batch = batch
        stalled = stalled + 1 if batch is None and not aborted else 0
        loop_s += time.perf_counter() - t0
        steps += 1
        for rid in finished + aborted:
            done.add(rid)
        if not args.quiet:
            avail, evictable, protected = pool_counts(sched)
            rec = {
                "step": step,
                "kind": batch_kind(batch),
                "scheduled": scheduled_tokens(batch),
                "retracted": retracted,
                "preempted": preempted,
                "finished": finished,
                "aborted": aborted,
                "running": running_count(sched, batch),
                "waiting": len(sched.waiting_queue),
                "available_tokens": avail,
                "evictable_tokens": evictable,
                "protected_tokens": protected,
                "held_tokens": held_tokens(live.values(), args.page_size),
                "new_token_ratio": round(sched.new_token_ratio_tracker.current, 10),
                "chunked": sched.chunked_req.rid[:-1] if sched.chunked_req is not None else None,
            }
            out.write(json.dumps(rec) + "\n")
    summary = {
        "steps": steps, "requests": len(pending), "done": len(done), "total_tokens": pool_tokens(args), "setup_s": round(setup_s, 3),
        "loop_s": round(loop_s, 4), "steps_per_s": round(steps / loop_s, 1) if loop_s > 0 else None,
    }
    return summary


def main(argv=None):
    args = parse_args(argv)
    t0 = time.perf_counter()
    sg = sglang()
    import_s = time.perf_counter() - t0
    out = sys.stdout if args.out == "-" else open(args.out, "w")
    try:
        summary = run(args, out, sg)
    finally:
        if out is not sys.stdout:
            out.close()
    summary["import_s"] = round(import_s, 1)
    print(json.dumps(summary), file=sys.stderr)
    return 0 if summary["done"] >= summary["requests"] else 1


if __name__ == "__main__":
    sys.exit(main())
