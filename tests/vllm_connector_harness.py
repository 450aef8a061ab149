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
for trace, flags, out, shared in json.load(open(sys.argv[1])):
    argv = [trace, *flags, "--out", out]
    d.load_shared(None).main(argv) if shared else d.main(argv)
"""


def run_files(jobs: list[tuple[Path, list[str], Path]], timeout: float = 3600, shared: frozenset[int] = frozenset()
              ) -> None:
    """Run the driver on each (trace file, flags, log file), all in one venv process; the jobs whose index is in
    `shared` go through the shared driver (drive_vllm_scheduler.main) instead."""
    python = venv_python()
    if python is None:
        raise RuntimeError(absent_reason())
    with tempfile.TemporaryDirectory() as tmp:
        spec = Path(tmp) / "jobs.json"
        spec.write_text(json.dumps([[str(t), list(f), str(o), i in shared] for i, (t, f, o) in enumerate(jobs)]))
        env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu"}
        done = subprocess.run([str(python), "-c", _MANY, str(spec), str(HERE)], env=env, capture_output=True,
                              text=True, timeout=timeout)
        if done.returncode != 0:
            raise RuntimeError(f"the connector driver failed (exit {done.returncode}):\n{done.stderr[-4000:]}")


def run_jobs(jobs: dict[str, Job], keep: Path | None = None, shared: frozenset[str] = frozenset()
             ) -> dict[str, list[dict]]:
    """Each named (trace, flags) through the driver in one process (the names in `shared` through the shared
    driver); the logs by name."""
    with tempfile.TemporaryDirectory() as tmp:
        folder = keep or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        files = {name: (write_trace(rows, folder / f"{name}.trace.json"), flags, folder / f"{name}.log.jsonl")
                 for name, (rows, flags) in jobs.items()}
        run_files(list(files.values()), shared=frozenset(i for i, name in enumerate(files) if name in shared))
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


def grammars_and_failed_loads(n: int = 120, num_blocks: int = 80, seed: int = 0, grammar: float = 0.3,
                              fails: float = 0.3, extra: tuple[str, ...] = (), role: str | None = "consumer",
                              aborts: bool = False, **limits) -> Job:
    """pressure_with_loads' shape, with structured-output requests whose grammar compiles 1-6 steps (a share
    ``grammar``) and loads that fail (a share ``fails`` of the loads); every 7th request aborted with ``aborts``."""
    rows, _ = pressure_with_loads(n=n, num_blocks=num_blocks, seed=seed)
    rng = random.Random(1000 + seed)
    for i, row in enumerate(rows):
        if rng.random() < grammar:
            row["grammar_steps"] = rng.randint(1, 6)
        if "external_tokens" in row and rng.random() < fails:
            row["load_fails"] = True
        if aborts and i % 7 == 3:
            row["abort_step"] = row["arrival_step"] + i % 5
        if role is None:
            row.pop("external_tokens", None), row.pop("load_steps", None), row.pop("load_fails", None)
    return rows, flags(*extra, num_blocks=num_blocks, role=role, **{"max_num_seqs": 6, "max_num_batched_tokens": 192,
                                                                    **limits})


SHAPES = {"latencies": loads_with_latencies, "hung": hung_load, "abort_during_load": abort_during_load,
          "pressure": pressure_with_loads, "producer": producer_sends}


# ---- the small cases docs/connector-harness.md's rules were read from (tests/conformance/test_vllm_connector_driver.py
# pins them; tests/data/vllm_connector/ keeps their logs) ----

def _r(rid: str, arrival: int, prompt: int, output: int, **fields) -> dict:
    return {"id": rid, "arrival_step": arrival, "prompt_tokens": prompt, "output_tokens": output, **fields}


_POOL40 = {"num_blocks": 41, "max_num_batched_tokens": 512}  # 40 usable blocks of 16 tokens

FACT_CASES: dict[str, Job] = {
    # a partial load (64 of 100 tokens, 2 steps) and a full-prompt load (64 of 64, not block aligned: 50 of 100)
    "latency": ([_r("a", 0, 64, 3, external_tokens=64, load_steps=2),
                 _r("b", 0, 100, 3, external_tokens=50, load_steps=1),
                 _r("c", 0, 100, 3, external_tokens=64, load_steps=3)], flags()),
    "hung": hung_load(),
    "abort_during_load": abort_during_load(),
    # a promoted holder that does not fit stops the waiting pass: D (1 block) waits behind it
    "holder_blocks": ([_r("A", 0, 400, 4, external_tokens=64, load_steps=3), _r("C", 1, 320, 10), _r("D", 3, 16, 2)],
                      flags(**_POOL40)),
    "holder_aborted": ([_r("A", 0, 400, 4, external_tokens=64, load_steps=3, abort_step=5), _r("C", 1, 320, 10),
                        _r("D", 3, 16, 2)], flags(**_POOL40)),
    # holders are scanned before waiting requests, whatever their priority
    "holder_first": ([_r("a", 0, 64, 3, priority=1, external_tokens=64, load_steps=1), _r("b", 1, 32, 3, priority=0)],
                     flags("--policy", "priority", max_num_seqs=1)),
    # L1 holds 4 blocks and reserves the 21 more its 400-token prompt needs; L2's load of 16 blocks does not fit
    # 36 - 21 = 15, and P (plain, behind L2) is not reached
    "reserved": ([_r("L1", 0, 400, 2, external_tokens=64, load_steps=5),
                  _r("L2", 1, 256, 2, external_tokens=256, load_steps=1), _r("P", 1, 16, 2)], flags(**_POOL40)),
    "reserved_edge": ([_r("L1", 0, 400, 2, external_tokens=64, load_steps=5),
                       _r("L2", 1, 240, 2, external_tokens=240, load_steps=1)], flags(**_POOL40)),
    "reserved_plain": ([_r("L1", 0, 400, 2, external_tokens=64, load_steps=5), _r("L2", 1, 256, 2)], flags(**_POOL40)),
    "reserved_first_query": ([_r("L1", 0, 400, 2, external_tokens=64, load_steps=5),
                              _r("L2", 1, 256, 2, external_tokens=256, load_steps=1), _r("P", 1, 16, 2)],
                             flags("--external-query", "first", **_POOL40)),
    # a running chunked prefill reserves its remaining blocks against loads too
    "reserved_by_chunk": ([_r("R", 0, 600, 2), _r("L", 1, 256, 2, external_tokens=256, load_steps=1)],
                          flags(num_blocks=51, max_num_batched_tokens=128)),
    # a load's first test is the full prompt's fit (scheduler_reserve_full_isl), not only its own blocks
    "load_full_fit": ([_r("R", 0, 320, 12), _r("L", 1, 400, 2, external_tokens=64, load_steps=1)], flags(**_POOL40)),
    "load_full_fit_off": ([_r("R", 0, 320, 12), _r("L", 1, 400, 2, external_tokens=64, load_steps=1)],
                          flags("--no-reserve-full-isl", **_POOL40)),
    "seqs": ([_r(f"l{i}", 0, 64, 3, external_tokens=64, load_steps=2) for i in range(4)], flags(max_num_seqs=2)),
    "seqs_full": ([_r("r", 0, 32, 6), _r("l", 1, 64, 3, external_tokens=64, load_steps=1)], flags(max_num_seqs=1)),
    "budget": ([_r("r", 0, 64, 3), _r("l", 0, 64, 3, external_tokens=64, load_steps=1)],
               flags(max_num_batched_tokens=64)),
    "watermark": ([_r("r", 0, 320, 30), _r("l", 1, 272, 3, external_tokens=272, load_steps=1)],
                  flags("--watermark", "0.1", **_POOL40)),
    "no_watermark": ([_r("r", 0, 320, 30), _r("l", 1, 272, 3, external_tokens=272, load_steps=1)], flags(**_POOL40)),
    "preempted_after_load": ([_r("r", 0, 90, 8), _r("l", 0, 64, 8, external_tokens=64, load_steps=1)],
                             flags(num_blocks=11)),
    "hung_deadlock": ([_r("h", 0, 64, 2, external_tokens=64, load_steps=None), _r("r", 0, 90, 10)],
                      flags("--max-steps", "12", num_blocks=11)),
    "threshold": ([_r("a", 0, 200, 2, external_tokens=64, load_steps=1), _r("b", 0, 16, 4)],
                  flags("--long-prefill-token-threshold", "50")),
    "threshold_alone": ([_r("a", 0, 200, 2, external_tokens=64, load_steps=1)],
                        flags("--long-prefill-token-threshold", "50")),
    "prefix_cache": ([_r("a", 0, 128, 2, prefix_group=0),
                      _r("b", 4, 128, 2, prefix_group=0, external_tokens=128, load_steps=1)],
                     flags("--enable-prefix-caching")),
    "producer": producer_sends(),
    # a pinned request's blocks stay in the prefix cache: b hits a's 4 pinned blocks
    "pinned_shared": ([_r("a", 0, 64, 2, prefix_group=0, send_steps=None), _r("b", 4, 96, 2, prefix_group=0)],
                      flags("--enable-prefix-caching", role="producer")),
    "producer_ignores_loads": ([_r("a", 0, 64, 2, external_tokens=64)], flags(role="producer")),
    "both": ([_r("a", 0, 64, 2, external_tokens=64, load_steps=2, send_steps=1), _r("b", 0, 32, 2, abort_step=1)],
             flags(role="both")),
}

FIXTURES = HERE / "data" / "vllm_connector"

# Blocked waiting states (grammar futures) and failed loads (failed_recving), kept in tests/data/vllm_blocked/
# (tests/conformance/test_blocked_conformance.py compares the engine with each)
BLOCKED_CASES: dict[str, Job] = {
    # G's grammar compiles 3 steps: P, behind it, is admitted first; G keeps its place and runs from step 3
    "grammar_skip": ([_r("G", 0, 64, 3, grammar_steps=3), _r("P", 0, 64, 3), _r("Q", 1, 32, 2)], flags(role=None)),
    # two blocked requests at the head, a priority queue: the skipped ones keep their order
    "grammar_priority": ([_r("G1", 0, 64, 3, priority=0, grammar_steps=2), _r("G2", 0, 48, 3, priority=1, grammar_steps=1),
                          _r("P", 1, 32, 3, priority=2)], flags("--policy", "priority", role=None)),
    # a blocked request aborted before its grammar is ready; one ready in its arrival step's next step
    "grammar_abort": ([_r("G", 0, 64, 3, grammar_steps=4, abort_step=2), _r("H", 0, 64, 2, grammar_steps=1),
                       _r("P", 1, 32, 2)], flags(role=None)),
    # blocked requests do not take seats: P fills max_num_seqs=1 while G waits
    "grammar_seats": ([_r("G", 0, 64, 3, grammar_steps=2), _r("P", 0, 32, 6)], flags(max_num_seqs=1, role=None)),
    # a grammar request that also loads
    "grammar_load": ([_r("G", 0, 64, 3, grammar_steps=2, external_tokens=64, load_steps=2), _r("P", 0, 32, 2)],
                     flags()),
    # a load that fails (kv_load_failure_policy fail, vLLM's default): FINISHED_ERROR at its report, blocks freed
    "load_fail": ([_r("F", 0, 96, 3, external_tokens=64, load_steps=2, load_fails=True), _r("P", 0, 32, 3),
                   _r("L", 1, 64, 2, external_tokens=64, load_steps=1)], flags()),
    # the same under recompute: F's blocks are freed at its promotion and it is prefilled from scratch
    "load_fail_recompute": ([_r("F", 0, 96, 3, external_tokens=64, load_steps=2, load_fails=True), _r("P", 0, 32, 3),
                             _r("L", 1, 64, 2, external_tokens=64, load_steps=1)],
                            flags("--kv-load-failure-policy", "recompute")),
    # recompute with a local prefix hit: the hit is dropped with the failed load, looked up again at the retry
    "load_fail_recompute_cached": ([_r("a", 0, 64, 2, prefix_group=0),
                                    _r("F", 4, 128, 2, prefix_group=0, external_tokens=128, load_steps=1,
                                       load_fails=True)],
                                   flags("--enable-prefix-caching", "--kv-load-failure-policy", "recompute")),
    # recompute, and F does not fit once its failed load is freed: it stays at the head of the holders' queue
    "load_fail_recompute_blocked": ([_r("R", 0, 500, 12), _r("F", 0, 160, 2, external_tokens=64, load_steps=3,
                                                              load_fails=True), _r("D", 3, 16, 2)],
                                    flags("--kv-load-failure-policy", "recompute", "--no-reserve-full-isl", **_POOL40)),
    # recompute, re-admitted in chunks (a 64-token budget): its first chunk needs fewer blocks than the load held
    "load_fail_recompute_chunk": ([_r("F", 0, 160, 2, external_tokens=160, load_steps=2, load_fails=True),
                                   _r("P", 1, 16, 2)],
                                  flags("--kv-load-failure-policy", "recompute", max_num_batched_tokens=64)),
    # a failing load aborted before its report (its blocks wait for the report), and one failing under pressure
    "load_fail_abort": ([_r("F", 0, 64, 3, external_tokens=64, load_steps=3, load_fails=True, abort_step=1),
                         _r("G", 0, 64, 3, external_tokens=64, load_steps=1, load_fails=True), _r("P", 1, 32, 2)],
                        flags()),
}
BLOCKED_FIXTURES = HERE / "data" / "vllm_blocked"


def record(folder: Path = FIXTURES, cases: dict[str, Job] | None = None) -> dict[str, list[dict]]:
    """Run the cases (FACT_CASES by default) and keep their logs as folder/NAME.log.jsonl (the traces are the cases
    themselves). The blocked ones: record(BLOCKED_FIXTURES, BLOCKED_CASES)."""
    folder.mkdir(parents=True, exist_ok=True)
    logs = run_jobs(FACT_CASES if cases is None else cases)
    for name, log in logs.items():
        (folder / f"{name}.log.jsonl").write_text("".join(json.dumps(row) + "\n" for row in log))
    return logs


def recorded(name: str, folder: Path = FIXTURES) -> list[dict]:
    return read_log(folder / f"{name}.log.jsonl")
