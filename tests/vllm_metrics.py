"""Prometheus scrapes of the real vLLM 0.33 scheduler: its own metrics code (vllm.v1.metrics.loggers
PrometheusStatLogger, prometheus_client's text exposition), fed by the real Scheduler's SchedulerStats, step by
step, as `curl -s :8000/metrics >> scrapes.prom` every few steps would record them.

Runs inside the real-scheduler venv (../shared/tools/vllm-scheduler, README); it drives the scheduler with
that harness's own set-up functions (build_scheduler, make_requests), with log_stats on:

    VLLM_TARGET_DEVICE=cpu $VENV/bin/python tests/vllm_metrics.py TRACE.json --out SCRAPES.prom \\
        --scrape-every 5 [harness flags: --num-blocks, --max-num-seqs, --enable-prefix-caching, ...]

What vLLM's output processor adds to IterationStats on a real server is filled in from the step itself: the
tokens sampled (vllm:generation_tokens) and the requests preempted (vllm:num_preemptions); prompt-token and
latency series stay at zero (no output processor, no clock).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

HARNESS = Path(__file__).resolve().parents[2] / "shared" / "tools" / "vllm-scheduler" / "drive_vllm_scheduler.py"


def harness():
    spec = importlib.util.spec_from_file_location("drive_vllm_scheduler", HARNESS)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("trace")
    ap.add_argument("--out", required=True)
    ap.add_argument("--scrape-every", type=int, default=5, help="steps between two scrapes")
    ap.add_argument("--num-blocks", type=int, default=1024)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--max-num-seqs", type=int, default=16)
    ap.add_argument("--max-num-batched-tokens", type=int, default=2048)
    ap.add_argument("--max-model-len", type=int, default=8192)
    ap.add_argument("--long-prefill-token-threshold", type=int, default=0)
    ap.add_argument("--policy", choices=["fcfs", "priority"], default="fcfs")
    ap.add_argument("--watermark", type=float, default=0.0)
    ap.add_argument("--enable-prefix-caching", action="store_true")
    ap.add_argument("--no-chunked-prefill", action="store_true")
    ap.add_argument("--no-reserve-full-isl", action="store_true")
    ap.add_argument("--max-steps", type=int, default=100000)
    ap.add_argument("--model-dir", default=None)
    args = ap.parse_args(argv)

    drive = harness()
    import prometheus_client
    import vllm.v1.core.sched.scheduler as scheduler_module
    from vllm.v1.metrics.loggers import PrometheusStatLogger
    from vllm.v1.metrics.stats import IterationStats
    from vllm.v1.outputs import ModelRunnerOutput
    from vllm.v1.request import RequestStatus

    plain = scheduler_module.Scheduler

    class LoggedScheduler(plain):  # the harness builds it with log_stats=False
        def __init__(self, *a, **k):
            k["log_stats"] = True
            super().__init__(*a, **k)

    scheduler_module.Scheduler = LoggedScheduler
    try:
        sched = drive.build_scheduler(args)
    finally:
        scheduler_module.Scheduler = plain
    logger = PrometheusStatLogger(sched.vllm_config, [0])
    trace = json.loads(Path(args.trace).read_text())
    by_arrival: dict[int, list] = {}
    aborts: dict[int, list[str]] = {}
    for arrival, abort, req in drive.make_requests(trace, args.block_size):
        by_arrival.setdefault(arrival, []).append(req)
        if abort is not None:
            aborts.setdefault(int(abort), []).append(req.request_id)
    last_arrival, total, finished = max(by_arrival, default=0), len(trace), set()
    scrapes = 0
    with open(args.out, "w") as out:
        for step in range(args.max_steps):
            for req in by_arrival.get(step, []):
                sched.add_request(req)
            for rid in aborts.get(step, []):
                if rid not in finished and sched.finish_requests(rid, RequestStatus.FINISHED_ABORTED):
                    finished.add(rid)
            if step > last_arrival and len(finished) >= total:
                break
            so = sched.schedule()
            ids = list(so.num_scheduled_tokens)
            sampled = [[] if (r := sched.requests.get(rid)) is None or r.is_prefill_chunk else [drive.SAMPLED_TOKEN]
                       for rid in ids]
            eco = sched.update_from_output(so, ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in
                                                                                             enumerate(ids)},
                                                                 sampled_token_ids=sampled))
            iteration = IterationStats()
            iteration.num_generation_tokens = sum(len(s) for s in sampled)
            iteration.num_preempted_reqs = len(so.preempted_req_ids)
            stats = None
            for outs in eco.values():
                stats = outs.scheduler_stats or stats
                finished.update(o.request_id for o in outs.outputs if o.finish_reason is not None)
            logger.record(scheduler_stats=stats, iteration_stats=iteration, engine_idx=0)
            if step % args.scrape_every == 0:
                out.write(prometheus_client.generate_latest().decode())
                scrapes += 1
        out.write(prometheus_client.generate_latest().decode())
    print(json.dumps({"steps": step, "scrapes": scrapes + 1, "requests": total}), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
