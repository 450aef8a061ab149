"""In-suite slice of the flag fuzz (issue 23): random flag combinations over every verb (tests/fuzz/flags.py),
run through the command line's entry point in process, each ending as the contract says: an accepted run
(exit 0, 1, 3) or exit 2 with one error line; never an internal error (101) or a traceback. Derandomized (the
same cases on every run); the verbs that solve or search get fewer cases (each has a one-second budget). The
longer campaign: ``python bench/input_fuzz.py --flags`` (docs/benchmarks.md, "Input fuzz")."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.fuzz.flags import argv_for, flag_problem, run_flags, verbs

VERBS = {" ".join(v.words): v for v in verbs()}
SLOW = {"verify": 2, "liveness": 3, "diff": 1, "fuzz": 1, "ci": 1, "report": 1, "calibrate measure": 2, "audit": 3}
CASES = {name: SLOW.get(name, 6) for name in VERBS}  # about 100 cases, 15 s


def test_every_verb_is_fuzzed():
    assert len(VERBS) >= 18 and {"verify", "liveness", "ci", "check-log", "calibrate fit"} <= set(VERBS)


@pytest.mark.parametrize("name", sorted(VERBS))
def test_random_flags_end_as_the_contract_says(name, tmp_path):
    verb = VERBS[name]

    @settings(max_examples=CASES[name], deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(st.integers(0, 2**32 - 1))
    def case(seed: int) -> None:
        argv = argv_for(verb, random.Random(seed))
        code, err = run_flags(argv, tmp_path / f"c{seed}")
        wrong = flag_problem(code, err)
        assert wrong is None, f"{name} (seed {seed}): {wrong}\nargv: {argv}"

    case()
