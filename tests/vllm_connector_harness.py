"""The real vLLM 0.33 scheduler with KV-connector states, from our side (pytest, bench): no vLLM import here.

tests/vllm_connector_driver.py runs inside the vLLM venv and drives the real Scheduler with a fake KV connector
(docs/connector-harness.md). This module finds the venv, writes traces, runs the driver (several traces in one
process: the vLLM import takes ~30 s) and reads the logs back, and generates a few trace shapes.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
DRIVER = HERE / "vllm_connector_driver.py"
SHARED_DRIVER_DIR = HERE.parent.parent / "shared" / "tools" / "vllm-scheduler"
DEFAULT_VENV = Path.home() / ".cache" / "vllm-scheduler" / "venv"

Trace = list[dict]
Job = tuple[Trace, list[str]]  # a trace and the driver's flags (no trace path, no --out)


def venv_python() -> Path | None:
    """The vLLM venv's python (env BATCHCHECK_VLLM_VENV, default ~/.cache/vllm-scheduler/venv), or None when the
    venv or the shared driver is absent."""
    venv = Path(os.environ.get("BATCHCHECK_VLLM_VENV", DEFAULT_VENV)).expanduser()
    python = venv / "bin" / "python"
    if not python.exists() or not (SHARED_DRIVER_DIR / "drive_vllm_scheduler.py").exists():
        return None
    return python


def absent_reason() -> str | None:
    """Why the driver cannot run here (for pytest.skip), or None when it can."""
    if venv_python() is not None:
        return None
    venv = os.environ.get("BATCHCHECK_VLLM_VENV", str(DEFAULT_VENV))
    return (f"the vLLM 0.33 venv is absent ({venv}/bin/python, or {SHARED_DRIVER_DIR}/drive_vllm_scheduler.py); "
            "build it with shared/tools/vllm-scheduler/setup.sh or point BATCHCHECK_VLLM_VENV at one")


def write_trace(rows: Trace, path: Path) -> Path:
    path.write_text(json.dumps(rows, indent=0))
    return path


def read_log(path: Path) -> list[dict]:
    """The driver's log: one dict a step."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


_MANY = """import json, sys
sys.path.insert(0, sys.argv[2])
import vllm_connector_driver as d
for trace, flags, out in json.load(open(sys.argv[1])):
    d.main([trace, *flags, "--out", out])
"""


def run_files(jobs: list[tuple[Path, list[str], Path]], timeout: float = 3600) -> None:
    """Run the driver on each (trace file, flags, log file), all in one venv process."""
    python = venv_python()
    if python is None:
        raise RuntimeError(absent_reason())
    with tempfile.TemporaryDirectory() as tmp:
        spec = Path(tmp) / "jobs.json"
        spec.write_text(json.dumps([[str(t), list(f), str(o)] for t, f, o in jobs]))
        env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu"}
        done = subprocess.run([str(python), "-c", _MANY, str(spec), str(HERE)], env=env, capture_output=True,
                              text=True, timeout=timeout)
        if done.returncode != 0:
            raise RuntimeError(f"the connector driver failed (exit {done.returncode}):\n{done.stderr[-4000:]}")


def run_jobs(jobs: dict[str, Job], keep: Path | None = None) -> dict[str, list[dict]]:
    """Each named (trace, flags) through the driver in one process; the logs by name."""
    with tempfile.TemporaryDirectory() as tmp:
        folder = keep or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        files = {name: (write_trace(rows, folder / f"{name}.trace.json"), flags, folder / f"{name}.log.jsonl")
                 for name, (rows, flags) in jobs.items()}
        run_files(list(files.values()))
        return {name: read_log(log) for name, (_, _, log) in files.items()}


def flags(*extra: str, num_blocks: int = 64, max_num_seqs: int = 8, max_num_batched_tokens: int = 256,
          role: str | None = "consumer") -> list[str]:
    """The driver's flags: a 16-token block, the given pool and limits, --kv-role role (None: no connector)."""
    out = ["--num-blocks", str(num_blocks), "--block-size", "16", "--max-num-seqs", str(max_num_seqs),
           "--max-num-batched-tokens", str(max_num_batched_tokens), "--max-model-len", "8192", "--max-steps", "2000"]
    if role:
        out += ["--kv-role", role]
    return out + list(extra)


# ---- trace shapes ----

def loads_with_latencies(n: int = 8, seed: int = 0) -> Job:
    """n requests, each loading part or all of its prompt remotely, with load latencies of 1 to 4 steps."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        prompt = rng.randint(40, 300)
        rows.append({"id": f"l{i}", "arrival_step": i // 2, "prompt_tokens": prompt, "output_tokens": rng.randint(2, 8),
                     "external_tokens": rng.choice([prompt, prompt // 2, 16 * (prompt // 32)]),
                     "load_steps": 1 + i % 4})
    return rows, flags()


def hung_load() -> Job:
    """One load that is never reported, beside a plain request: its blocks stay taken for good."""
    rows = [{"id": "h", "arrival_step": 0, "prompt_tokens": 96, "output_tokens": 4, "external_tokens": 64,
             "load_steps": None},
            {"id": "p", "arrival_step": 0, "prompt_tokens": 40, "output_tokens": 4}]
    return rows, flags()


def abort_during_load() -> Job:
    """Aborts in each load state: before the recv is reported (a), after it is reported but before the
    promotion (b), and a hung load aborted (c)."""
    rows = [{"id": "a", "arrival_step": 0, "prompt_tokens": 64, "output_tokens": 4, "external_tokens": 64,
             "load_steps": 4, "abort_step": 1},
            {"id": "b", "arrival_step": 0, "prompt_tokens": 64, "output_tokens": 4, "external_tokens": 64,
             "load_steps": 1, "abort_step": 1},
            {"id": "c", "arrival_step": 0, "prompt_tokens": 64, "output_tokens": 4, "external_tokens": 64,
             "load_steps": None, "abort_step": 2}]
    return rows, flags()


def pressure_with_loads(n: int = 40, num_blocks: int = 60, seed: int = 1) -> Job:
    """A small pool, loads and plain requests mixed, arrivals faster than service: preemptions, blocked loads."""
    rng = random.Random(seed)
    rows, step = [], 0.0
    for i in range(n):
        step += rng.expovariate(1.5)
        prompt = rng.randint(32, 320)
        row = {"id": f"r{i}", "arrival_step": int(step), "prompt_tokens": prompt, "output_tokens": rng.randint(4, 40)}
        if rng.random() < 0.5:
            row.update(external_tokens=rng.randint(1, prompt), load_steps=rng.randint(1, 4))
        rows.append(row)
    return rows, flags(num_blocks=num_blocks, max_num_seqs=6, max_num_batched_tokens=192)


def producer_sends(send_steps: tuple = (0, 1, 3, None)) -> Job:
    """A prefill node: each request's blocks stay pinned after it finishes until its send is reported."""
    rows = [{"id": f"s{i}", "arrival_step": i, "prompt_tokens": 48, "output_tokens": 2, "send_steps": s}
            for i, s in enumerate(send_steps)]
    return rows, flags(role="producer")


SHAPES = {"latencies": loads_with_latencies, "hung": hung_load, "abort_during_load": abort_during_load,
          "pressure": pressure_with_loads, "producer": producer_sends}
