"""SGLang 0.5.23's real scheduler as an oracle for the engine's SGLang rules: kept step logs of
tests/sglang_driver.py (tests/data/sglang/), the driver's flags as `batchcheck import sglang --rules sglang`
arguments, and the comparison of a log with the engine step by step, as `batchcheck check-log POLICY LOG
--arrivals TRACE --conformance` does.

Used by tests/conformance/test_sglang_conformance.py (on the kept logs, so it runs without the venv) and
bench/sglang_matrix.py (the table; --fresh drives new logs through the venv).

    python tests/sglang_logs.py --regenerate [--only NAME ...]

rebuilds tests/data/sglang/ with the SGLang venv (tools/sglang_setup.sh; BATCHCHECK_SGLANG_VENV points at
another): each case's trace is generated from its seed, driven through the real scheduler (one driver process for
all), and kept as NAME.trace.json and NAME.log.jsonl.gz.
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script
    sys.path.insert(0, str(ROOT))

from checker.checklog import (CheckLogResult, Conformance, conformance, load_arrivals, load_log,  # noqa: E402
                              run_check_log)
from checker.importers import import_policy  # noqa: E402
from checker.policy import Policy  # noqa: E402

DATA = ROOT / "tests" / "data" / "sglang"
RULES = "sglang"

# driver flag -> the SGLang server flag of the same meaning (the driver names them as the server does)
SAME = ("--page-size", "--max-running-requests", "--chunked-prefill-size", "--max-prefill-tokens",
        "--schedule-policy", "--schedule-conservativeness", "--priority-scheduling-preemption-threshold",
        "--retraction-policy")
SAME_BOOL = ("--disable-radix-cache", "--enable-mixed-chunk", "--enable-priority-scheduling",
             "--schedule-low-priority-values-first", "--disable-priority-preemption")
# driver flag -> the environment variable the driver sets (KEY=VALUE on the import's command line)
ENV = {"--init-new-token-ratio": "SGLANG_INIT_NEW_TOKEN_RATIO",
       "--min-new-token-ratio-factor": "SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR",
       "--new-token-ratio-decay-steps": "SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS",
       "--retract-decode-steps": "SGLANG_RETRACT_DECODE_STEPS",
       "--clip-max-new-tokens": "SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION"}
# the run's own flags: no server counterpart
RUN_ONLY = ("--max-steps", "--max-stalled-steps", "--model-dir", "--tree-core")
DRIVER_CONTEXT_LEN = 65536  # the driver's --max-context-len default


def import_args(flags: list[str]) -> list[str]:
    """The driver's flags as `batchcheck import sglang --rules sglang` arguments (the same configuration): server
    flag names, the pool as --max-total-tokens, the normal loop as --disable-overlap-schedule (the driver runs
    event_loop_normal unless --overlap). --arrival-checks (handle_generate_request's max_new_tokens cap, which a
    server always applies) needs no argument. --ignore-eos (a request's sampling parameter, not a server flag),
    --overlap (the rules model the normal loop) and --req-pool-size have no such counterpart (ValueError)."""
    out: list[str] = []
    context = DRIVER_CONTEXT_LEN
    i = 0
    while i < len(flags):
        flag = flags[i]
        value = flags[i + 1] if i + 1 < len(flags) else None
        if flag in SAME_BOOL:
            out.append(flag)
            i += 1
            continue
        if flag in ("--quiet", "--arrival-checks"):  # the log's form; a check the server always runs at arrival
            i += 1
            continue
        if flag in ("--overlap", "--ignore-eos"):
            raise ValueError(f"no import argument for the driver flag {flag}: the sglang rules model the normal loop "
                             "and requests without ignore_eos")
        if value is None:
            raise ValueError(f"the driver flag {flag} needs a value")
        if flag in SAME:
            out += [flag, value]
        elif flag == "--pool-tokens":
            out += ["--max-total-tokens", value]
        elif flag == "--max-context-len":
            context = int(value)
        elif flag in ENV:
            out.append(f"{ENV[flag]}={value}")
        elif flag in RUN_ONLY:
            pass
        else:
            raise ValueError(f"no import argument for the driver flag {flag}")
        i += 2
    return ["--context-length", str(context), *out, "--disable-overlap-schedule"]


def policy_for(flags: list[str], name: str) -> Policy:
    """The policy `batchcheck import sglang --rules sglang` makes from the driver's flags."""
    return import_policy("sglang", import_args(flags), name=name, rules=RULES).policy


def compare(trace: Path, log: Path, flags: list[str], name: str) -> Conformance:
    """The engine under the imported policy against the log, on the trace's arrivals: check-log's reference
    comparison (every step's scheduled tokens, preemptions and finishes; the free blocks counted too). The log's
    free tokens are read in pages of the policy's kv.block_size, as check-log does."""
    policy = policy_for(flags, name)
    arrivals = load_arrivals(trace)
    return conformance(policy, arrivals, load_log(log, arrivals, page=policy.kv.block_size))


def check_log(trace: Path, log: Path, flags: list[str], name: str) -> CheckLogResult:
    """`batchcheck check-log POLICY LOG --arrivals TRACE --conformance` under the imported policy: the log streamed,
    its default invariants checked, the conformance on the streaming path (with fast-forward)."""
    return run_check_log(policy_for(flags, name), log, trace, None, True)


# ----------------------------------------------------------------------------------------- the kept logs
@dataclass(frozen=True)
class Case:
    name: str
    flags: tuple[str, ...]
    seed: int
    requests: int = 150
    gap: float = 3.0  # mean steps between arrivals
    priorities: tuple[int, ...] = ()  # every request gets one of these (priority traces)
    aborts: float = 0.0  # share of requests aborted (abort_step = arrival + 0..40)
    ignore_eos: float = 0.0  # share of requests with ignore_eos (fixed-length requests, as benchmark clients send)
    note: str = ""
    extra: dict = field(default_factory=dict, compare=False)
    radix: bool = False  # the radix cache on (SGLang's default); off: the driver gets --disable-radix-cache
    shared: float = 0.0  # share of requests whose prompt shares a prefix (prefix_group, or hash_ids chains)
    groups: int = 4  # prefix groups (or hash-id chains) the sharing requests draw from
    hash_block: int = 0  # > 0: shared prefixes as Mooncake hash_ids of this many tokens (a chain's first ids)

    def driver_flags(self) -> list[str]:
        return [*self.flags] if self.radix else [*self.flags, "--disable-radix-cache"]


def make_trace(case: Case) -> list[dict]:
    """A seeded trace: prompts 20-400 tokens, outputs 4-120, arrivals spread (exponential gaps)."""
    rng = random.Random(case.seed)
    rows: list[dict] = []
    step = 0.0
    for i in range(case.requests):
        step += rng.expovariate(1.0 / case.gap)
        row: dict = {"id": f"r{i}", "arrival_step": int(step), "prompt_tokens": rng.randint(20, 400),
                     "output_tokens": rng.randint(4, 120)}
        if case.priorities:
            row["priority"] = rng.choice(case.priorities)
        if case.aborts and rng.random() < case.aborts:
            row["abort_step"] = int(step) + rng.randint(0, 40)
        if case.ignore_eos:
            row["ignore_eos"] = rng.random() < case.ignore_eos
        if case.shared and rng.random() < case.shared:
            _share_prefix(case, rng, row, i)
        rows.append(row)
    return rows


def _share_prefix(case: Case, rng: random.Random, row: dict, i: int) -> None:
    """A shared prompt prefix: a prefix group (two prompts of a group share their common length), or with hash_block
    the first 1..all ids of one of the chains (then ids of the request's own)."""
    group = rng.randrange(case.groups)
    if not case.hash_block:
        row["prefix_group"] = group
        return
    n = -(-row["prompt_tokens"] // case.hash_block)
    depth = rng.randint(1, n)
    row["hash_block_tokens"] = case.hash_block
    # ids from 200,000 on: hash id h is the token ids (10 + h) * 10**6 + j, and the driver gives request number i
    # of a file the ids (1000 + i) * 10**6 + j, so an id below 990 + the number of requests would collide
    row["hash_ids"] = [200_000 + group * 1000 + j for j in range(depth)] + [100_000 + i * 100 + j
                                                                            for j in range(n - depth)]


CASES = [
    Case("fcfs_p1_pressure", ("--page-size", "1", "--pool-tokens", "1400", "--max-running-requests", "24",
                              "--chunked-prefill-size", "512", "--new-token-ratio-decay-steps", "150"), seed=1,
         requests=160, aborts=0.1, note="page 1, fcfs, KV pressure, a fast ratio decay, aborts"),
    Case("lof_p4", ("--page-size", "4", "--pool-tokens", "1600", "--max-running-requests", "16",
                    "--chunked-prefill-size", "256", "--schedule-policy", "lof"), seed=2, requests=150,
         note="page 4, longest output first"),
    Case("fcfs_p16", ("--page-size", "16", "--pool-tokens", "2000", "--max-running-requests", "32",
                      "--chunked-prefill-size", "512", "--init-new-token-ratio", "0.4",
                      "--retract-decode-steps", "10"), seed=3, requests=170, gap=2.5,
         note="page 16, fcfs, a low initial ratio, SGLANG_RETRACT_DECODE_STEPS 10"),
    Case("priority_p1", ("--page-size", "1", "--pool-tokens", "1800", "--max-running-requests", "8",
                         "--chunked-prefill-size", "512", "--enable-priority-scheduling"), seed=4, requests=160,
         priorities=(0, 5, 10, 20, 30), note="priority scheduling with preemption (threshold 10), higher first"),
    Case("priority_low_first_p4", ("--page-size", "4", "--pool-tokens", "1500", "--max-running-requests", "6",
                                   "--chunked-prefill-size", "256", "--enable-priority-scheduling",
                                   "--schedule-low-priority-values-first",
                                   "--priority-scheduling-preemption-threshold", "5",
                                   "--retraction-policy", "priority", "--min-new-token-ratio-factor", "0.05"),
         seed=5, requests=150, priorities=(0, 3, 8, 15, 25), aborts=0.1,
         note="priority, lower values first, threshold 5, retraction by priority, aborts"),
    Case("mixed_p16", ("--page-size", "16", "--pool-tokens", "2400", "--max-running-requests", "24",
                       "--chunked-prefill-size", "256", "--enable-mixed-chunk"), seed=6, requests=160,
         note="page 16, mixed chunk"),
    Case("no_chunking_p4", ("--page-size", "4", "--pool-tokens", "1600", "--max-running-requests", "16",
                            "--chunked-prefill-size", "-1", "--max-prefill-tokens", "1024"), seed=7, requests=150,
         aborts=0.1, note="chunked prefill off, max_prefill_tokens 1024, aborts"),
    Case("lof_p1_conservative", ("--page-size", "1", "--pool-tokens", "1200", "--max-running-requests", "20",
                                 "--chunked-prefill-size", "384", "--schedule-policy", "lof",
                                 "--schedule-conservativeness", "0.5", "--clip-max-new-tokens", "64"), seed=8,
         requests=140, note="page 1, lof, conservativeness 0.5, SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION 64"),
    Case("ignore_eos_mixed_priority_p4", ("--page-size", "4", "--pool-tokens", "1600", "--max-running-requests", "16",
                                          "--chunked-prefill-size", "256", "--enable-mixed-chunk",
                                          "--enable-priority-scheduling"), seed=9, requests=150,
         priorities=(15, 24, 35, 38, 39, 40), aborts=0.1, ignore_eos=0.5,
         note="half the requests ignore_eos (add_one_req_ignore_eos, ratio 1), mixed chunk, priority, aborts"),
    # the radix cache on (SGLang's default): shared prefixes, evictions
    Case("radix_fcfs_p1", ("--page-size", "1", "--pool-tokens", "1400", "--max-running-requests", "24",
                           "--chunked-prefill-size", "512", "--new-token-ratio-decay-steps", "150"), seed=11,
         requests=160, aborts=0.1, radix=True, shared=0.7,
         note="radix cache, page 1, fcfs, prefix groups, KV pressure (evictions, retractions), aborts"),
    Case("radix_lpm_p4", ("--page-size", "4", "--pool-tokens", "1600", "--max-running-requests", "16",
                          "--chunked-prefill-size", "256", "--schedule-policy", "lpm"), seed=12, requests=160,
         radix=True, shared=0.7, groups=5, note="radix cache, page 4, lpm, prefix groups"),
    Case("radix_dfs_p16", ("--page-size", "16", "--pool-tokens", "2000", "--max-running-requests", "32",
                           "--chunked-prefill-size", "512", "--schedule-policy", "dfs-weight",
                           "--init-new-token-ratio", "0.4"), seed=13, requests=170, gap=2.5, radix=True,
         shared=0.8, hash_block=32, note="radix cache, page 16, dfs-weight, hash_ids chains, a low initial ratio"),
    Case("radix_lof_mixed_priority_p4", ("--page-size", "4", "--pool-tokens", "1500", "--max-running-requests", "12",
                                         "--chunked-prefill-size", "256", "--schedule-policy", "lof",
                                         "--enable-mixed-chunk", "--enable-priority-scheduling"), seed=14,
         requests=150, priorities=(0, 5, 10, 20, 30), aborts=0.1, radix=True, shared=0.6, hash_block=16,
         note="radix cache, lof, mixed chunk, priority preemption, hash_ids chains, aborts"),
    Case("radix_lpm_burst_p1", ("--page-size", "1", "--pool-tokens", "3000", "--max-running-requests", "8",
                                "--chunked-prefill-size", "256", "--schedule-policy", "lpm"), seed=21, requests=200,
         gap=0.3, radix=True, shared=0.7, groups=6,
         note="radix cache, lpm under a burst: up to 187 waiting, so fcfs (no priority sort) above 128"),
    Case("radix_priority_p1", ("--page-size", "1", "--pool-tokens", "1800", "--max-running-requests", "8",
                               "--chunked-prefill-size", "512", "--enable-priority-scheduling"), seed=22,
         requests=160, priorities=(0, 5, 10, 20, 30), radix=True, shared=0.7,
         note="radix cache, priority scheduling with preemption (release, then evict)"),
]
CASE = {c.name: c for c in CASES}


def kept(name: str, folder: Path) -> tuple[Path, Path]:
    """The kept trace and the kept log of ``name``, the log unzipped into ``folder`` (check-log reads plain
    JSON lines)."""
    trace = DATA / f"{name}.trace.json"
    log = folder / f"{name}.log.jsonl"
    log.write_bytes(gzip.decompress((DATA / f"{name}.log.jsonl.gz").read_bytes()))
    return trace, log


def log_stats(log: Path) -> dict:
    """steps, retractions and priority preemptions, aborts of a step log."""
    records = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    return {"steps": len(records), "retractions": sum(len(r["retracted"]) for r in records),
            "preemptions": sum(len(r["preempted"]) for r in records),
            "aborts": sum(len(r["aborted"]) for r in records)}


def drive_cases(cases: list[Case], folder: Path) -> dict[str, tuple[Path, Path]]:
    """Write each case's trace into ``folder`` and drive them all through the real scheduler (one process)."""
    from tests.sglang_harness import drive, write_trace

    jobs, out = [], {}
    for case in cases:
        trace = write_trace(folder / f"{case.name}.trace.json", make_trace(case))
        log = folder / f"{case.name}.log.jsonl"
        jobs.append((trace, case.driver_flags(), log))
        out[case.name] = (trace, log)
    for case, summary in zip(cases, drive(jobs), strict=True):
        if summary["done"] < summary["requests"]:
            raise RuntimeError(f"{case.name}: only {summary['done']} of {summary['requests']} requests ended "
                               f"in {summary['steps']} steps")
    return out


def regenerate(names: list[str] | None = None) -> int:
    from tests.sglang_harness import absent_reason, venv_python

    if venv_python() is None:
        print(absent_reason())
        return 2
    cases = [c for c in CASES if not names or c.name in names]
    DATA.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        paths = drive_cases(cases, Path(tmp))
        for case in cases:
            trace, log = paths[case.name]
            stats = log_stats(log)
            shutil.copyfile(trace, DATA / trace.name)
            (DATA / f"{case.name}.log.jsonl.gz").write_bytes(gzip.compress(log.read_bytes(), 9, mtime=0))
            print(f"{case.name}: {stats['steps']} steps, {stats['retractions']} retractions, "
                  f"{stats['preemptions']} priority preemptions, {stats['aborts']} aborts", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--regenerate", action="store_true", help="rebuild tests/data/sglang/ with the SGLang venv")
    ap.add_argument("--only", nargs="*", default=None, help="case names (default: all)")
    args = ap.parse_args(argv)
    if not args.regenerate:
        ap.print_help()
        return 0
    return regenerate(args.only)


if __name__ == "__main__":
    sys.exit(main())
