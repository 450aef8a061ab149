"""What `batchcheck diff` must find: regressions with witnesses replayed under both policies, fixes,
incomparable changes (a witness each way, from the product encoding), SLO regression witnesses."""

from __future__ import annotations

from checker.api import run_diff, run_replay, run_simulation
from checker.diff.compare import Change
from checker.exitcodes import ExitCode
from tests.helpers import POLICIES, WORKLOADS

V1, SMALL_POOL = POLICIES / "vllm_v1.yaml", POLICIES / "broken" / "vllm_v1_small_pool.yaml"
V0 = POLICIES / "vllm_v0_no_chunking.yaml"
SMALL = dict(requests=2, depth=3, timeout_s=120, prompt=(1, 4096), output=(1, 8))


def test_a_smaller_pool_is_a_deadlock_regression_with_a_witness_that_replays_both_ways(tmp_path):
    report = run_diff(V1, SMALL_POOL, invariants=["no_deadlock", "token_budget"], out_dir=tmp_path, **SMALL)
    deadlock, budget = report.properties
    assert (deadlock.change, budget.change) == (Change.LESS_SAFE, Change.EQUIVALENT)
    assert (deadlock.old_verdict, deadlock.new_verdict) == ("HOLDS_UP_TO", "VIOLATED")
    assert report.exit_code is ExitCode.VIOLATED and [p.label for p in report.regressions] == ["no_deadlock"]
    witness = deadlock.new_worse.path
    assert run_replay(witness)[1] is True  # NEW fails on it
    assert run_replay(witness, V1)[1] is False  # OLD does not
    assert report.text().splitlines()[0] == ("diff vllm_v1 -> vllm_v1_small_pool: REGRESSION in 1 of 2 properties  "
                                             "(exit 1)")


def test_the_reverse_change_is_strictly_safer_and_exits_0(tmp_path):
    report = run_diff(SMALL_POOL, V1, invariants=["no_deadlock"], out_dir=tmp_path, **SMALL)
    (deadlock,) = report.properties
    assert deadlock.change is Change.SAFER and deadlock.new_worse is None and deadlock.old_worse is not None
    assert report.exit_code is ExitCode.OK


def test_both_violating_policies_are_compared_on_the_same_symbolic_arrivals(tmp_path):
    # vLLM V0 without chunking, and the same with a 2,048-token context and budget: both stall decodes, on
    # different traces. Only the product encoding can tell; each witness must replay as claimed.
    text = V0.read_text().replace("max_model_len: 8192", "max_model_len: 2048")
    text = text.replace("max_num_batched_tokens: 8192", "max_num_batched_tokens: 2048")
    assert text.count("2048") >= 2
    variant = tmp_path / "v0_short.yaml"
    variant.write_text(text.replace("name: vllm_v0_no_chunking", "name: v0_short"))
    report = run_diff(V0, variant, invariants=["decode_progress"], out_dir=tmp_path / "w", **SMALL)
    (p,) = report.properties
    assert (p.old_verdict, p.new_verdict, p.change) == ("VIOLATED", "VIOLATED", Change.INCOMPARABLE)
    assert run_replay(p.new_worse.path)[1] and not run_replay(p.new_worse.path, V0)[1]
    assert run_replay(p.old_worse.path)[1] and not run_replay(p.old_worse.path, variant)[1]
    assert report.exit_code is ExitCode.VIOLATED


def test_identical_rules_are_equivalent_without_a_second_search(tmp_path):
    report = run_diff(V1, V1, invariants=["token_budget"], out_dir=tmp_path, **SMALL)
    (p,) = report.properties
    assert p.change is Change.EQUIVALENT and p.strength.startswith("identical rules")
    assert report.exit_code is ExitCode.OK and list(tmp_path.iterdir()) == []
    assert "changed: nothing (identical rules)" in report.text()


def test_turning_chunking_off_is_an_slo_regression_with_a_small_trace(tmp_path):
    report = run_diff(V1, V0, workload=WORKLOADS / "chat_mixed.yaml", invariants=[], slo_properties=["interactive_max_tbt"],
                      max_examples=60, fuzz_budget_s=120, seed=1, out_dir=tmp_path)
    (p,) = report.properties
    assert p.regression and p.change in (Change.LESS_SAFE, Change.INCOMPARABLE)
    assert p.new_worse.requests <= 4
    # the witness trace, simulated under each policy, shows the worsening the report states
    tbt = [run_simulation(policy, trace=p.new_worse.path).summary()["by_class"]["interactive"]["max_tbt_ms"]["max"]
           for policy in (V1, V0)]
    assert tbt[1] > tbt[0] * 1.2 + 1
    assert report.audit is not None and report.audit.new_decision == "CAPACITY_WITHIN_DECLARED_BOUND"
