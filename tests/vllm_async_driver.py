#!/usr/bin/env python3
"""Drive vLLM 0.33's real AsyncScheduler (CPU, no model) the way the engine core runs async scheduling.

Run INSIDE the vLLM venv (it imports vllm, never batchcheck):

    VLLM_TARGET_DEVICE=cpu ~/.cache/vllm-scheduler/venv/bin/python tests/vllm_async_driver.py \
        TRACE.json --num-blocks 64 --block-size 16 --max-num-seqs 8 --max-num-batched-tokens 256 \
        [every flag of shared/tools/vllm-scheduler/drive_vllm_scheduler.py] [--shared-driver DIR] --out LOG.jsonl

The Scheduler is the speculative driver's build (tests/vllm_spec_driver.py build_scheduler) with
``async_scheduling=True``: the AsyncScheduler class, as SchedulerConfig.get_scheduler_cls picks it for
--async-scheduling; with --spec-method (draft_model or eagle: the V1 model runner refuses async scheduling with ngram)
a speculative config too, and the speculative driver's flags for the verifier. It is stepped as EngineCore.step_with_batch_queue steps it
(vllm/v1/engine/core.py) with a batch queue of max_concurrent_batches = 2 (async scheduling, pipeline size 1):
each engine step

  1. adds the requests arriving at this step and aborts those whose abort_step it is (finish_requests), as the
     engine core's input loop does between two steps;
  2. if the scheduler has requests (Scheduler.has_requests), calls schedule() and puts the batch into the
     queue with its fake model output; while the queue holds fewer than 2 batches the step ends there (the
     first batch after an idle spell);
  3. otherwise (queue full, or nothing to schedule and a batch in flight) takes the oldest batch out of the
     queue and calls update_from_output() with its output.

So a batch is resolved in the engine step after the one that scheduled it: step t+1's schedule() runs while step
t's output is still in flight (its requests carry num_output_placeholders).

The fake model output of a batch is decided when it is scheduled, as the GPU runner decides it: a request
scheduled as a prefill chunk (Request.is_prefill_chunk right after schedule()) samples nothing, any other
samples 1 + a tokens (a fixed non-EOS id; requests use ignore_eos, so each stops at exactly output_tokens), a the
drafts accepted: 0 without speculative decoding or for the padding drafts of a request admitted in the step, else
the speculative driver's Verifier (the trace's accepted list, or its seeded rule). The scheduled drafts are the
AsyncScheduler's placeholders, which the real worker fills with its own proposals.

Log: the shared driver's line per engine step (tests/vllm_connector_driver.step_record: ``scheduled`` and
``preempted`` of the batch scheduled in this step, ``finished`` by the batch resolved in it, counts and free blocks
after it), plus ``resolved``: the engine step whose batch update_from_output took in this step (null: none); with
--spec-method also ``drafts`` and ``accepted`` ({id: n}) of the batch scheduled in this step.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings
from collections import deque
from types import SimpleNamespace

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
os.environ.setdefault("PYTHONHASHSEED", "0")
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
warnings.filterwarnings("ignore")

HERE = os.path.dirname(os.path.abspath(__file__))
QUEUE_SIZE = 2  # VllmConfig.max_concurrent_batches with async scheduling and pipeline_parallel_size 1
NOTHING = SimpleNamespace(num_scheduled_tokens={}, preempted_req_ids=())  # a step that scheduled no batch


def _drivers():
    """tests/vllm_connector_driver.py and tests/vllm_spec_driver.py (both import vllm lazily)."""
    if HERE not in sys.path:
        sys.path.insert(0, HERE)
    import vllm_connector_driver
    import vllm_spec_driver

    return vllm_connector_driver, vllm_spec_driver


def parser() -> argparse.ArgumentParser:
    """The speculative driver's flags (every shared flag, --spec-method and the verifier's); without --spec-method
    no speculative config."""
    ap = _drivers()[1].parser()
    ap.description = __doc__.split("\n")[0]
    ap.set_defaults(spec_method=None)
    return ap


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    connector, _ = _drivers()
    return run(args, connector.load_shared(args.shared_driver))


def run(args, shared) -> int:
    with open(args.trace) as f:
        trace = json.load(f)
    t_setup = time.perf_counter()
    from vllm.v1.outputs import ModelRunnerOutput

    connector, spec_driver = _drivers()
    sched = spec_driver.build_scheduler(args, shared, asynchronous=True)
    pending = shared.make_requests(trace, args.block_size)
    ids = [str(t.get("id", i)) for i, t in enumerate(trace)]
    verifier = spec_driver.Verifier(trace, ids, args.accept_rate, args.seed) if args.spec_method else None
    token = shared.SAMPLED_TOKEN
    setup_s = time.perf_counter() - t_setup

    out = sys.stdout if args.out == "-" else open(args.out, "w")
    by_arrival, aborts = connector.by_step(pending)
    last_arrival = max(by_arrival) if by_arrival else 0
    total = len(pending)
    finished: set[str] = set()
    queue: deque = deque()  # (engine step, SchedulerOutput, ModelRunnerOutput), newest first
    sched_time = 0.0
    steps = total_tokens = 0
    for step in range(args.max_steps):
        aborted_now = connector.arrive_and_abort(sched, step, by_arrival, aborts, finished)
        if step > last_arrival and len(finished) >= total:
            break
        t0 = time.perf_counter()
        so, resolved, eco, drafts, accepted = NOTHING, None, {}, {}, {}
        if sched.has_requests():
            so = sched.schedule()
            req_ids = list(so.num_scheduled_tokens.keys())
            sampled, drafts, accepted = [], {}, {}
            admitted = {r.req_id for r in so.scheduled_new_reqs} | set(so.scheduled_cached_reqs.resumed_req_ids)
            for rid in req_ids:
                if sched.requests[rid].is_prefill_chunk:
                    sampled.append([])
                    continue
                spec = so.scheduled_spec_decode_tokens.get(rid) or []
                # the drafts are the scheduler's placeholders (-1), which the worker fills with its proposals, except
                # those of a request admitted in this step: uniform-decode padding, never accepted
                a = 0 if not spec or rid in admitted else verifier.accepted(rid, step, [0] * len(spec))
                if spec:
                    drafts[rid], accepted[rid] = len(spec), a
                sampled.append([token] * (1 + a))
            mro = ModelRunnerOutput(req_ids=req_ids, req_id_to_index={rid: i for i, rid in enumerate(req_ids)},
                                    sampled_token_ids=sampled)
            queue.appendleft((step, so, mro))
            total_tokens += so.total_num_scheduled_tokens
        if len(queue) >= QUEUE_SIZE or (queue and so is NOTHING):
            resolved, done, mro = queue.pop()
            eco = sched.update_from_output(done, mro)
        sched_time += time.perf_counter() - t0
        steps += 1
        fin_now = connector.finishes(eco, finished)
        if not args.quiet:
            rec = {**connector.step_record(sched, so, step, fin_now, aborted_now), "resolved": resolved}
            if verifier is not None:  # the drafts of the batch scheduled in this step and how many are accepted
                rec.update(drafts=drafts, accepted=accepted)
            out.write(json.dumps(rec) + "\n")
    if out is not sys.stdout:
        out.close()
    summary = {"steps": steps, "requests": total, "finished": len(finished), "scheduled_tokens": total_tokens,
               "setup_s": round(setup_s, 3), "sched_loop_s": round(sched_time, 4)}
    print(json.dumps(summary), file=sys.stderr)
    return 0 if len(finished) >= total else 1


if __name__ == "__main__":
    sys.exit(main())
