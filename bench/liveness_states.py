"""Liveness explorer speed: states generated and distinct canonical states per minute, and the largest instance
explored within a time budget, with symmetry reduction on (docs/benchmarks.md, "Liveness state graphs").

"States generated" counts every successor state the step function computed, one per (state, environment
choice), duplicates included: TLC's "states generated" (its s/min). "Distinct" counts canonical states.

    python bench/liveness_states.py [--budget 60] [--policy spec/policies/vllm_v1.yaml]

For each instance (requests in flight N = 1, 2, ...) it explores the complete graph of vLLM v1 on a 16-block
pool with prompts {16, 48, 96} and outputs {1, 2, 4} until one exploration hits the budget. "Unreduced" is the
number of slot-indexed states the canonical states stand for: a canonical state with m requests holding
places out of N stands for N!/(N-m)! slot assignments, divided by the orderings of identical requests.
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import platform
import time
from collections import Counter
from pathlib import Path

from checker.api import apply_overrides, load_policy
from checker.liveness.canon import FIELDS_PER_HOLDING, FIELDS_PER_REQUEST
from checker.liveness.explore import LivenessEnv, Transition, explore
from checker.semantics.decision import DecisionBuilder
from checker.semantics.state import Request
from checker.semantics.step import arrive_phase, release_phase, step_schedule

ROOT = Path(__file__).resolve().parent.parent
PROMPTS, OUTPUTS = (16, 48, 96), (1, 2, 4)


def unreduced(key: tuple, slots: int, timed: bool) -> int:
    m = key[0]
    requests = [key[1 + i * FIELDS_PER_REQUEST: 1 + (i + 1) * FIELDS_PER_REQUEST] for i in range(m)]
    pos = 1 + m * FIELDS_PER_REQUEST + (m if timed and m else 0)
    h = key[pos]
    holding = [key[pos + 1 + FIELDS_PER_HOLDING * j: pos + 1 + FIELDS_PER_HOLDING * (j + 1)] for j in range(h)]
    placed = m + h
    count = math.perm(slots, placed)
    for same in list(Counter(requests).values()) + list(Counter(holding).values()):
        count //= math.factorial(same)
    return count


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def rates(policy, args) -> None:
    print("| requests in flight | distinct states | edges | complete | seconds (best of "
          f"{args.repeat}) | CPU s | distinct states/min | states generated | generated/s | generated/min | schedules run "
          "| us per generated state | unreduced states |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for n in range(1, args.max_requests + 1):
        env = LivenessEnv(n, PROMPTS, OUTPUTS, arrivals_per_step=args.arrivals_per_step)
        best = None
        for _ in range(args.repeat):
            started, cpu = time.perf_counter(), time.process_time()
            sg = explore(policy, env, max_states=10 ** 8, timeout_s=args.budget, workers=args.workers)
            seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
            if best is None or seconds < best[0]:
                best = seconds, sg, cpu
            if not sg.complete:
                break
        seconds, sg, cpu = best
        rate = sg.states / seconds
        total = sum(unreduced(k, n, sg.canon.timed) for k in sg.keys)
        print(f"| {n} | {sg.states:,} | {sg.edges:,} | {'yes' if sg.complete else 'no (budget)'} | {seconds:.1f} | {cpu:.1f} "
              f"| {60 * rate:,.0f} | {sg.choices_run:,} | {sg.choices_run / seconds:,.0f} | {60 * sg.choices_run / seconds:,.0f} "
              f"| {sg.steps_run:,} "
              f"| {1e6 * seconds / sg.choices_run:.0f} | {total:,} |", flush=True)
        if not sg.complete:
            break


def breakdown(policy, args) -> None:
    """Where the time goes: the explorer's work, one stage at a time over every state and environment choice of
    a complete instance, in the explorer's order (decode and phase 1 once per state; the choices as a tree, one
    copy and one arrival per node; an encoding per choice; phases 5-6 and a second encoding per memo miss).
    Each stage is timed over all its items, best of --repeat, in CPU seconds of this process (the machine is
    shared, and wall time swings with the other jobs). The instance has no cancellations and no queue
    timeout, so phases 3-4 never run."""
    env = LivenessEnv(args.breakdown, PROMPTS, OUTPUTS, arrivals_per_step=args.arrivals_per_step)
    gc.disable()  # as explore() does: the stages hold every choice's state at once
    whole = None
    for _ in range(args.repeat):
        started = time.process_time()
        sg = explore(policy, env, max_states=10 ** 8, timeout_s=10 ** 6)
        whole = min(whole or 1e9, time.process_time() - started)
    trans = Transition(sg.canon, env)
    canon = sg.canon

    def best(stage, items) -> tuple[float, list]:
        times, out = [], None
        for _ in range(args.repeat):
            t = time.process_time()
            out = stage(items)
            times.append(time.process_time() - t)
        return min(times), out

    def decode_release(keys):
        out = []
        for key in keys:
            base, now = canon.decode(key)
            release_phase(base, DecisionBuilder())
            out.append((key, base, now))
        return out

    decoded = best(decode_release, sg.keys)

    def tree(items):
        """Every choice's state after phases 1-4: per state, the states after n arrivals from those after n - 1."""
        nodes = []
        for key, base, now in items:
            limit, _ = trans._limits(key)
            first = len(base.requests)
            level = [base]
            nodes.append((base, now))
            for n in range(limit):
                following = []
                for s in level:
                    for cid in trans.class_ids:
                        c = s.copy()
                        r = Request(trans._spec(first + n, now, cid))
                        c.requests.append(r)
                        arrive_phase(c, [r], DecisionBuilder())
                        following.append(c)
                nodes += [(c, now) for c in following]
                level = following
        return nodes

    built = best(tree, decoded[1])
    nodes = built[1]
    encoded = best(lambda items: [canon.encode(s, now) for s, now in items], nodes)
    seen: set[tuple] = set()
    first_of_key = []  # the choices whose state after phases 1-4 is new: the memo misses
    for i, key in enumerate(encoded[1]):
        if key not in seen:
            seen.add(key)
            first_of_key.append(i)
    lookups = best(lambda keys: [k in seen for k in keys], encoded[1])
    schedule_times = []
    for _ in range(args.repeat):
        fresh = [(nodes[i][0].copy(), nodes[i][1]) for i in first_of_key]  # phases 5-6 mutate their states
        t = time.process_time()
        done = [(step_schedule(s, now, DecisionBuilder()), s, now) for s, now in fresh]
        schedule_times.append(time.process_time() - t)
    successors = best(lambda items: [canon.encode(s, now + canon.step_us) for _, s, now in items], done)
    n_choices, n_states, n_misses = len(nodes), sg.states, len(done)
    assert n_choices == sg.choices_run and n_misses == sg.steps_run, (n_choices, sg.choices_run, n_misses, sg.steps_run)
    stages = [("decode each state, phase 1 (release)", decoded[0]),
              ("copy a state, add one arrival (phase 2), per tree node", built[0]),
              ("encode the state after phases 1-4 (the memo key)", encoded[0]),
              ("memo lookup", lookups[0]),
              (f"phases 5-6 (step_schedule), {n_misses:,} memo misses", min(schedule_times)),
              ("encode the successor (misses)", successors[0])]
    accounted = sum(t for _, t in stages)
    stages.append(("the rest: position mapping, labels, edges, BFS, networkx", whole - accounted))
    print(f"instance: {args.breakdown} requests in flight, {n_states:,} states, {sg.edges:,} edges, "
          f"{n_choices:,} choices ({n_choices / n_states:.1f} per state), explored in {whole:.2f} CPU s "
          f"({60 * n_states / whole:,.0f} distinct states/min, {60 * n_choices / whole:,.0f} generated/min)")
    print("| stage | CPU seconds | us per choice | us per state | share |")
    print("|---|---|---|---|---|")
    for name, t in stages:
        print(f"| {name} | {t:.2f} | {1e6 * t / n_choices:.1f} | {1e6 * t / n_states:.0f} | {100 * t / whole:.0f} % |")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--budget", type=float, default=60.0, help="seconds per exploration")
    ap.add_argument("--policy", default=str(ROOT / "spec" / "policies" / "vllm_v1.yaml"))
    ap.add_argument("--max-requests", type=int, default=6)
    ap.add_argument("--repeat", type=int, default=1, help="explorations per instance (the best is shown)")
    ap.add_argument("--workers", type=int, default=1, help="worker processes (explore(workers=...))")
    ap.add_argument("--arrivals-per-step", type=int, help="at most K arrivals per iteration (default: free places)")
    ap.add_argument("--breakdown", type=int, metavar="N", help="instead: where the time goes, N requests in flight")
    args = ap.parse_args()
    policy = apply_overrides(load_policy(args.policy), ["kv.num_blocks=16"])
    print(f"load average at start: {load()}; python {platform.python_version()}; {os.cpu_count()} CPUs")
    if args.breakdown:
        breakdown(policy, args)
    else:
        rates(policy, args)
    print(f"load average at end: {load()}")


if __name__ == "__main__":
    main()
