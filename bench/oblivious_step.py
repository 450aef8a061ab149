"""Why the engine does not run the data-oblivious (symbolic) step: its cost per step.

    python bench/oblivious_step.py

Evaluates checker/smt/encode.py with IntOps (plain Python ints) on states of N live requests taken
from a vllm_v1 run, and compares with the engine's step on the same states.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from checker.api import load_policy  # noqa: E402
from checker.engine import _Clock  # noqa: E402
from checker.semantics.state import SchedulerState
from checker.requests import RequestSpec  # noqa: E402
from checker.semantics.step import step  # noqa: E402
from checker.smt.conformance import capture, int_outputs  # noqa: E402


def main() -> None:
    policy = load_policy(ROOT / "spec" / "policies" / "vllm_v1.yaml")
    print("N live requests | oblivious step (IntOps) | engine step | ratio")
    for n in (4, 8, 16, 32):
        specs = [RequestSpec(rid=i, arrival_us=0, prompt_len=300 + 37 * i, output_len=200, max_output=200)
                 for i in range(n)]
        s = SchedulerState(policy, specs)
        clock = _Clock(s.requests)
        step(s, *clock.due(0), 0)  # admit everyone: a state with n running requests
        captured = capture(s, [], 1000)
        t0 = time.perf_counter()
        reps = max(1, 64 // n)
        for _ in range(reps):
            int_outputs(policy, captured)
        oblivious = (time.perf_counter() - t0) / reps
        t0 = time.perf_counter()
        for _ in range(200):
            step(s, [], [], 1000)
        engine = (time.perf_counter() - t0) / 200
        print(f"{n:>15} | {oblivious * 1e3:>20.2f} ms | {engine * 1e6:>8.1f} us | {oblivious / engine:>6.0f}x")


if __name__ == "__main__":
    main()
