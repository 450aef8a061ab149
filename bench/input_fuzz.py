"""The input-fuzz campaign of issue 23: N mutated input files of every kind fed to their verbs in process,
with the counts of exit codes, internal errors and hangs (a case over --hang-s seconds).

    python bench/input_fuzz.py [--cases N] [--seed S] [--hang-s 30] [--kind NAME]... [--show 10]
    python bench/input_fuzz.py --flags [--cases N] [--seed S] [--hang-s 30] [--verb NAME]... [--memory-gib 6]

Each case draws a kind (round robin), one of its seed files and a mutation from tests/fuzz/mutations.py
(the same mutations the in-suite fuzz, tests/fuzz/test_input_fuzz.py, draws with Hypothesis). Exit 0 when
no case broke the contract (docs/cli.md: exit 0, 1, 3, or 2 naming the file; never 101 or a traceback),
1 otherwise. The counts of a run are in docs/benchmarks.md ("Input fuzz").

``--flags``: random flag combinations instead (tests/fuzz/flags.py): each case draws a verb (round robin over
every verb of the command line) and a random subset of its options, with sane, shipped-file and hostile values,
and runs it in its own folder (a verb's default outputs land there). A verb with a time budget gets a short one.
``--memory-gib``: the address-space limit of this process (RLIMIT_AS, default 6 GiB): a memory bomb ends as a
MemoryError, an internal error the counts show, instead of swapping the machine.
"""

from __future__ import annotations

import argparse
import collections
import os
import random
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.fuzz.flags import argv_for, flag_problem, run_flags, verbs  # noqa: E402
from tests.fuzz.mutations import KINDS, mutant, problem, run_case  # noqa: E402


class Hang(BaseException):
    """Raised by the alarm: a case ran past --hang-s (BaseException: the CLI's guard does not catch it)."""


def _alarm(signum, frame):
    raise Hang


class Stop(BaseException):
    """SIGTERM (e.g. from `timeout`): stop after the current case and print the counts so far."""


def _term(signum, frame):
    raise Stop


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--hang-s", type=int, default=30)
    parser.add_argument("--kind", action="append", choices=sorted(KINDS))
    parser.add_argument("--show", type=int, default=10, help="broken cases to print (default 10)")
    parser.add_argument("--flags", action="store_true", help="random flag combinations over every verb instead")
    parser.add_argument("--verb", action="append", help="--flags: only these verbs (e.g. verify, 'calibrate fit')")
    parser.add_argument("--memory-gib", type=float, default=6.0, help="address-space limit (default 6 GiB)")
    parser.add_argument("--report-every", type=int, default=0, help="print the counts so far every N cases")
    args = parser.parse_args()
    import resource

    limit = int(args.memory_gib * 2**30)
    resource.setrlimit(resource.RLIMIT_AS, (limit, resource.getrlimit(resource.RLIMIT_AS)[1]))
    if args.flags:
        return flag_campaign(args)
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
    signal.signal(signal.SIGTERM, _term)
    done = 0
    with tempfile.TemporaryDirectory(prefix="input_fuzz.") as tmp:
        try:
            for i in range(args.cases):
                kind = kinds[i % len(kinds)]
                seed = rnd.choice(seeds[kind.name])
                case_seed = rnd.randrange(2**32)
                try:
                    text = mutant(kind, seed, random.Random(case_seed))
                except (RecursionError, ValueError) as exc:  # the mutator's own failure: not a case
                    codes["mutator error"] += 1
                    broken.append(f"{kind.name} {seed[0]} case seed {case_seed}: mutator: {exc!r}")
                    done = i + 1
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
                done = i + 1
                if args.report_every and done % args.report_every == 0:
                    print(f"... {done} cases, {time.monotonic() - started:.0f} s: " + ", ".join(
                        f"{c}: {n}" for c, n in sorted(codes.items(), key=str)) + f"; broken {len(broken)}",
                        flush=True)
        except Stop:
            print(f"stopped by SIGTERM after {done} of {args.cases} cases", flush=True)
    wall = time.monotonic() - started
    print(f"{done} cases, seed {args.seed}, {wall:.0f} s ({1000 * wall / max(done, 1):.0f} ms a case), "
          f"load {os.getloadavg()[0]:.2f}")
    print("exit codes: " + ", ".join(f"{c}: {n}" for c, n in sorted(codes.items(), key=str)))
    for name, counter in sorted(by_kind.items()):
        print(f"  {name:18} " + ", ".join(f"{c}: {n}" for c, n in sorted(counter.items(), key=str)))
    print(f"broken cases: {len(broken)} (internal errors or contract misses: {internal}, hangs over "
          f"{args.hang_s} s: {hangs}); slowest case {slowest[0]:.1f} s ({slowest[1]})")
    for line in broken[:args.show]:
        print(f"  {line}")
    return 1 if broken else 0


def flag_campaign(args: argparse.Namespace) -> int:
    """--flags: random flag combinations over every verb (tests/fuzz/flags.py)."""
    chosen = [v for v in verbs() if not args.verb or " ".join(v.words) in args.verb]
    rnd = random.Random(args.seed)
    codes: collections.Counter = collections.Counter()
    by_verb: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    broken: list[str] = []
    hangs = internal = 0
    slowest = (0.0, "")
    slow: list[str] = []
    signal.signal(signal.SIGALRM, _alarm)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="flag_fuzz.") as tmp:
        for i in range(args.cases):
            verb = chosen[i % len(chosen)]
            case_seed = rnd.randrange(2**32)
            argv = argv_for(verb, random.Random(case_seed))
            folder = Path(tmp) / f"c{i}"
            t0 = time.monotonic()
            signal.alarm(args.hang_s)
            try:
                code, err = run_flags(argv, folder)
                wrong = flag_problem(code, err)
            except Hang:
                code, wrong = "hang", f"over {args.hang_s} s"
                hangs += 1
            finally:
                signal.alarm(0)
            shutil.rmtree(folder, ignore_errors=True)
            seconds = time.monotonic() - t0
            name = " ".join(verb.words)
            if seconds > slowest[0]:
                slowest = (seconds, f"{name} case seed {case_seed}")
            if seconds > args.hang_s / 3:
                slow.append(f"{seconds:.1f} s (exit {code}): {argv}")
            codes[code] += 1
            by_verb[name][code] += 1
            if wrong is not None:
                internal += code != "hang"
                broken.append(f"{name} case seed {case_seed}: {wrong}\n    argv: {argv}")
            if args.report_every and (i + 1) % args.report_every == 0:
                print(f"... {i + 1} cases, {time.monotonic() - started:.0f} s: " + ", ".join(
                    f"{c}: {n}" for c, n in sorted(codes.items(), key=str)) + f"; broken {len(broken)}", flush=True)
    wall = time.monotonic() - started
    print(f"{args.cases} flag cases over {len(chosen)} verbs, seed {args.seed}, {wall:.0f} s "
          f"({1000 * wall / max(args.cases, 1):.0f} ms a case), load {os.getloadavg()[0]:.2f}")
    print("exit codes: " + ", ".join(f"{c}: {n}" for c, n in sorted(codes.items(), key=str)))
    for name, counter in sorted(by_verb.items()):
        print(f"  {name:18} " + ", ".join(f"{c}: {n}" for c, n in sorted(counter.items(), key=str)))
    print(f"broken cases: {len(broken)} (internal errors or contract misses: {internal}, hangs over "
          f"{args.hang_s} s: {hangs}); slowest case {slowest[0]:.1f} s ({slowest[1]})")
    for line in broken[:args.show]:
        print(f"  {line}")
    print(f"cases over a third of --hang-s: {len(slow)}")
    for line in slow[:args.show]:
        print(f"  {line}")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
