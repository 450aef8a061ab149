"""Benchmark: how fast `batchcheck verify` decides (issue 3's speed targets and its PROVED list).

One row per (policy, invariant, N, K): the verdict and the wall seconds of the whole check (bounded
search, minimality, engine replay, and with --unbounded the induction). Prints a markdown table.

    python bench/verify_speed.py                 # every case (slow: the N=4 induction cases take minutes)
    python bench/verify_speed.py --only targets  # the three speed targets
    python bench/verify_speed.py --only proved --timeout 300
    python bench/verify_speed.py --only finds
    python bench/verify_speed.py --only anyn     # verify --any-n: every number of requests, the real pools
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402

from checker.api import load_policy, run_verify  # noqa: E402
from checker.fileio import write_atomic  # noqa: E402
from tests.quality.test_verify_finds import FINDS  # noqa: E402

POLICIES = ROOT / "spec" / "policies"
SAFETY = ["kv_never_overcommitted", "token_budget", "seq_cap", "request_conservation"]
PROVED_LIST = SAFETY + ["cancellation_releases:1"]


@dataclass(frozen=True)
class Case:
    group: str  # "targets", "proved" or "finds"
    policy: str
    invariants: tuple[str, ...]
    requests: int
    depth: int
    unbounded: bool = False
    prompt: tuple[int, int] | None = None
    target_s: float | None = None  # the bound on the total seconds of the case
    num_blocks: int | None = None  # a smaller KV pool (a copy of the policy), so that few requests can fill it
    any_n: bool = False  # verify --any-n (checker/verify/anyn.py): N and K are only the bounded fallback's

    @property
    def label(self) -> str:
        pool = f" pool={self.num_blocks}" if self.num_blocks else ""
        size = "any N" if self.any_n else f"{self.requests}x{self.depth}"
        return f"{self.policy}{pool} {','.join(self.invariants)} {size}"


# Small prompts let the pool fill with few requests only where the pool is small; the shipped pools
# (2,500 blocks of 16 tokens) cannot be filled by 2-4 prompts of at most max_model_len tokens, so with
# --unbounded verify checks kv_never_overcommitted with N raised to the least that can (and longer outputs:
# docs/invariants.md, "An environment that can fill the KV pool"); the bench reports it as it is.
CASES = [
    # full reservation, 4 x 8: on a pool 4 requests can fill (on the shipped pool they cannot: N raised to 5)
    Case("targets", "orca", ("kv_never_overcommitted",), 4, 8, unbounded=True, prompt=(1, 1024), num_blocks=64,
         target_s=1.0),
    Case("targets", "orca", ("kv_never_overcommitted",), 4, 8, unbounded=True),
    Case("targets", "vllm_v1", tuple(SAFETY), 8, 2, unbounded=True, target_s=60.0),  # 8 slots, any depth
    Case("targets", "broken/unchecked_growth", ("kv_never_overcommitted",), 8, 32, target_s=2.0),
] + [
    Case("proved", policy, (inv,), n, 2, unbounded=True)
    for policy in ("vllm_v1", "sarathi_serve") for n in (2, 3, 4) for inv in PROVED_LIST
] + [
    Case("proved", policy, tuple(SAFETY), 8, 2, unbounded=True) for policy in ("vllm_v1", "sarathi_serve")
] + [
    Case("proved", policy, ("kv_never_overcommitted",), n, 3, unbounded=True, prompt=(1, 1024), num_blocks=64)
    for policy in ("vllm_v1", "sarathi_serve") for n in (2, 3, 4, 8)
] + [  # issue 20: every number of requests, any depth, on the shipped pools (the first row: the 60 s target)
    Case("anyn", "vllm_v1", tuple(SAFETY), 3, 5, any_n=True, target_s=60.0),
] + [
    Case("anyn", policy, tuple(SAFETY), 3, 5, any_n=True)
    for policy in ("sarathi_serve", "orca", "static_batching", "strict_priority", "priority_aging", "tiered_shedding",
                   "tiered_unprotected", "trtllm_guaranteed_no_evict", "trtllm_max_utilization",
                   "vllm_v0_no_chunking", "tgi_router", "vtc_fair", "broken/unchecked_growth")
] + [  # issue 3's finds, exactly as tests/quality/test_verify_finds.py checks them
    Case("finds", policy, (invariant,), requests, depth, prompt=prompt)
    for policy, invariant, requests, depth, prompt, *_ in FINDS
]


def run_case(case: Case, timeout_s: float, out: Path) -> list[str]:
    rows = []
    started = time.perf_counter()
    policy_file = POLICIES / f"{case.policy}.yaml"
    if case.num_blocks is not None:
        policy = load_policy(policy_file)
        small = policy.model_copy(update={"kv": policy.kv.model_copy(update={"num_blocks": case.num_blocks})})
        policy_file = out / f"{case.policy.replace('/', '_')}_pool{case.num_blocks}.yaml"
        write_atomic(policy_file, yaml.safe_dump(small.model_dump(mode="json"), sort_keys=False))
    _, results = run_verify(policy_file, list(case.invariants), case.requests, case.depth, timeout_s=timeout_s,
                            out_dir=out, prompt=case.prompt, unbounded=case.unbounded, proof_dir=out,
                            any_n=case.any_n)
    total = time.perf_counter() - started
    for r in results:
        what = r.verdict.value
        if r.requests:
            what += f" ({r.requests} request(s), iteration {r.violation_step}" + (
                ", minimal" if not r.notes else "") + ")"
        elif r.notes:
            what += " (" + "; ".join(r.notes)[:120] + ")"
        pool = f" ({case.num_blocks}-block pool, prompts {case.prompt[0]}-{case.prompt[1]})" if case.num_blocks else ""
        size = "any N, any depth" if case.any_n else f"{case.requests} x {case.depth}"
        if case.any_n and r.verdict.value == "PROVED":
            what = "PROVED for any N" + (f" ({r.notes[0][:60]})" if r.notes else "")
        rows.append(f"| `{case.policy}`{pool} | {r.label} | {size}"
                    f"{' + induction' if case.unbounded else ''} | {what} | {r.seconds:.2f} |")
    if case.target_s is not None:
        decided = all(r.verdict.value != "UNKNOWN" for r in results)
        met = "met" if total < case.target_s and decided else "NOT met"
        rows.append(f"| | **total** | | target < {case.target_s:g} s: **{met}** | **{total:.2f}** |")
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", choices=["targets", "proved", "finds", "anyn"], help="one group of cases")
    ap.add_argument("--match", default="", help="only cases whose label contains this text")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds per invariant (default 120)")
    args = ap.parse_args(argv)
    print(f"date {time.strftime('%Y-%m-%d %H:%M')}; load average {os.getloadavg()[0]:.2f} "
          f"{os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}; {os.cpu_count()} CPUs; timeout {args.timeout:g} s")
    print("| policy | invariant | N x K | verdict | seconds |\n|---|---|---|---|---|", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for case in CASES:
            if (args.only and case.group != args.only) or args.match not in case.label:
                continue
            for row in run_case(case, args.timeout, Path(tmp)):
                print(row, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
