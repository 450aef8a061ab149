"""In-suite fuzz (issue 23): every shipped input kind, mutated by Hypothesis, fed to the verb that reads it
through the command line's entry point, in process. Each case must end as the contract says (docs/cli.md):
an accepted run (exit 0, 1 or 3) or exit 2 with one ``batchcheck: error:`` line naming the file; never an
internal error (101) or a traceback. Derandomized (the same cases on every run); 2,050 cases in all.
The longer campaign over the same mutations: bench/input_fuzz.py (docs/benchmarks.md, "Input fuzz")."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.fuzz.mutations import KINDS, mutant, problem, run_case

# cases per kind: the cheap readers get more (about 2,000 in all)
CASES = {"policy": 200, "workload": 200, "profile": 150, "trace": 150, "trace-sim": 100, "azure": 150,
         "mooncake": 150, "counterexample": 200, "vllm-config": 120, "trtllm-config": 120, "triton-config": 150,
         "ci-config": 150, "checklog-log": 80, "checklog-conformance": 50, "checklog-arrivals": 80}
SEEDS = {name: kind.seeds() for name, kind in KINDS.items()}


def test_every_kind_is_fuzzed_and_has_seeds():
    assert set(CASES) == set(KINDS) and sum(CASES.values()) >= 2000
    assert all(SEEDS[name] for name in KINDS)


@pytest.mark.parametrize("name", sorted(KINDS))
def test_mutated_inputs_end_as_the_contract_says(name, tmp_path):
    kind, seeds = KINDS[name], SEEDS[name]

    @settings(max_examples=CASES[name], deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(st.integers(0, len(seeds) - 1), st.integers(0, 2**32 - 1))
    def case(which: int, seed: int) -> None:
        source = seeds[which]
        text = mutant(kind, source, random.Random(seed))
        code, err, path = run_case(kind, source, text, tmp_path / "case")
        wrong = problem(code, err, path, tmp_path / "case")
        assert wrong is None, f"{name} {source[0]} (mutation seed {seed}): {wrong}"

    case()


@settings(max_examples=100, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck))
@given(st.integers(0, 2**32 - 1), st.booleans())
def test_the_check_log_reference_path_reads_mutated_logs_as_the_stream_does(tmp_path_factory, seed, mutate_log):
    """load_arrivals, load_log and observed_frames (the reference path the tests pin the streaming checker
    to) on mutated logs and arrivals: an InputError or frames, nothing else."""
    from checker.checklog import load_arrivals, load_log, observed_frames
    from checker.errors import InputError
    from checker.inputfiles import load_policy
    from tests.fuzz.mutations import ROOT

    folder = tmp_path_factory.mktemp("ref")
    log_kind, arrivals_kind = KINDS["checklog-log"], KINDS["checklog-arrivals"]
    log, arrivals = log_kind.seeds()[0], arrivals_kind.seeds()[0]
    rnd = random.Random(seed)
    log_text = mutant(log_kind, log, rnd) if mutate_log else log[1]
    arrivals_text = arrivals[1] if mutate_log else mutant(arrivals_kind, arrivals, rnd)
    (folder / "log.jsonl").write_text(log_text)
    (folder / "arrivals.json").write_text(arrivals_text)
    policy = load_policy(ROOT / "tests" / "data" / "checklog" / "vllm_fcfs.yaml")
    try:
        arr = load_arrivals(folder / "arrivals.json")
        observed_frames(policy, arr, load_log(folder / "log.jsonl", arr))
    except InputError as exc:
        assert str(folder) in str(exc), str(exc)
