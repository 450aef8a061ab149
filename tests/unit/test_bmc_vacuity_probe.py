"""The bounded search's vacuity side check asks an engine probe first (a trace of the environment that reaches the
invariant's situation within the depth), then z3 within its resource count: the same answer on every run, and
no_deadlock's z3 side check (~10 s of solving at 3 slots, 5 iterations: docs/benchmarks.md) is not needed
(issue 19: the default diff of a one-knob change)."""

from __future__ import annotations

import re

from checker.inputfiles import load_policy
from checker.verify import vacuity
from checker.verify.bmc import search
from checker.verify.env import default_environment
from checker.verify.run import parse_invariant
from tests.helpers import POLICIES

V1 = POLICIES / "vllm_v1.yaml"


def test_an_engine_probe_decides_reachability_where_z3_has_no_resources(monkeypatch):
    monkeypatch.setattr(vacuity, "VACUITY_RLIMIT", 1)  # z3's side check alone would be undecided
    policy = load_policy(V1)
    inv, params = parse_invariant("no_deadlock")
    env = default_environment(policy, 2, 3, None, (1, 4096), (1, 8))
    outcome = search(policy, inv, params, env, 120)
    assert (outcome.status, outcome.vacuous, outcome.vacuity_undecided) == ("holds", False, False)


def test_the_probe_counts_only_iterations_within_the_depth():
    policy = load_policy(V1)
    inv, params = parse_invariant("no_deadlock")
    for depth in (1, 3):
        env = default_environment(policy, 2, depth, None, (1, 4096), (1, 8))
        how = vacuity.engine_witness_within_depth(policy, inv, params, env)
        assert how is not None and int(re.search(r"iteration (\d+)", how).group(1)) < depth


def test_no_probe_under_prefix_caching():
    policy = load_policy(POLICIES / "prefix_caching" / "vllm_v1.yaml")
    inv, params = parse_invariant("no_deadlock")
    env = default_environment(policy, 2, 3, None, (1, 64), (1, 4))
    assert vacuity.engine_witness_within_depth(policy, inv, params, env) is None
