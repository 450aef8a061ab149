"""The real vLLM 0.33 scheduler as an oracle: a matrix of generated traces, driven through the shared harness
(shared/tools/vllm-scheduler/drive_vllm_scheduler.py), compared with the engine step by step.

Used by tests/conformance/test_real_vllm.py (when the harness venv exists) and bench/vllm_matrix.py (the
table in docs/check-log.md). All cases of one run go through one harness process (its imports take ~30 s),
by calling the harness's own ``main`` once per case.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from checker.checklog import Conformance, conformance, load_arrivals, load_log
from checker.importers import import_policy
from checker.policy import Policy

ROOT = Path(__file__).resolve().parent.parent
HARNESS = ROOT.parent / "shared" / "tools" / "vllm-scheduler" / "drive_vllm_scheduler.py"
DEFAULT_VENV = Path.home() / ".cache" / "vllm-scheduler" / "venv"


def harness_python() -> Path | None:
    """The harness venv's python, or None when the venv (or the harness) is absent."""
    venv = Path(os.environ.get("BATCHCHECK_VLLM_VENV", DEFAULT_VENV))
    python = venv / "bin" / "python"
    return python if python.exists() and HARNESS.exists() else None


@dataclass(frozen=True)
class Case:
    name: str
    policy: str  # fcfs | priority
    caching: bool
    shape: str  # unique | system_prompts | prefix_groups | sessions
    requests: int
    num_blocks: int
    max_num_seqs: int = 16
    max_num_batched_tokens: int = 512
    threshold: int = 0
    aborts: float = 0.0  # share of requests aborted while they run or wait
    chunked: bool = True
    gap: float = 1.0  # mean steps between arrivals
    seed: int = 0
    extra: tuple[str, ...] = field(default=())

    def flags(self) -> list[str]:
        out = ["--num-blocks", str(self.num_blocks), "--block-size", "16", "--max-num-seqs", str(self.max_num_seqs),
               "--max-num-batched-tokens", str(self.max_num_batched_tokens), "--max-model-len", "8192",
               "--policy", self.policy]
        if self.threshold:
            out += ["--long-prefill-token-threshold", str(self.threshold)]
        if self.caching:
            out.append("--enable-prefix-caching")
        if not self.chunked:
            out.append("--no-chunked-prefill")
        return out + list(self.extra)

    def import_args(self) -> list[str]:
        """The same configuration as `batchcheck import vllm` arguments."""
        out = ["--max-model-len", "8192", "--num-gpu-blocks-override", str(self.num_blocks), "--block-size", "16",
               "--max-num-seqs", str(self.max_num_seqs), "--max-num-batched-tokens", str(self.max_num_batched_tokens),
               "--scheduling-policy", self.policy,
               "--enable-prefix-caching" if self.caching else "--no-enable-prefix-caching",
               "--no-async-scheduling"]  # the shared driver steps the synchronous Scheduler
        if self.threshold:
            out += ["--long-prefill-token-threshold", str(self.threshold)]
        if not self.chunked:
            out.append("--no-enable-chunked-prefill")
        return out


CASES = [
    Case("fcfs_unique_off", "fcfs", False, "unique", 160, 300),
    Case("fcfs_unique_on", "fcfs", True, "unique", 160, 300),
    Case("priority_threshold_off", "priority", False, "system_prompts", 160, 400, threshold=256, seed=1),
    Case("priority_threshold_on", "priority", True, "system_prompts", 160, 400, threshold=256, seed=1),
    Case("fcfs_system_prompts_on", "fcfs", True, "system_prompts", 200, 400, seed=2),
    Case("fcfs_groups_on", "fcfs", True, "prefix_groups", 200, 300, seed=3),
    Case("pressure_off", "fcfs", False, "unique", 160, 120, seed=4, gap=0.6),
    Case("pressure_on", "fcfs", True, "system_prompts", 200, 120, seed=4, gap=0.6),
    Case("priority_pressure_on", "priority", True, "sessions", 200, 150, seed=5, gap=0.6),
    Case("aborts_off", "priority", False, "unique", 160, 200, aborts=0.2, seed=6),
    Case("aborts_on", "fcfs", True, "system_prompts", 200, 200, aborts=0.2, seed=7),
    Case("sessions_on", "fcfs", True, "sessions", 200, 300, threshold=128, seed=8),
    Case("no_chunking_on", "fcfs", True, "system_prompts", 160, 300, chunked=False, max_num_batched_tokens=8192,
         seed=9),
]

HASH_BLOCK = 64  # tokens per hash id in the generated traces (a multiple of the block size)


def make_trace(case: Case) -> list[dict]:
    """A seeded trace of the case's shape, in the harness's input format."""
    rng = random.Random(case.seed)
    rows: list[dict] = []
    step = 0.0
    next_id = 10_000  # hash ids of request-own blocks
    systems = [[100 * g + j for j in range(rng.randint(2, 6))] for g in range(6)]  # six system prompts
    sessions: dict[int, list[int]] = {}
    for i in range(case.requests):
        step += rng.expovariate(1.0 / case.gap)
        prompt = rng.randint(40, 700)
        output = rng.randint(4, 80)
        row: dict = {"id": f"r{i}", "arrival_step": int(step), "prompt_tokens": prompt, "output_tokens": output}
        if case.policy == "priority":
            row["priority"] = rng.randint(0, 3)
        if case.shape == "system_prompts":
            sys_ids = systems[rng.randrange(len(systems))]
            user = rng.randint(1, 600)
            own = -(-user // HASH_BLOCK)
            ids = sys_ids + list(range(next_id, next_id + own))
            next_id += own
            row.update(prompt_tokens=len(sys_ids) * HASH_BLOCK + user, hash_ids=ids, hash_block_tokens=HASH_BLOCK)
        elif case.shape == "sessions":
            s = rng.randrange(12)
            prev = sessions.get(s, [])
            new = rng.randint(1, 4)
            ids = prev + list(range(next_id, next_id + new))
            next_id += new
            if len(ids) * HASH_BLOCK > case.num_blocks * 16 // 3:  # the conversation starts over (fits the pool)
                ids = ids[-new:]
            sessions[s] = ids
            row.update(prompt_tokens=len(ids) * HASH_BLOCK - rng.randint(0, HASH_BLOCK - 1), hash_ids=ids,
                       hash_block_tokens=HASH_BLOCK)
        elif case.shape == "prefix_groups":
            row["prefix_group"] = rng.randrange(4)
        if case.aborts and rng.random() < case.aborts:
            row["abort_step"] = int(step) + rng.randint(0, 30)
        rows.append(row)
    return rows


@dataclass
class CaseResult:
    case: Case
    conformance: Conformance
    preemptions: int
    steps: int
    free_blocks_agree: int  # steps whose free-block count (cached free blocks included) the engine matches


def drive(jobs: list[tuple[Path, list[str], Path]]) -> None:
    """Run the harness on each (trace, flags, log) in one process."""
    python = harness_python()
    if python is None:
        raise RuntimeError("the vLLM harness venv is absent")
    script = ("import json, sys; sys.path.insert(0, %r); import drive_vllm_scheduler as d\n"
              "for trace, flags, out in json.load(open(sys.argv[1])):\n"
              "    d.main([trace, *flags, '--out', out])\n") % str(HARNESS.parent)
    with tempfile.TemporaryDirectory() as tmp:
        spec = Path(tmp) / "jobs.json"
        spec.write_text(json.dumps([[str(t), f, str(o)] for t, f, o in jobs]))
        env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu"}
        subprocess.run([str(python), "-c", script, str(spec)], check=True, env=env, capture_output=True,
                       timeout=3600)


def prepare(case: Case, folder: Path) -> tuple[Path, Path, Path]:
    trace, log, policy = folder / f"{case.name}.trace.json", folder / f"{case.name}.log.jsonl", folder / f"{case.name}.yaml"
    trace.write_text(json.dumps(make_trace(case), indent=0))
    policy.write_text(import_policy("vllm", case.import_args(), name=case.name).text)
    return trace, log, policy


def compare(case: Case, trace: Path, log: Path, policy_path: Path) -> CaseResult:
    from checker.loading import load_model

    policy = load_model(Policy, policy_path)
    arrivals = load_arrivals(trace)
    steps = list(load_log(log, arrivals))
    conf = conformance(policy, arrivals, steps)
    return CaseResult(case, conf, sum(len(s.preempted) for s in steps), len(steps), conf.free_blocks_agreeing)


def run_cases(cases: list[Case], keep: Path | None = None) -> list[CaseResult]:
    with tempfile.TemporaryDirectory() as tmp:
        folder = keep or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        prepared = [prepare(c, folder) for c in cases]
        drive([(trace, c.flags(), log) for c, (trace, log, _) in zip(cases, prepared)])
        return [compare(c, *paths) for c, paths in zip(cases, prepared)]


def run_case(case: Case, keep: Path | None = None) -> CaseResult:
    return run_cases([case], keep)[0]
