"""The input-fuzz campaign of issue 23: N mutated input files of every kind fed to their verbs in process,
with the counts of exit codes, internal errors and hangs (a case over --hang-s seconds).

    python bench/input_fuzz.py [--cases N] [--seed S] [--hang-s 30] [--kind NAME]... [--show 10]

Each case draws a kind (round robin), one of its seed files and a mutation from tests/fuzz/mutations.py
(the same mutations the in-suite fuzz, tests/fuzz/test_input_fuzz.py, draws with Hypothesis). Exit 0 when
no case broke the contract (docs/cli.md: exit 0, 1, 3, or 2 naming the file; never 101 or a traceback),
1 otherwise. The counts of a run are in docs/benchmarks.md ("Input fuzz").
"""

from __future__ import annotations

import argparse
import collections
import os
import random
import signal
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.fuzz.mutations import KINDS, mutant, problem, run_case  # noqa: E402


class Hang(BaseException):
    """Raised by the alarm: a case ran past --hang-s (BaseException: the CLI's guard does not catch it)."""


def _alarm(signum, frame):
    raise Hang


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--hang-s", type=int, default=30)
    parser.add_argument("--kind", action="append", choices=sorted(KINDS))
    parser.add_argument("--show", type=int, default=10, help="broken cases to print (default 10)")
    args = parser.parse_args()
    kinds = [KINDS[k] for k in (args.kind or sorted(KINDS))]
    seeds = {k.name: k.seeds() for k in kinds}
    rnd = random.Random(args.seed)
    codes: collections.Counter = collections.Counter()
    by_kind: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    broken: list[str] = []
    hangs = internal = 0
    slowest = (0.0, "")
    signal.signal(signal.SIGALRM, _alarm)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="input_fuzz.") as tmp:
        for i in range(args.cases):
            kind = kinds[i % len(kinds)]
            seed = rnd.choice(seeds[kind.name])
            case_seed = rnd.randrange(2**32)
            try:
                text = mutant(kind, seed, random.Random(case_seed))
            except (RecursionError, ValueError) as exc:  # the mutator's own failure: not a case
                codes["mutator error"] += 1
                broken.append(f"{kind.name} {seed[0]} case seed {case_seed}: mutator: {exc!r}")
                continue
            folder = Path(tmp) / f"c{i % 50}"
            t0 = time.monotonic()
            signal.alarm(args.hang_s)
            try:
                code, err, path = run_case(kind, seed, text, folder)
                wrong = problem(code, err, path, folder)
            except Hang:
                code, wrong = "hang", f"over {args.hang_s} s"
                hangs += 1
            except SystemExit as exc:  # argparse: not expected, the argv is fixed
                code, wrong = f"SystemExit {exc.code}", "argparse exit"
            finally:
                signal.alarm(0)
            seconds = time.monotonic() - t0
            if seconds > slowest[0]:
                slowest = (seconds, f"{kind.name} {seed[0]} case seed {case_seed}")
            codes[code] += 1
            by_kind[kind.name][code] += 1
            if wrong is not None:
                internal += code != "hang"
                broken.append(f"{kind.name} {seed[0]} case seed {case_seed}: {wrong}")
    wall = time.monotonic() - started
    print(f"{args.cases} cases, seed {args.seed}, {wall:.0f} s ({1000 * wall / max(args.cases, 1):.0f} ms a case), "
          f"load {os.getloadavg()[0]:.2f}")
    print("exit codes: " + ", ".join(f"{c}: {n}" for c, n in sorted(codes.items(), key=str)))
    for name, counter in sorted(by_kind.items()):
        print(f"  {name:18} " + ", ".join(f"{c}: {n}" for c, n in sorted(counter.items(), key=str)))
    print(f"broken cases: {len(broken)} (internal errors or contract misses: {internal}, hangs over "
          f"{args.hang_s} s: {hangs}); slowest case {slowest[0]:.1f} s ({slowest[1]})")
    for line in broken[:args.show]:
        print(f"  {line}")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
