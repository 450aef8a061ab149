#!/usr/bin/env python3
"""Drive vLLM 0.33's real v1 Scheduler (CPU, no model) with speculative decoding and a fake drafter/verifier.

Run INSIDE the vLLM venv (it imports vllm, never batchcheck):

    VLLM_TARGET_DEVICE=cpu ~/.cache/vllm-scheduler/venv/bin/python tests/vllm_spec_driver.py \
        TRACE.json --num-blocks 64 --block-size 16 --max-num-seqs 8 --max-num-batched-tokens 256 \
        [every flag of shared/tools/vllm-scheduler/drive_vllm_scheduler.py] \
        --spec-method ngram|draft_model|eagle --num-speculative-tokens K [--accept-rate P] [--seed S] \
        [--shared-driver DIR] --out LOG.jsonl

The Scheduler is the shared driver's (tests/vllm_harness.py, shared/tools/vllm-scheduler), with a
SpeculativeConfig in its VllmConfig: ``ngram`` needs no model at all; ``draft_model`` and ``eagle`` name the
shared driver's config-only tiny model as the draft model (no weights are loaded: only the Scheduler is built).
What the method changes in the scheduler (vllm/config/vllm.py num_lookahead_tokens, vllm/config/speculative.py
max_num_new_slots_for_drafting): ngram 0 lookahead slots and 0 extra budget slots; eagle K lookahead slots;
draft_model K lookahead slots and 1 extra budget slot per scheduled request.

Each step the fake worker does what the GPU runner plus rejection sampler do, through the Scheduler's own API:
  - a request scheduled as a prefill chunk samples nothing; any other scheduled request samples 1 + a tokens,
    where a (0..d) is the number of its d scheduled drafts (SchedulerOutput.scheduled_spec_decode_tokens) that
    are accepted. Padded drafts (-1 placeholders, a resumed request padded to a uniform decode) are rejected
    (a = 0). Otherwise a is the trace's ``accepted`` list for the request (its n-th entry for its n-th step
    with drafts, clamped to d; past its end the rule below), else the seeded rule: leading successes of a
    Bernoulli(p) per draft, p the request's ``accept_rate`` (default --accept-rate), drawn from
    random.Random(f"{seed}:{id}:{step}").
  - after update_from_output, the drafter proposes exactly K draft tokens for every request of the step's batch
    that is still unfinished (Scheduler.update_draft_token_ids, as EngineCore.post_step calls it; the
    scheduler itself drops the drafts of a request that is still a prefill chunk).

Log: the shared driver's line per step, plus
  drafts    {id: d} the drafts scheduled for each request that has any (len of scheduled_spec_decode_tokens)
  accepted  {id: a} how many of them the verifier accepted (same keys as drafts; 0 for padded drafts)
check-log (--conformance) feeds ``accepted`` to the engine as the environment's choice.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
import warnings

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
os.environ.setdefault("PYTHONHASHSEED", "0")
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
warnings.filterwarnings("ignore")

HERE = os.path.dirname(os.path.abspath(__file__))
METHODS = ("ngram", "draft_model", "eagle")


def _connector_driver():
    """tests/vllm_connector_driver.py (it imports vllm lazily too): its load_shared and the shared driver's flags."""
    if HERE not in sys.path:
        sys.path.insert(0, HERE)
    import vllm_connector_driver

    return vllm_connector_driver


def load_shared(path: str | None):
    return _connector_driver().load_shared(path)


def build_scheduler(args, shared, asynchronous: bool = False):
    """The shared driver's Scheduler, with a SpeculativeConfig (none when ``args.spec_method`` is None); with
    ``asynchronous`` the AsyncScheduler under async_scheduling=True, as vLLM builds it for --async-scheduling
    (SchedulerConfig.get_scheduler_cls)."""
    import torch
    from vllm.config import (CacheConfig, ModelConfig, ParallelConfig, SchedulerConfig, SpeculativeConfig,
                             VllmConfig)
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    model_dir = shared.ensure_tiny_model(args.model_dir)
    model_config = ModelConfig(model=model_dir, skip_tokenizer_init=True, dtype="float16", seed=0,
                               max_model_len=args.max_model_len)
    scheduler_config = SchedulerConfig(
        max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
        max_model_len=args.max_model_len, is_encoder_decoder=False,
        long_prefill_token_threshold=args.long_prefill_token_threshold,
        enable_chunked_prefill=not args.no_chunked_prefill, policy=args.policy, watermark=args.watermark,
        scheduler_reserve_full_isl=not args.no_reserve_full_isl, async_scheduling=asynchronous)
    cache_config = CacheConfig(block_size=args.block_size, enable_prefix_caching=args.enable_prefix_caching)
    if args.spec_method is None:
        spec = None
    elif args.spec_method == "ngram":
        spec = SpeculativeConfig(method="ngram", num_speculative_tokens=args.num_speculative_tokens,
                                 prompt_lookup_max=3, prompt_lookup_min=1)
    else:
        spec = SpeculativeConfig(method=args.spec_method, num_speculative_tokens=args.num_speculative_tokens,
                                 model=model_dir,
                                 target_model_config=model_config, target_parallel_config=ParallelConfig())
    vllm_config = VllmConfig(scheduler_config=scheduler_config, model_config=model_config,
                             cache_config=cache_config, speculative_config=spec)
    kv_cache_config = KVCacheConfig(
        num_blocks=args.num_blocks, kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(["layer"], FullAttentionSpec(
            block_size=args.block_size, num_kv_heads=1, head_size=1, dtype=torch.float32))])
    cache_config.num_gpu_blocks = args.num_blocks
    cls = AsyncScheduler if asynchronous else Scheduler
    return cls(vllm_config=vllm_config, kv_cache_config=kv_cache_config,
               structured_output_manager=StructuredOutputManager(vllm_config), block_size=args.block_size,
               log_stats=False)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("trace")
    ap.add_argument("--policy", choices=["fcfs", "priority"], default="fcfs")
    for flag, kind, default in _connector_driver().SHARED_FLAGS:
        if kind is None:
            ap.add_argument(flag, action="store_true")
        else:
            ap.add_argument(flag, type=kind, default=default)
    ap.add_argument("--spec-method", choices=METHODS, default="ngram")
    ap.add_argument("--num-speculative-tokens", type=int, default=3)
    ap.add_argument("--accept-rate", type=float, default=0.6,
                    help="per-draft acceptance probability of the seeded rule (a trace row's accept_rate wins)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--shared-driver", default=None)
    return ap


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    return run(args, load_shared(args.shared_driver))


class Verifier:
    """How many of a request's scheduled drafts are accepted (the environment's choice, see the module doc)."""

    def __init__(self, trace: list[dict], ids: list[str], rate: float, seed: int):
        self.lists = {rid: list(t.get("accepted") or ()) for rid, t in zip(ids, trace)}
        self.rates = {rid: float(t.get("accept_rate", rate)) for rid, t in zip(ids, trace)}
        self.seen: dict[str, int] = {}
        self.seed = seed

    def accepted(self, rid: str, step: int, drafts: list[int]) -> int:
        if any(t < 0 for t in drafts):  # padding placeholders: never the target's token
            return 0
        n = self.seen.get(rid, 0)
        self.seen[rid] = n + 1
        given = self.lists.get(rid, [])
        if n < len(given):
            return max(0, min(int(given[n]), len(drafts)))
        rng = random.Random(f"{self.seed}:{rid}:{step}")
        a = 0
        while a < len(drafts) and rng.random() < self.rates.get(rid, 0.0):
            a += 1
        return a


def run(args, shared) -> int:
    with open(args.trace) as f:
        trace = json.load(f)
    t_setup = time.perf_counter()
    from vllm.v1.outputs import DraftTokenIds, ModelRunnerOutput

    ids = [str(t.get("id", i)) for i, t in enumerate(trace)]
    sched = build_scheduler(args, shared)
    pending = shared.make_requests(trace, args.block_size)
    verifier = Verifier(trace, ids, args.accept_rate, args.seed)
    k = args.num_speculative_tokens
    token = shared.SAMPLED_TOKEN
    setup_s = time.perf_counter() - t_setup

    out = sys.stdout if args.out == "-" else open(args.out, "w")
    by_arrival, aborts = _connector_driver().by_step(pending)
    last_arrival = max(by_arrival) if by_arrival else 0
    total = len(pending)
    finished: set[str] = set()
    sched_time = 0.0
    steps = total_tokens = drafted = accepted_total = 0
    for step in range(args.max_steps):
        aborted_now = _connector_driver().arrive_and_abort(sched, step, by_arrival, aborts, finished)
        if step > last_arrival and len(finished) >= total:
            break
        t0 = time.perf_counter()
        so = sched.schedule()
        req_ids = list(so.num_scheduled_tokens.keys())
        sampled, drafts, accepted = [], {}, {}
        for rid in req_ids:
            r = sched.requests.get(rid)
            if r is None or r.is_prefill_chunk:
                sampled.append([])
                continue
            spec = so.scheduled_spec_decode_tokens.get(rid) or []
            a = verifier.accepted(rid, step, spec) if spec else 0
            if spec:
                drafts[rid], accepted[rid] = len(spec), a
            sampled.append([token] * (1 + a))
        mro = ModelRunnerOutput(req_ids=req_ids, req_id_to_index={rid: i for i, rid in enumerate(req_ids)},
                                sampled_token_ids=sampled)
        eco = sched.update_from_output(so, mro)
        live = [rid for rid in req_ids if rid in sched.requests and not sched.requests[rid].is_finished()]
        if req_ids:  # EngineCore.post_step: the drafter's proposals for the batch just run
            sched.update_draft_token_ids(DraftTokenIds(req_ids=live, draft_token_ids=[[token] * k for _ in live]))
        sched_time += time.perf_counter() - t0
        steps += 1
        fin_now = _connector_driver().finishes(eco, finished)
        total_tokens += so.total_num_scheduled_tokens
        drafted += sum(drafts.values())
        accepted_total += sum(accepted.values())
        if not args.quiet:
            rec = {**_connector_driver().step_record(sched, so, step, fin_now, aborted_now), "drafts": drafts,
                   "accepted": accepted}
            out.write(json.dumps(rec) + "\n")
    if out is not sys.stdout:
        out.close()
    summary = {"steps": steps, "requests": total, "finished": len(finished), "scheduled_tokens": total_tokens,
               "drafts": drafted, "accepted": accepted_total, "setup_s": round(setup_s, 3),
               "sched_loop_s": round(sched_time, 4)}
    print(json.dumps(summary), file=sys.stderr)
    return 0 if len(finished) >= total else 1


if __name__ == "__main__":
    sys.exit(main())
