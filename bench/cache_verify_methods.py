"""verify on policies with prefix caching: the explicit-state search (the default) against z3 BMC over the pool
encoding (--cache-method z3), on the planted bugs and the shipped caching policy, at their own pool sizes and on
small pools. Prints one row per (case, method): verdict, requests and iteration of a counterexample, seconds.

    python bench/cache_verify_methods.py [--timeout S]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from checker.api import load_policy, run_verify

ROOT = Path(__file__).resolve().parent.parent
BROKEN, CACHING = ROOT / "spec" / "policies" / "broken", ROOT / "spec" / "policies" / "prefix_caching" / "vllm_v1.yaml"
CASES = [  # (name, policy, pool (blocks, block size) or None for its own, invariant, requests, depth)
    ("uncounted hits, own pool 16x16", BROKEN / "vllm_v1_cache_uncounted_hits.yaml", None, "kv_never_overcommitted", 2, 4),
    ("unchained hashes, own pool 16x16", BROKEN / "vllm_v1_cache_unchained_hashes.yaml", None,
     "hit_only_on_identical_chain", 2, 4),
    ("uncounted hits, pool 2x2", BROKEN / "vllm_v1_cache_uncounted_hits.yaml", (2, 2), "kv_never_overcommitted", 1, 4),
    ("unchained hashes, pool 4x2", BROKEN / "vllm_v1_cache_unchained_hashes.yaml", (4, 2),
     "hit_only_on_identical_chain", 2, 1),
    ("vllm_v1 caching (fixed), pool 2x2", CACHING, (2, 2), "kv_never_overcommitted", 1, 3),
]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--timeout", type=float, default=60.0)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp())
    print(f"{'case':<36} {'method':<9} {'verdict':<12} {'cex':<14} seconds")
    for name, path, pool, inv, n, depth in CASES:
        if pool is not None:
            policy = load_policy(path)
            policy = policy.model_copy(update={"kv": policy.kv.model_copy(update={"num_blocks": pool[0],
                                                                               "block_size": pool[1]})})
            path = tmp / f"{path.stem}_{pool[0]}x{pool[1]}.yaml"
            path.write_text(json.dumps(policy.model_dump(mode="json")))
        for method in ("explicit", "z3"):
            started = time.monotonic()
            _, (r,) = run_verify(path, [inv], n, depth, timeout_s=args.timeout, out_dir=tmp, cancellations=False,
                                 cache_method=method)
            cex = f"{r.requests} req, it {r.violation_step}" if r.violation_step is not None else "-"
            print(f"{name:<36} {method:<9} {r.verdict.value:<12} {cex:<14} {time.monotonic() - started:.1f}", flush=True)


if __name__ == "__main__":
    main()
