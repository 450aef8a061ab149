"""Benchmark: engine replay speed with prefix caching and calibrated profiles (docs/benchmarks.md, "Trace
replay with prefix caching and calibrated profiles").

    python bench/replay_speed.py [--repeat N] [--only NAME ...] [--vs DIR] [--profile-out DIR]

Cases (seconds are the engine alone, ``checker.engine.simulate`` on a loaded RequestSet, in this process;
min and median of --repeat runs):

- ``azure``, ``azure-cache``: the whole Azure conversation trace (19,366 requests) through
  spec/policies/vllm_v1.yaml, and through spec/policies/prefix_caching/vllm_v1.yaml (the cache on; the
  trace has no shared prefixes, only preempted requests find their own blocks again);
- ``azure-a100``, ``azure-a100-cache``: the same with the calibrated profile
  spec/profiles/a100-llama-2-70b-tp2.json;
- ``mooncake``: a generated Mooncake-shaped conversation trace (see ``make_mooncake``) with real hash ids
  through the caching policy with the pool and context of an 80 GB GPU (MOONCAKE_SET).

The Azure cases need ../shared/data/traces/azure_conv_2023.csv and are skipped without it. The Mooncake
trace is generated into a temporary folder (``--write-mooncake FILE`` writes it out instead, to replay it
with ``batchcheck simulate POLICY --trace FILE``); it is never checked in.

``--vs DIR`` compares two trees side by side: each run is a fresh process importing ``checker`` from this
tree (A) or from DIR (B, e.g. a ``git worktree`` of the commit before), alternating A B A B, so that a
drift in the machine's speed hits both. The load average is printed with each case.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
AZURE = ROOT.parent / "shared" / "data" / "traces" / "azure_conv_2023.csv"
POLICIES = ROOT / "spec" / "policies"
A100 = ROOT / "spec" / "profiles" / "a100-llama-2-70b-tp2.json"
# The Mooncake replay's policy: the shipped caching policy (vLLM 0.33 defaults) with the context of a 128k
# model and the pool of an 80 GB GPU under the default profile's 8B-shaped model (80 GB - 16 GB of weights
# = 64 GB / 128 KiB per token = 500,000 tokens, about 31,000 blocks of 16): the shipped pool (2,500 blocks,
# 40,000 tokens) cannot hold the trace's longest prompts, and vLLM never rejects a request that cannot fit
# (it would sit at the head of the queue for ever).
MOONCAKE_SET = ["max_model_len=131072", "kv.num_blocks=31000"]

CASES = {  # name: (policy, profile, trace kind)
    "azure": (POLICIES / "vllm_v1.yaml", None, "azure"),
    "azure-cache": (POLICIES / "prefix_caching" / "vllm_v1.yaml", None, "azure"),
    "azure-a100": (POLICIES / "vllm_v1.yaml", A100, "azure"),
    "azure-a100-cache": (POLICIES / "prefix_caching" / "vllm_v1.yaml", A100, "azure"),
    "mooncake": (POLICIES / "prefix_caching" / "vllm_v1.yaml", None, "mooncake"),
}


# ----------------------------------------------------------------------------------------- the Mooncake trace
HASH_BLOCK = 512  # Mooncake hashes 512-token blocks


def _lognormal(rng: random.Random, median: float, sigma: float, lo: int, hi: int) -> int:
    return max(lo, min(hi, round(rng.lognormvariate(0.0, sigma) * median)))


def make_mooncake(path: Path, seed: int = 0, requests: int = 12_031, duration_ms: int = 3_600_000) -> dict:
    """Write a Mooncake-shaped conversation trace (JSON lines: timestamp ms, input_length, output_length,
    hash_ids) and return its statistics. What is assumed, aiming at the published conversation trace
    (12,031 requests over one hour, mean input about 12,000 tokens, mean output about 340):

    - sessions start as a Poisson stream over the hour; a session has 1 + Geometric turns (mean 1.6 turns;
      turns that would arrive after the hour are dropped), so that about 40 % of all prompt blocks were
      seen before, the cache ratio we assume for the real trace;
    - a session's first prompt is one of 40 shared system prompts (1-4 hash blocks, Zipf-like popularity)
      followed by the user's own text (log-normal, median 6,100 tokens, sigma 1.0: pasted documents);
    - turn k+1's prompt is turn k's prompt, turn k's answer and a new user message (log-normal, median
      250 tokens), so its hash_ids are turn k's full 512-token blocks followed by new ids (turn k's last,
      partial block changes when it is extended, so it gets a new id);
    - the next turn arrives after a think time (exponential, mean 60 s, at least 5 s) plus a rough
      response time (20 ms per output token);
    - outputs are log-normal (median 250, sigma 0.8, 1-4,096 tokens); prompts are at most 120,000 tokens
      (a session that would grow past that ends).

    hash ids are consecutive integers in order of first use, one per 512 tokens covering the prompt
    (ceil(input_length / 512) of them), as in the published files."""
    rng = random.Random(seed)
    next_id = 0
    systems = []
    for _ in range(40):
        n = rng.randint(1, 4)
        systems.append(list(range(next_id, next_id + n)))
        next_id += n
    weights = [1.0 / (i + 1) for i in range(len(systems))]
    rows: list[tuple[int, int, int, list[int]]] = []
    session_rate = requests / 1.6 / duration_ms  # sessions per ms, so that their turns total about ``requests``
    t = 0.0
    while len(rows) < requests:
        t += rng.expovariate(session_rate)
        if t >= duration_ms:
            t = rng.uniform(0, duration_ms)  # fill up: more sessions over the same hour
        system = rng.choices(systems, weights)[0]
        ids = list(system)
        length = HASH_BLOCK * len(ids) + _lognormal(rng, 6100, 1.0, 16, 100_000)
        at = t
        while True:
            while len(ids) < -(-length // HASH_BLOCK):
                ids.append(next_id)
                next_id += 1
            output = _lognormal(rng, 250, 0.8, 1, 4096)
            rows.append((round(at), length, output, list(ids)))
            if len(rows) >= requests or rng.random() >= 0.375:  # 1 + Geometric(0.625): mean 1.6 turns
                break
            at += max(5000.0, rng.expovariate(1 / 60_000)) + 20.0 * output
            grown = length + output + _lognormal(rng, 250, 1.0, 1, 20_000)
            if at >= duration_ms or grown > 120_000:
                break
            ids = ids[: length // HASH_BLOCK]  # the full blocks stay; the partial last one changes
            length = grown
    rows.sort(key=lambda r: r[0])
    renumber: dict[int, int] = {}  # ids in order of first use in the file, as in the published traces
    reused = total = 0
    for _, _, _, ids in rows:
        reused += sum(1 for h in ids if h in renumber)
        total += len(ids)
        ids[:] = [renumber.setdefault(h, len(renumber)) for h in ids]
    with open(path, "w") as f:
        for at, length, output, ids in rows:
            f.write(json.dumps({"timestamp": at, "input_length": length, "output_length": output,
                                "hash_ids": ids}) + "\n")
    inputs = [r[1] for r in rows]
    return {"requests": len(rows), "duration_s": round(rows[-1][0] / 1000, 1),
            "mean_input": round(statistics.fmean(inputs)), "median_input": round(statistics.median(inputs)),
            "max_input": max(inputs), "mean_output": round(statistics.fmean(r[2] for r in rows)),
            "block_reuse": round(reused / total, 3), "hash_ids": len(renumber)}


# ----------------------------------------------------------------------------------------- one run
def run_case(name: str, repeat: int, mooncake: Path | None, profile_out: Path | None,
             limit: int | None = None) -> list[dict]:
    """Run one case ``repeat`` times in this process (checker imported from sys.path); one dict per run."""
    from checker.engine import simulate
    from checker.inputfiles import apply_overrides
    from checker.api import load_policy
    from checker.profile import load_profile
    from checker.traces import load_azure_csv, load_mooncake_jsonl

    policy_path, profile_path, kind = CASES[name]
    policy = load_policy(policy_path)
    if kind == "mooncake":
        policy = apply_overrides(policy, MOONCAKE_SET)
        requests = load_mooncake_jsonl(mooncake, limit=limit)
    else:
        requests = load_azure_csv(AZURE, limit=limit)
    profile = load_profile(profile_path)
    out = []
    for i in range(repeat):
        if profile_out is not None and i == 0:
            import cProfile

            prof = cProfile.Profile()
            prof.enable()
            result = simulate(policy, requests, profile)
            prof.disable()
            prof.dump_stats(str(profile_out / f"{name}.prof"))
        t0, c0 = time.perf_counter(), time.process_time()
        result = simulate(policy, requests, profile)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        o = result.summary()["overall"]
        out.append({"case": name, "wall_s": wall, "cpu_s": cpu, "steps": result.steps, "request_steps": result.request_steps,
                    "end_us": result.end_us, "preemptions": o["preemptions"],
                    "ttft_p50_ms": o["ttft_ms"]["p50"], "ttft_p99_ms": o["ttft_ms"]["p99"],
                    "stuck": len(result.stuck), "load": os.getloadavg()[0]})
    return out


def _child(tree: str, name: str, repeat: int, mooncake: str | None, limit: int | None) -> list[dict]:
    code = ("import sys, json; sys.path.insert(0, sys.argv[1]); sys.path.insert(1, sys.argv[2]);"
            "import replay_speed as b; from pathlib import Path;"
            "print(json.dumps(b.run_case(sys.argv[3], int(sys.argv[4]), Path(sys.argv[5]) if sys.argv[5] else None, None,"
            " int(sys.argv[6]) if sys.argv[6] else None)))")
    done = subprocess.run([sys.executable, "-c", code, tree, str(ROOT / "bench"), name, str(repeat), mooncake or "",
                           str(limit or "")],
                          check=True, capture_output=True, text=True, cwd=tree)
    return json.loads(done.stdout.strip().splitlines()[-1])


def _fmt(walls: list[float]) -> str:
    return f"min {min(walls):.2f} s, median {statistics.median(walls):.2f} s"


def _fmt_runs(runs: list[dict]) -> str:
    """Wall seconds, and this process's CPU seconds (what another job on the shared cores takes away from the
    wall clock, not from the CPU clock)."""
    return f"wall {_fmt([r['wall_s'] for r in runs])}; cpu {_fmt([r['cpu_s'] for r in runs])}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--only", nargs="*", choices=sorted(CASES), default=None)
    parser.add_argument("--vs", default=None, help="another tree (its checker/) to alternate with, in fresh processes")
    parser.add_argument("--profile-out", type=Path, default=None, help="write a cProfile of each case's first run here")
    parser.add_argument("--write-mooncake", type=Path, default=None, help="write the generated trace here and stop")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--limit", type=int, default=None, help="only the first N requests of each trace")
    args = parser.parse_args()
    if args.write_mooncake is not None:
        print(json.dumps(make_mooncake(args.write_mooncake, args.seed)))
        return
    names = args.only or list(CASES)
    print(f"machine: {platform.machine()} {os.cpu_count()} cpu, python {platform.python_version()}, "
          f"{time.strftime('%Y-%m-%d %H:%M')}, load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    with tempfile.TemporaryDirectory() as tmp:
        mooncake = None
        if "mooncake" in names:
            mooncake = Path(tmp) / "mooncake_conv.jsonl"
            print("mooncake trace:", json.dumps(make_mooncake(mooncake, args.seed)))
        for name in names:
            if CASES[name][2] == "azure" and not AZURE.exists():
                print(f"{name}: skipped (needs {AZURE})")
                continue
            if args.vs is None:
                sys.path.insert(0, str(ROOT))
                runs = run_case(name, args.repeat, mooncake, args.profile_out, args.limit)
                print(f"{name}: {_fmt_runs(runs)} over {len(runs)} runs; steps {runs[0]['steps']}, "
                      f"request-steps {runs[0]['request_steps']}, preemptions {runs[0]['preemptions']}, "
                      f"simulated {runs[0]['end_us'] / 1e6:.1f} s, TTFT p50/p99 {runs[0]['ttft_p50_ms']}/"
                      f"{runs[0]['ttft_p99_ms']} ms, stuck {runs[0]['stuck']}; load {runs[-1]['load']:.2f}")
                continue
            a, b = [], []
            for _ in range(args.repeat):
                a += _child(str(ROOT), name, 1, str(mooncake) if mooncake else None, args.limit)
                b += _child(str(Path(args.vs).resolve()), name, 1, str(mooncake) if mooncake else None, args.limit)
            pairs = " ".join(f"{x['wall_s']:.2f}/{y['wall_s']:.2f}" for x, y in zip(a, b))
            pairs += " | cpu pairs " + " ".join(f"{x['cpu_s']:.2f}/{y['cpu_s']:.2f}" for x, y in zip(a, b))
            same = all((x["steps"], x["request_steps"], x["end_us"], x["ttft_p99_ms"]) ==
                       (b[0]["steps"], b[0]["request_steps"], b[0]["end_us"], b[0]["ttft_p99_ms"]) for x in a)
            print(f"{name}: A (this tree) {_fmt_runs(a)} | B ({args.vs}) {_fmt_runs(b)} | wall pairs A/B "
                  f"{pairs} | same results: {same}"
                  f" | load {min(r['load'] for r in a + b):.2f}-{max(r['load'] for r in a + b):.2f}")


if __name__ == "__main__":
    main()
