"""The real vLLM 0.33 scheduler with speculative decoding, from our side (pytest, bench): no vLLM import here.

tests/vllm_spec_driver.py runs inside the vLLM venv and drives the real Scheduler with a SpeculativeConfig and a
fake drafter/verifier (docs/speculative.md). This module names the cases (trace shape + driver flags), runs the
driver on several cases in one venv process (the vLLM import takes ~30 s), turns the driver's flags into
`batchcheck import vllm` arguments, and compares a log with the engine as `check-log --conformance` does.
Used by tests/conformance/test_vllm_spec_conformance.py and bench/vllm_spec_matrix.py.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import tempfile
from pathlib import Path

from tests.connector_logs import import_args as connector_import_args
from tests.vllm_connector_harness import absent_reason, read_log, venv_python, write_trace

HERE = Path(__file__).resolve().parent
KEPT = HERE / "data" / "vllm_spec"
METHOD_NAMES = {"ngram": "ngram", "draft_model": "draft_model", "eagle": "eagle"}

Trace = list[dict]
Job = tuple[Trace, list[str]]

__all__ = ["absent_reason", "venv_python", "read_log", "cases", "run_jobs", "import_args", "compare", "KEPT"]


def trace(n: int, seed: int, gap: float = 1.0, prompt: tuple[int, int] = (40, 500), output: tuple[int, int] = (4, 80),
          priority: bool = False, aborts: float = 0.0) -> Trace:
    rng = random.Random(seed)
    rows, step = [], 0.0
    for i in range(n):
        step += rng.expovariate(1.0 / gap)
        row = {"id": f"s{i}", "arrival_step": int(step), "prompt_tokens": rng.randint(*prompt),
               "output_tokens": rng.randint(*output), "accept_rate": rng.choice([0.0, 0.3, 0.6, 0.9, 1.0])}
        if priority:
            row["priority"] = rng.randint(0, 3)
        if aborts and rng.random() < aborts:
            row["abort_step"] = int(step) + rng.randint(0, 30)
        rows.append(row)
    return rows


def flags(method: str, k: int, num_blocks: int, max_num_seqs: int = 8, max_num_batched_tokens: int = 256,
          seed: int = 0, extra: tuple[str, ...] = ()) -> list[str]:
    return ["--num-blocks", str(num_blocks), "--block-size", "16", "--max-num-seqs", str(max_num_seqs),
            "--max-num-batched-tokens", str(max_num_batched_tokens), "--max-model-len", "8192",
            "--spec-method", method, "--num-speculative-tokens", str(k), "--seed", str(seed), *extra]


def cases() -> dict[str, Job]:
    """The matrix: every method, k from 1 to 5, roomy pools and KV pressure (preemptions), priority, aborts."""
    return {
        "ngram_k3_roomy": (trace(160, 1, gap=3.5), flags("ngram", 3, 400, seed=1)),
        "ngram_k4_pressure": (trace(200, 2, gap=0.6), flags("ngram", 4, 90, seed=2)),
        "eagle_k2_pressure": (trace(200, 3, gap=0.6), flags("eagle", 2, 100, seed=3)),
        "eagle_k5_priority": (trace(200, 4, gap=0.7, priority=True), flags("eagle", 5, 120, seed=4,
                                                                          extra=("--policy", "priority"))),
        "draft_k3_pressure": (trace(200, 5, gap=0.6, aborts=0.1), flags("draft_model", 3, 90, seed=5)),
        "draft_k1_budget": (trace(160, 6, gap=3.2), flags("draft_model", 1, 300, max_num_seqs=12,
                                                          max_num_batched_tokens=128, seed=6)),
    }


_MANY = """import importlib, json, sys
sys.path.insert(0, sys.argv[2])
d = importlib.import_module(sys.argv[3])
for trace, flags, out in json.load(open(sys.argv[1])):
    d.main([trace, *flags, "--out", out])
"""


def run_jobs(jobs: dict[str, Job], keep: Path | None = None, timeout: float = 3600,
             driver: str = "vllm_spec_driver") -> dict[str, list[dict]]:
    """Each named (trace, flags) through the driver (a module of tests/: this speculative one, or the async one) in
    one venv process; the logs by name (trace and log files kept in `keep` when given)."""
    python = venv_python()
    if python is None:
        raise RuntimeError(absent_reason())
    with tempfile.TemporaryDirectory() as tmp:
        folder = keep or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        files = {name: (write_trace(rows, folder / f"{name}.trace.json"), fl, folder / f"{name}.log.jsonl")
                 for name, (rows, fl) in jobs.items()}
        spec = Path(tmp) / "jobs.json"
        spec.write_text(json.dumps([[str(t), list(f), str(o)] for t, f, o in files.values()]))
        env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu"}
        done = subprocess.run([str(python), "-c", _MANY, str(spec), str(HERE), driver], env=env,
                              capture_output=True, text=True, timeout=timeout)
        if done.returncode != 0:
            raise RuntimeError(f"{driver} failed (exit {done.returncode}):\n{done.stderr[-4000:]}")
        return {name: read_log(log) for name, (_, _, log) in files.items()}


SPEC_FLAGS = ("--spec-method", "--num-speculative-tokens", "--seed", "--accept-rate")


def import_args(fl: list[str]) -> list[str]:
    """The driver's flags as `batchcheck import vllm` arguments (the same configuration): the shared driver's flags
    as tests/connector_logs.py maps them, and the speculative config (the seed and acceptance rate are the
    environment's, recorded in the log)."""
    given: dict[str, str] = {}
    rest, i = [], 0
    while i < len(fl):
        if fl[i] in SPEC_FLAGS:
            given[fl[i]] = fl[i + 1]
            i += 2
        else:
            rest.append(fl[i])
            i += 1
    out = connector_import_args(rest)
    if "--spec-method" in given:
        out += ["--speculative-config", json.dumps({"method": given["--spec-method"],
                                                    "num_speculative_tokens": int(given["--num-speculative-tokens"])})]
    return out


def compare(rows: Trace, fl: list[str], log: Path, name: str, folder: Path, importer=None):
    """The engine under the imported policy against the log (check-log --conformance's reference path); the import
    arguments from the driver's flags by ``importer`` (default: import_args)."""
    from checker.checklog import conformance, load_arrivals, load_log
    from checker.importers import import_policy

    path = folder / f"{name}.trace.json"
    if not path.exists():
        path.write_text(json.dumps(rows))
    arrivals = load_arrivals(path)
    policy = import_policy("vllm", (importer or import_args)(fl), name=name).policy
    return conformance(policy, arrivals, load_log(log, arrivals))
