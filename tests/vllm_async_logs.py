"""The real vLLM 0.33 scheduler under async scheduling, from our side (pytest, bench): no vLLM import here.

tests/vllm_async_driver.py runs inside the vLLM venv and steps the real AsyncScheduler as the engine core's batch
queue does (one batch in flight; docs/speculative.md, "Async scheduling"). This module names the cases (trace shape
+ driver flags), runs them (tests/vllm_spec_logs.run_jobs with the async driver), turns the flags into `batchcheck
import vllm` arguments (with --async-scheduling), and compares a log with the engine as `check-log --conformance`
does. Used by tests/conformance/test_vllm_async_conformance.py and bench/vllm_async_matrix.py.
"""

from __future__ import annotations

import random
from pathlib import Path

from tests.vllm_spec_logs import absent_reason, compare as spec_compare, import_args as spec_import_args, read_log
from tests.vllm_spec_logs import run_jobs as spec_run_jobs, trace as spec_trace, venv_python

HERE = Path(__file__).resolve().parent
KEPT = HERE / "data" / "vllm_async"
DRIVER = "vllm_async_driver"

Trace = list[dict]
Job = tuple[Trace, list[str]]

__all__ = ["absent_reason", "venv_python", "read_log", "cases", "run_jobs", "import_args", "compare", "trace",
           "flags", "KEPT"]


def trace(n: int, seed: int, gap: float = 1.0, priority: bool = False, aborts: float = 0.0, groups: int = 0,
          prompt: tuple[int, int] = (40, 500), output: tuple[int, int] = (4, 80)) -> Trace:
    """The speculative cases' trace shape (tests/vllm_spec_logs.trace) without acceptance rates; with ``groups``,
    each request shares its prompt's prefix with the others of one of that many prefix groups (prefix caching)."""
    rows = [{k: v for k, v in row.items() if k != "accept_rate"}
            for row in spec_trace(n, seed, gap, prompt, output, priority, aborts)]
    if groups:
        rng = random.Random(f"{seed}/groups")
        for row in rows:
            row["prefix_group"] = rng.randrange(groups)
    return rows


def stale_trace(segments: int = 10) -> Trace:
    """A tight pool (5 usable blocks) where, every 60 steps, a one-token request takes the last free blocks in the
    step before a long decode crosses a block boundary: the decode preempts it while its only step is in flight, and
    that step's stale token still finishes it, from the waiting queue (vLLM's stopped_preempted_reqs)."""
    rows = []
    for i in range(segments):
        rows.append({"id": f"a{i}", "arrival_step": 60 * i, "prompt_tokens": 31, "output_tokens": 50})
        rows.append({"id": f"b{i}", "arrival_step": 60 * i + 1, "prompt_tokens": 48, "output_tokens": 1})
    return rows


def flags(num_blocks: int, max_num_seqs: int = 8, max_num_batched_tokens: int = 256,
          extra: tuple[str, ...] = ()) -> list[str]:
    return ["--num-blocks", str(num_blocks), "--block-size", "16", "--max-num-seqs", str(max_num_seqs),
            "--max-num-batched-tokens", str(max_num_batched_tokens), "--max-model-len", "8192", *extra]


def spec_flags(method: str, k: int, num_blocks: int, seed: int, extra: tuple[str, ...] = ()) -> list[str]:
    """A case with speculative decoding: the speculative driver's flags (its seeded verifier), async scheduling."""
    return flags(num_blocks, extra=("--spec-method", method, "--num-speculative-tokens", str(k), "--seed", str(seed),
                                    *extra))


def cases() -> dict[str, Job]:
    """The matrix: a roomy pool, KV pressure (preemptions), prefix caching with and without pressure, priority with
    aborts, a small budget with the long-prefill threshold, and victims whose in-flight step is their last."""
    return {
        "roomy_fcfs": (trace(160, 21, gap=3.0), flags(400)),
        "pressure_fcfs": (trace(200, 22, gap=0.6), flags(90)),
        "cache_pressure": (trace(200, 23, gap=0.6, groups=5), flags(100, extra=("--enable-prefix-caching",))),
        "cache_roomy_threshold": (trace(180, 24, gap=2.0, groups=3),
                                  flags(300, max_num_seqs=12, extra=("--enable-prefix-caching",
                                                                     "--long-prefill-token-threshold", "64"))),
        "priority_aborts": (trace(200, 25, gap=0.7, priority=True, aborts=0.1),
                            flags(110, extra=("--policy", "priority"))),
        "budget_threshold": (trace(160, 26, gap=2.5), flags(300, max_num_seqs=12, max_num_batched_tokens=128,
                                                            extra=("--long-prefill-token-threshold", "48"))),
        "stale_finish": (stale_trace(), flags(6)),
        "eagle_k2_pressure": (spec_trace(200, 27, gap=0.6), spec_flags("eagle", 2, 100, 27)),
        "draft_k3_priority_aborts": (spec_trace(200, 28, gap=0.7, priority=True, aborts=0.1),
                                     spec_flags("draft_model", 3, 120, 28, extra=("--policy", "priority"))),
    }


def run_jobs(jobs: dict[str, Job], keep: Path | None = None, timeout: float = 3600) -> dict[str, list[dict]]:
    return spec_run_jobs(jobs, keep, timeout, driver=DRIVER)


def import_args(fl: list[str]) -> list[str]:
    """The driver's flags as `batchcheck import vllm` arguments: the speculative driver's (tests/vllm_spec_logs.py:
    the shared flags and the speculative config), with async scheduling on."""
    return [a for a in spec_import_args(fl) if a != "--no-async-scheduling"] + ["--async-scheduling"]


def compare(rows: Trace, fl: list[str], log: Path, name: str, folder: Path):
    """The engine under the imported policy against the log (check-log --conformance's reference path)."""
    return spec_compare(rows, fl, log, name, folder, importer=import_args)
