#!/usr/bin/env python3
"""Drive vLLM 0.33's real v1 Scheduler (CPU, no model) with a fake KV connector.

Run INSIDE the vLLM venv (it imports vllm, never batchcheck):

    VLLM_TARGET_DEVICE=cpu ~/.cache/vllm-scheduler/venv/bin/python tests/vllm_connector_driver.py \
        TRACE.json --num-blocks 64 --block-size 16 --max-num-seqs 8 --max-num-batched-tokens 256 \
        [every flag of shared/tools/vllm-scheduler/drive_vllm_scheduler.py] \
        [--kv-role consumer|producer|both] [--external-query until-load|first] \
        [--shared-driver DIR] --out LOG.jsonl

Without --kv-role there is no connector and the log is the shared driver's, line for line. With it, the
Scheduler's VllmConfig carries a KVTransferConfig whose kv_connector_module_path loads
``FakeKVConnector`` (below, a KVConnectorBase_V1) from this file, and every step the fake worker (a second
instance of the same class, role WORKER) turns the step's connector metadata into the model output's
``kv_connector_output`` exactly where the real GPU runner does (KVConnectorModelRunnerMixin).

Trace fields on top of the shared driver's (all optional, per request):
  external_tokens  int: the remote KV this request can load. The scheduler side answers
                   get_num_new_matched_tokens(request, n_local) with
                   (max(0, min(external_tokens, num_tokens) - n_local), True) until a load has been started
                   for it (update_state_after_alloc with num_external_tokens > 0), (0, False) afterwards, so
                   a request preempted after its load recomputes locally. --external-query first: answer
                   only the first query (the brief's literal rule; a first query whose allocation fails
                   then loses the remote KV).
  load_steps       int >= 1 or null (default 1): a load started in schedule() of step t is reported in
                   finished_recving of step t + load_steps - 1's model output, so the scheduler can promote
                   it in schedule() of step t + load_steps. null: never reported (a hung load).
  send_steps       int >= 0 or null (default 0; producer/both roles): a request that finishes by length
                   (FINISHED_LENGTH_CAPPED) at step t gets delay_free=True from request_finished(); its
                   finished_sending is in step t + 1 + send_steps's model output. The worker learns of the
                   finish only from step t + 1's SchedulerOutput.finished_req_ids (and the send from that
                   step's connector metadata), and KVConnectorBase_V1.get_finished requires the ids it
                   reports to be in such a set, so step t + 1 is the earliest a real worker can report it.
                   null: never (blocks pinned forever). Aborted requests are not sent (as NixlConnector).
  abort_step       as in the shared driver; works on loading requests too.
  load_fails       bool (default false): the request's load is reported in finished_recving and also in
                   failed_recving (KVConnectorTransferResults.failed_recving: the load failed); the scheduler
                   then follows --kv-load-failure-policy (fail: FINISHED_ERROR; recompute: recomputed).
  grammar_steps    int >= 0 (default 0; works without --kv-role too): a structured-output request (a JSON
                   schema) whose grammar future completes before schedule() of step arrival_step +
                   grammar_steps: until then it waits in WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR, which
                   schedule() skips. The grammar is FakeGrammar (below): it accepts every token.

Log: the shared driver's line per step; with --kv-role also
  loading     ids in WAITING_FOR_REMOTE_KVS after schedule() (finished ones excluded), trace order
  recv_done   ids in this step's kv_connector_output.finished_recving
  sent_done   ids in this step's kv_connector_output.finished_sending
  pinned      finished ids whose blocks are still held for a send (after update_from_output)
  pinned_load finished (aborted) ids whose blocks are still held for a load's finished_recving
  held        {id: blocks} of every request that holds KV blocks while it is not running, after
              update_from_output (loading, loaded and waiting, pinned, aborted and held): what check-log
              needs to account for the pool request by request
The run stops as the shared driver's does (every request finished, past the last arrival) once no transfer
that will ever be reported is pending, or earlier when nothing can change any more: past the last arrival
and the last abort, every unfinished request a hung load and every held block waiting on a hung transfer.
"""

from __future__ import annotations

import argparse
import json
import os
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
DEFAULT_SHARED = os.path.join(os.path.dirname(os.path.dirname(HERE)), "shared", "tools", "vllm-scheduler")
# The name vLLM imports the connector class from (kv_connector_module_path): this very module object, so
# that running the file as a script does not load a second copy.
MODULE_NAME = "batchcheck_vllm_connector_driver"
CONNECTOR_NAME = "FakeKVConnector"
sys.modules.setdefault(MODULE_NAME, sys.modules[__name__])

ROLES = {"consumer": "kv_consumer", "producer": "kv_producer", "both": "kv_both"}


def load_shared(path: str | None):
    """The shared driver as a module (make_requests, ensure_tiny_model, build_scheduler, main)."""
    folder = path or DEFAULT_SHARED
    if os.path.isfile(folder):
        folder = os.path.dirname(folder)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    import drive_vllm_scheduler

    return drive_vllm_scheduler


def _connector_class():
    """FakeKVConnector, defined once vLLM is importable (this file must load without it for --help)."""
    cached = globals().get(CONNECTOR_NAME)
    if cached is not None:
        return cached
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1, KVConnectorMetadata
    from vllm.v1.request import RequestStatus

    class FakeMetadata(KVConnectorMetadata):
        def __init__(self, loads: dict, sends: dict):
            self.loads = loads  # req id -> load_steps (None: hung), started in this step
            self.sends = sends  # req id -> send_steps (None: hung), finished before this step

    class FakeKVConnector(KVConnectorBase_V1):
        """Scheduler role: answers matches from the trace and delays the free of finished requests (producer).
        Worker role: reports finished_recving / finished_sending on the trace's schedule."""

        def __init__(self, vllm_config, role, kv_cache_config):
            super().__init__(vllm_config, role, kv_cache_config)
            cfg = self._kv_transfer_config
            extra = cfg.kv_connector_extra_config
            self.specs: dict[str, dict] = extra.get("requests", {})
            self.query_mode: str = extra.get("external_query", "until-load")
            self.consumer = cfg.is_kv_consumer
            self.producer = cfg.is_kv_producer
            self.queried: set[str] = set()
            self.loaded: set[str] = set()
            self.pending_loads: dict = {}
            self.pending_sends: dict = {}
            # worker side
            self.worker_step = -1
            self.recv_due: dict[int, list[str]] = {}
            self.send_due: dict[int, list[str]] = {}
            self.sends_announced: set[str] = set()
            self.finished_seen: set[str] = set()

        # ---- scheduler side ----
        def get_num_new_matched_tokens(self, request, num_computed_tokens):
            rid = request.request_id
            first = rid not in self.queried
            self.queried.add(rid)
            ext = int(self.specs.get(rid, {}).get("external_tokens") or 0)
            if not self.consumer or ext <= 0 or rid in self.loaded:
                return 0, False
            if self.query_mode == "first" and not first:
                return 0, False
            n = max(0, min(ext, request.num_tokens) - num_computed_tokens)
            return n, n > 0

        def update_state_after_alloc(self, request, blocks, num_external_tokens):
            if num_external_tokens > 0:
                rid = request.request_id
                self.loaded.add(rid)
                self.pending_loads[rid] = self.specs.get(rid, {}).get("load_steps", 1)

        def build_connector_meta(self, scheduler_output):
            meta = FakeMetadata(self.pending_loads, self.pending_sends)
            self.pending_loads, self.pending_sends = {}, {}
            return meta

        def request_finished(self, request, block_ids):
            if self.producer and request.status == RequestStatus.FINISHED_LENGTH_CAPPED:
                rid = request.request_id
                self.pending_sends[rid] = self.specs.get(rid, {}).get("send_steps", 0)
                return True, None
            return False, None

        # ---- worker side ----
        def bind_connector_metadata(self, connector_metadata):
            super().bind_connector_metadata(connector_metadata)
            self.worker_step += 1
            for rid, steps in connector_metadata.loads.items():
                if steps is not None:
                    self.recv_due.setdefault(self.worker_step + int(steps) - 1, []).append(rid)
            for rid, steps in connector_metadata.sends.items():
                self.sends_announced.add(rid)
                if steps is not None:
                    self.send_due.setdefault(self.worker_step + int(steps), []).append(rid)

        def start_load_kv(self, forward_context, **kwargs):
            return None

        def wait_for_layer_load(self, layer_name):
            return None

        def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
            return None

        def wait_for_save(self):
            return None

        def get_finished(self, finished_req_ids):
            self.finished_seen |= set(finished_req_ids)
            sending = self.send_due.pop(self.worker_step, [])
            # KVConnectorBase_V1.get_finished: sent ids must have come in a finished_req_ids set.
            assert all(rid in self.finished_seen for rid in sending), sending
            recving = self.recv_due.pop(self.worker_step, [])
            return set(sending) or None, set(recving) or None

        def get_transfer_results(self, finished_req_ids):
            """The base class's results, plus the loads whose trace row says load_fails as failed_recving (a
            failed receive is also reported in finished_recving, as KVConnectorTransferResults says)."""
            results = super().get_transfer_results(finished_req_ids)
            results.failed_recving = {rid for rid in results.finished_recving
                                      if self.specs.get(rid, {}).get("load_fails")}
            return results

        def pending_reports(self) -> bool:
            return bool(self.recv_due or self.send_due)

    globals()[CONNECTOR_NAME] = FakeKVConnector
    return FakeKVConnector


def __getattr__(name):  # vLLM's importlib lookup of kv_connector_module_path.FakeKVConnector
    if name == CONNECTOR_NAME:
        return _connector_class()
    raise AttributeError(name)


def build_scheduler(args, shared, specs: dict):
    """The shared driver's Scheduler, plus a KVTransferConfig loading FakeKVConnector."""
    import torch
    from vllm.config import CacheConfig, KVTransferConfig, ModelConfig, SchedulerConfig, VllmConfig
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    _connector_class()
    model_config = ModelConfig(model=shared.ensure_tiny_model(args.model_dir), skip_tokenizer_init=True,
                               dtype="float16", seed=0, max_model_len=args.max_model_len)
    scheduler_config = SchedulerConfig(
        max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
        max_model_len=args.max_model_len, is_encoder_decoder=False,
        long_prefill_token_threshold=args.long_prefill_token_threshold,
        enable_chunked_prefill=not args.no_chunked_prefill, policy=args.policy, watermark=args.watermark,
        scheduler_reserve_full_isl=not args.no_reserve_full_isl, async_scheduling=False)
    cache_config = CacheConfig(block_size=args.block_size, enable_prefix_caching=args.enable_prefix_caching)
    kv_transfer_config = KVTransferConfig(
        kv_connector=CONNECTOR_NAME, kv_connector_module_path=MODULE_NAME, kv_role=ROLES[args.kv_role],
        kv_connector_extra_config={"requests": specs, "external_query": args.external_query},
        kv_load_failure_policy=args.kv_load_failure_policy)
    vllm_config = VllmConfig(scheduler_config=scheduler_config, model_config=model_config,
                             cache_config=cache_config, kv_transfer_config=kv_transfer_config)
    kv_cache_config = KVCacheConfig(
        num_blocks=args.num_blocks, kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(["layer"], FullAttentionSpec(
            block_size=args.block_size, num_kv_heads=1, head_size=1, dtype=torch.float32))])
    cache_config.num_gpu_blocks = args.num_blocks
    sched = Scheduler(vllm_config=vllm_config, kv_cache_config=kv_cache_config,
                      structured_output_manager=StructuredOutputManager(vllm_config),
                      block_size=args.block_size, log_stats=False)
    worker = _connector_class()(vllm_config, KVConnectorRole.WORKER, kv_cache_config)
    return sched, worker


# The shared driver's flags (drive_vllm_scheduler.main builds its parser inline): name, type, default;
# type None is a store_true switch.
SHARED_FLAGS = (
    ("--num-blocks", int, 1024), ("--block-size", int, 16), ("--max-num-seqs", int, 16),
    ("--max-num-batched-tokens", int, 2048), ("--max-model-len", int, 8192),
    ("--long-prefill-token-threshold", int, 0), ("--watermark", float, 0.0),
    ("--enable-prefix-caching", None, False), ("--no-chunked-prefill", None, False),
    ("--no-reserve-full-isl", None, False), ("--max-steps", int, 100000), ("--out", str, "-"),
    ("--model-dir", str, None), ("--quiet", None, False),
)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("trace")
    ap.add_argument("--policy", choices=["fcfs", "priority"], default="fcfs")
    for flag, kind, default in SHARED_FLAGS:
        if kind is None:
            ap.add_argument(flag, action="store_true")
        else:
            ap.add_argument(flag, type=kind, default=default)
    ap.add_argument("--kv-role", choices=sorted(ROLES), default=None,
                    help="load FakeKVConnector in this role (default: no connector, the shared driver's run)")
    ap.add_argument("--external-query", choices=["until-load", "first"], default="until-load")
    ap.add_argument("--kv-load-failure-policy", choices=["fail", "recompute"], default="fail",
                    help="KVTransferConfig.kv_load_failure_policy (what a load reported in failed_recving does)")
    ap.add_argument("--shared-driver", default=None,
                    help="the folder (or file) of drive_vllm_scheduler.py (default: ../shared/tools/vllm-scheduler)")
    return ap


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    return run(args, load_shared(args.shared_driver))


def run(args, shared) -> int:
    """The shared driver's loop; with a connector, also the fake worker's kv_connector_output each step."""
    with open(args.trace) as f:
        trace = json.load(f)
    t_setup = time.perf_counter()
    from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput
    from vllm.v1.request import RequestStatus

    ids = [str(t.get("id", i)) for i, t in enumerate(trace)]
    order = {rid: i for i, rid in enumerate(ids)}
    specs = {rid: {k: t[k] for k in ("external_tokens", "load_steps", "send_steps", "load_fails") if k in t}
             for rid, t in zip(ids, trace)}
    if args.kv_role is None:
        sched, worker = shared.build_scheduler(args), None
    else:
        sched, worker = build_scheduler(args, shared, specs)
    pending = shared.make_requests(trace, args.block_size)
    grammars = grammar_futures(trace, pending)
    setup_s = time.perf_counter() - t_setup

    def in_order(xs) -> list[str]:
        return sorted(xs, key=lambda r: order.get(r, len(order)))

    out = sys.stdout if args.out == "-" else open(args.out, "w")
    by_arrival, aborts = by_step(pending)
    last_arrival = max(by_arrival) if by_arrival else 0
    total = len(pending)
    finished: set[str] = set()
    held_send: set[str] = set()  # finished, blocks held until finished_sending
    held_load: set[str] = set()  # aborted while loading, blocks held until finished_recving
    connector = sched.connector  # the scheduler-side FakeKVConnector, or None
    sched_time = 0.0
    steps = 0
    total_tokens = 0

    def hung_load(rid: str) -> bool:
        return specs.get(rid, {}).get("load_steps", 1) is None

    def quiescent(step: int) -> bool:
        """Nothing can change any more: only hung loads and blocks held by hung transfers are left."""
        if worker is None or step <= last_arrival or worker.pending_reports() or connector.pending_sends:
            return False
        for r in sched.requests.values():
            if not r.is_finished() and (r.status != RequestStatus.WAITING_FOR_REMOTE_KVS
                                        or not hung_load(r.request_id)
                                        or r.request_id in sched.finished_recving_kv_req_ids):
                return False
        return not any(s >= step and any(r not in finished for r in rs) for s, rs in aborts.items())

    for step in range(args.max_steps):
        for future in grammars.pop(step, ()):
            future.set_result(FakeGrammar())
        for req in by_arrival.get(step, []):
            sched.add_request(req)
        aborted_now = []
        for rid in aborts.get(step, []):
            if rid not in finished:
                req = sched.requests.get(rid)
                was_loading = req is not None and req.status == RequestStatus.WAITING_FOR_REMOTE_KVS
                done = sched.finish_requests(rid, RequestStatus.FINISHED_ABORTED)
                if done:
                    aborted_now.append(rid)
                    finished.add(rid)
                    if was_loading and rid in sched.requests:
                        held_load.add(rid)
        transfers_left = worker is not None and (worker.pending_reports() or bool(connector.pending_sends))
        if step > last_arrival and len(finished) >= total and not transfers_left:
            break
        if quiescent(step):
            break
        t0 = time.perf_counter()
        so = sched.schedule()
        req_ids = list(so.num_scheduled_tokens.keys())
        sampled = []
        for rid in req_ids:
            r = sched.requests.get(rid)
            sampled.append([] if (r is None or r.is_prefill_chunk) else [shared.SAMPLED_TOKEN])
        if worker is None:
            mro = ModelRunnerOutput(req_ids=req_ids, req_id_to_index={rid: i for i, rid in enumerate(req_ids)},
                                    sampled_token_ids=sampled)
        else:
            loading = [r.request_id for r in sched.requests.values()
                       if r.status == RequestStatus.WAITING_FOR_REMOTE_KVS]
            # The fake worker, as KVConnectorModelRunnerMixin._get_kv_connector_output runs the real one.
            worker.bind_connector_metadata(so.kv_connector_metadata)
            worker.start_load_kv(None)
            worker.wait_for_save()
            results = worker.get_transfer_results(so.finished_req_ids)
            worker.clear_connector_metadata()
            kvo = KVConnectorOutput(finished_sending=results.finished_sending or None,
                                    finished_recving=results.finished_recving or None,
                                    failed_recving=results.failed_recving or set())
            if req_ids:
                mro = ModelRunnerOutput(req_ids=req_ids,
                                        req_id_to_index={rid: i for i, rid in enumerate(req_ids)},
                                        sampled_token_ids=sampled, kv_connector_output=kvo)
            else:  # GPUModelRunner.execute_model with nothing scheduled: kv_connector_no_forward
                mro = ModelRunnerOutput.with_kv_conn_output_only(kvo)
        eco = sched.update_from_output(so, mro)
        sched_time += time.perf_counter() - t0
        steps += 1
        fin_now = finishes(eco, finished)
        held_send.update(rid for rid in fin_now if rid in sched.requests)
        held_send &= set(sched.requests)
        held_load &= set(sched.requests)
        total_tokens += so.total_num_scheduled_tokens
        if not args.quiet:
            rec = step_record(sched, so, step, fin_now, aborted_now)
            if worker is not None:
                rec.update(loading=in_order(loading), recv_done=in_order(results.finished_recving),
                           sent_done=in_order(results.finished_sending), pinned=in_order(held_send),
                           pinned_load=in_order(held_load), held=held_outside_batch(sched, in_order))
            out.write(json.dumps(rec) + "\n")
    if out is not sys.stdout:
        out.close()
    summary = {"steps": steps, "requests": total, "finished": len(finished), "scheduled_tokens": total_tokens,
               "setup_s": round(setup_s, 3), "sched_loop_s": round(sched_time, 4),
               "steps_per_s": round(steps / sched_time, 1) if sched_time > 0 else None}
    print(json.dumps(summary), file=sys.stderr)
    return 0 if len(finished) >= total else 1


def grammar_futures(trace: list[dict], pending) -> dict[int, list]:
    """Make each request whose trace row has grammar_steps > 0 a structured-output request (a JSON schema) whose
    grammar is a Future not yet done (its status WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR, as Request.__init__ sets it
    for structured outputs); the futures by the step before whose schedule() they complete."""
    from concurrent.futures import Future

    from vllm.sampling_params import StructuredOutputsParams
    from vllm.v1.request import RequestStatus
    from vllm.v1.structured_output.request import StructuredOutputRequest

    due: dict[int, list] = {}
    for row, (arrival, _, req) in zip(trace, pending):
        steps = int(row.get("grammar_steps") or 0)
        if steps <= 0:
            continue
        future: Future = Future()
        req.structured_output_request = StructuredOutputRequest(params=StructuredOutputsParams(json={"type": "object"}))
        req.structured_output_request.grammar = future
        req.status = RequestStatus.WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR
        due.setdefault(arrival + steps, []).append(future)
    return due


class FakeGrammar:
    """A compiled grammar that accepts every token (StructuredOutputGrammar's interface; the scheduler advances it
    with each sampled token in update_from_output, and never asks for a bitmask: the engine core does)."""

    def accept_tokens(self, request_id, tokens):
        return True

    def validate_tokens(self, tokens):
        return tokens

    def rollback(self, num_tokens):
        return None

    def fill_bitmask(self, bitmask, batch_index):
        return None

    def is_terminated(self):
        return False

    def reset(self):
        return None


def by_step(pending) -> tuple[dict[int, list], dict[int, list[str]]]:
    """The requests of make_requests by arrival step, and the ids aborted at each step."""
    by_arrival: dict[int, list] = {}
    aborts: dict[int, list[str]] = {}
    for arr, ab, req in pending:
        by_arrival.setdefault(arr, []).append(req)
        if ab is not None:
            aborts.setdefault(int(ab), []).append(req.request_id)
    return by_arrival, aborts


def arrive_and_abort(sched, step: int, by_arrival: dict[int, list], aborts: dict[int, list[str]],
                     finished: set[str]) -> list[str]:
    """The shared driver's start of a step: add the requests arriving now, abort those due (finish_requests
    FINISHED_ABORTED; added to ``finished``); the ids aborted."""
    from vllm.v1.request import RequestStatus

    for req in by_arrival.get(step, []):
        sched.add_request(req)
    aborted = []
    for rid in aborts.get(step, []):
        if rid not in finished and sched.finish_requests(rid, RequestStatus.FINISHED_ABORTED):
            aborted.append(rid)
            finished.add(rid)
    return aborted


def finishes(engine_outputs: dict, finished: set[str]) -> list[str]:
    """The ids update_from_output's outputs finish (added to ``finished``)."""
    done = []
    for outs in engine_outputs.values():
        for o in outs.outputs:
            if o.finish_reason is not None:
                done.append(o.request_id)
                finished.add(o.request_id)
    return done


def step_record(sched, so, step: int, finished: list[str], aborted: list[str]) -> dict:
    """The shared driver's log line of a step (after update_from_output), which the project's drivers extend."""
    running, waiting = sched.get_request_counts()
    return {"step": step, "scheduled": dict(so.num_scheduled_tokens), "preempted": sorted(so.preempted_req_ids),
            "finished": finished, "aborted": aborted, "running": running, "waiting": waiting,
            "free_blocks": sched.kv_cache_manager.block_pool.get_num_free_blocks()}


def held_outside_batch(sched, in_order) -> dict[str, int]:
    """Blocks held by each request that is not running (one KV cache group: the connector is not SupportsHMA)."""
    running = {r.request_id for r in sched.running}
    held = {}
    for rid in sched.requests:
        if rid not in running:
            n = sum(len(group) for group in sched.kv_cache_manager.get_block_ids(rid))
            if n:
                held[rid] = n
    return {rid: held[rid] for rid in in_order(held)}


if __name__ == "__main__":
    sys.exit(main())
