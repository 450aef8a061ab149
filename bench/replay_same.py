"""Exactness check for engine speed work: the same replays give the same results in two trees.

    python bench/replay_same.py --vs OLD_TREE [--only NAME ...] [--record-limit N] [--limit N]

For each case of bench/replay_speed.py (the Azure conversation trace with the cache off and on, with the default
and the A100 profile; the Mooncake-shaped trace with real hash ids), each tree runs in a fresh process (``checker``
imported from that tree) and reports digests of:

- ``fast``: the whole replay with fast-forward (what ``simulate`` and the benchmark run): the result's counters
  (steps, request-steps, end time, busy time, peaks, idle-slot steps, stuck), every request's times (first
  scheduled, first and last token, done, longest gap, tokens scheduled, hit tokens), the final state's snapshot
  and, with the cache, the block pool (free queue in order, reference counts, hashes, cached blocks, evictions,
  every block table and chain);
- ``steps``: the first ``--record-limit`` requests replayed step by step (``record=True``: fast-forward off),
  every StepDecision, one digest per step, so a difference names its first step.

The two trees must agree on every digest; the script exits 1 if they do not (and prints the first step that
differs). Where the fast-forward path and the plain one meet (a stretch the new tree skips and the old one
steps), the request times and the final state are what pins them: plain stepping's step-by-step results all
flow into them (each request's token times, its preemptions, the pool's order).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CASES = ["azure", "azure-cache", "azure-a100", "azure-a100-cache", "mooncake"]


def _digest(value) -> str:
    return hashlib.sha256(repr(value).encode()).hexdigest()[:16]


def _pool_state(s) -> tuple:
    p = s.pool
    if p is None:
        return ()
    return (p.uncached_free, p.next_id, p.evictions, list(p.lru), list(p.refs.items()), list(p.hash_of.items()),
            [(h, list(b)) for h, b in p.cached.items()], len(p.chains), list(p.truth.items()),
            [(r.block_ids, r.num_cached_blocks, r.chain) for r in s.requests])


def run(name: str, mooncake: str | None, limit: int | None, record_limit: int) -> dict:
    """One case in this process (checker from sys.path): the digests described above."""
    import replay_speed as rs_bench

    from checker.api import load_policy
    from checker.engine import simulate
    from checker.inputfiles import apply_overrides
    from checker.profile import load_profile
    from checker.traces import load_azure_csv, load_mooncake_jsonl

    policy_path, profile_path, kind = rs_bench.CASES[name]
    policy = load_policy(policy_path)
    if kind == "mooncake":
        policy = apply_overrides(policy, rs_bench.MOONCAKE_SET)

    def load(n):
        return load_mooncake_jsonl(Path(mooncake), limit=n) if kind == "mooncake" else load_azure_csv(rs_bench.AZURE, limit=n)

    profile = load_profile(profile_path)
    out: dict = {}
    r = simulate(policy, load(limit), profile)
    t = r.times
    out["fast"] = {
        "counters": _digest((r.steps, r.request_steps, r.end_us, r.busy_us, r.kv_peak_blocks, r.running_peak,
                             r.waiting_peak, r.idle_slot_steps, r.stuck, r.step_limit_hit, r.livelock)),
        "times": _digest([getattr(t, f) for f in t.__slots__]),
        "state": _digest(r.state.snapshot()),
        "pool": _digest(_pool_state(r.state)),
        "steps": r.steps,
    }
    if record_limit:
        rec = simulate(policy, load(record_limit), profile, record=True)
        out["steps"] = [_digest(d) for d in rec.decisions]
        out["steps_pool"] = _digest(_pool_state(rec.state))
    return out


def _child(tree: Path, name: str, mooncake: str | None, limit: int | None, record_limit: int) -> dict:
    code = ("import sys, json; sys.path.insert(0, sys.argv[1]); sys.path.insert(1, sys.argv[2]);"
            "import replay_same as b;"
            "print(json.dumps(b.run(sys.argv[3], sys.argv[4] or None, int(sys.argv[5]) if sys.argv[5] else None,"
            " int(sys.argv[6]))))")
    done = subprocess.run([sys.executable, "-c", code, str(tree), str(ROOT / "bench"), name, mooncake or "",
                           str(limit or ""), str(record_limit)], check=True, capture_output=True, text=True, cwd=tree)
    return json.loads(done.stdout.strip().splitlines()[-1])


def compare(a: dict, b: dict) -> list[str]:
    """What differs between two runs' digests (empty: the same)."""
    bad = [f"fast.{k}" for k in a["fast"] if a["fast"][k] != b["fast"][k]]
    if "steps" in a:
        sa, sb = a["steps"], b["steps"]
        first = next((i for i, (x, y) in enumerate(zip(sa, sb)) if x != y), None)
        if first is not None or len(sa) != len(sb):
            bad.append(f"steps: first difference at step {first if first is not None else min(len(sa), len(sb))}"
                       f" ({len(sa)} vs {len(sb)} steps)")
        if a["steps_pool"] != b["steps_pool"]:
            bad.append("steps.pool")
    return bad


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vs", required=True, help="the other tree (its checker/ is imported in a fresh process)")
    parser.add_argument("--only", nargs="*", choices=CASES, default=None)
    parser.add_argument("--limit", type=int, default=None, help="only the first N requests in the fast replay")
    parser.add_argument("--record-limit", type=int, default=2000,
                        help="requests replayed step by step with every decision compared (0: none)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT / "bench"))
    import replay_speed as rs_bench

    failed = False
    with tempfile.TemporaryDirectory() as tmp:
        mooncake = None
        names = args.only or CASES
        if "mooncake" in names:
            mooncake = str(Path(tmp) / "mooncake_conv.jsonl")
            rs_bench.make_mooncake(Path(mooncake), args.seed)
        for name in names:
            if name != "mooncake" and not rs_bench.AZURE.exists():
                print(f"{name}: skipped (needs {rs_bench.AZURE})")
                continue
            a = _child(ROOT, name, mooncake, args.limit, args.record_limit)
            b = _child(Path(args.vs).resolve(), name, mooncake, args.limit, args.record_limit)
            bad = compare(a, b)
            failed |= bool(bad)
            steps = f", {len(a['steps'])} recorded steps compared" if "steps" in a else ""
            print(f"{name}: {'SAME' if not bad else 'DIFFERENT: ' + '; '.join(bad)} ({a['fast']['steps']} steps"
                  f"{steps})", flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
