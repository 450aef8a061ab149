"""Blocked waiting states (queue.blocked_waiting, a request's grammar_steps) and failed KV loads (connector.load_failure,
a request's load_fails): the step's rules, off meaning unchanged, the engine loop, the invariants on engine traces,
the input fields, and the tools that refuse them by name (checker/semantics/blocked.py, checker/semantics/transfer.py)."""

from __future__ import annotations

import json
import random
import subprocess
import sys

import pytest

from checker.checklog import load_arrivals
from checker.engine import simulate
from checker.errors import InputError
from checker.policy import Policy
from checker.profile import load_profile
from checker.requests import RequestSpec
from checker.semantics.state import Reason, SchedulerState, Status
from checker.semantics.step import step
from checker.traces import RequestSet, dump_json_trace, load_json_trace
from checker.verify.counterexample import requests_json, specs_from_json
from checker.verify.replay import first_violation, replay_fixed_clock
from invariants import CATALOGUE
from tests.vllm_connector_harness import grammars_and_failed_loads

BASE = {"max_model_len": 512, "kv": {"num_blocks": 20, "block_size": 16},
        "batch": {"max_num_seqs": 4, "max_num_batched_tokens": 64}}
MS = 1000


def policy(**sections) -> Policy:
    return Policy.model_validate({**BASE, **sections})


def spec(rid: int, prompt: int, output: int = 3, arrival_step: int = 0, **fields) -> RequestSpec:
    return RequestSpec(rid=rid, arrival_us=arrival_step * MS, prompt_len=prompt, output_len=output,
                       max_output=output, **fields)


def run(pol: Policy, specs: list[RequestSpec], steps: int, cancel: dict[int, int] | None = None):
    """Step the state: arrivals at their step, cancels at the step given; the decisions and the state."""
    s = SchedulerState(pol, specs)
    out = []
    for k in range(steps):
        arrived = [r for r in s.requests if r.arrival_us == k * MS]
        cancels = [s.requests[rid] for rid, at in (cancel or {}).items() if at == k]
        out.append(step(s, arrived, cancels, k * MS))
    return out, s


def scheduled(decisions) -> list[list[int]]:
    return [sorted(dict(d.scheduled)) for d in decisions]


GRAMMAR = [spec(0, 20, grammar_steps=3), spec(1, 20), spec(2, 20, arrival_step=1)]


def test_skip_passes_over_a_blocked_request_which_keeps_its_place():
    decisions, s = run(policy(queue={"blocked_waiting": "skip"}), GRAMMAR, 8)
    assert scheduled(decisions)[:4] == [[1], [1, 2], [1, 2], [0, 2]]
    assert all(r.status is Status.FINISHED for r in s.requests) and s.blocked == {}


def test_stop_treats_a_blocked_head_as_not_fitting():
    decisions, _ = run(policy(queue={"blocked_waiting": "stop"}), GRAMMAR, 8)
    assert scheduled(decisions)[:4] == [[], [], [], [0, 1, 2]]


def test_off_ignores_grammar_steps_exactly():
    pol = policy()
    with_field, s1 = run(pol, GRAMMAR, 8)
    without, s2 = run(pol, [spec(0, 20), spec(1, 20), spec(2, 20, arrival_step=1)], 8)
    assert with_field == without and s1.snapshot() == s2.snapshot() and s1.blocked is None


def test_a_blocked_request_can_be_cancelled_and_leaves_the_map():
    decisions, s = run(policy(queue={"blocked_waiting": "skip"}), GRAMMAR, 6, cancel={0: 1})
    assert s.requests[0].status is Status.CANCELLED and 0 not in {rid for d in decisions for rid, _ in d.scheduled}


LOADS = [spec(0, 40, external_tokens=32, load_steps=2, load_fails=True), spec(1, 20)]
OFFLOAD = {"kind": "offload"}


def test_a_failed_load_under_fail_ends_its_request_at_the_report():
    decisions, s = run(policy(connector=OFFLOAD), LOADS, 6)
    assert decisions[1].finished == (0,) and 0 not in dict(decisions[1].scheduled)
    assert (s.requests[0].status, s.requests[0].reason, s.requests[0].blocks) == (Status.CANCELLED, Reason.LOAD_FAILED, 0)
    assert s.kv_used == 0 and s.loads_in_flight == 0


def test_a_failed_load_under_recompute_is_prefilled_from_scratch():
    decisions, s = run(policy(connector={**OFFLOAD, "load_failure": "recompute"}), LOADS, 8)
    assert dict(decisions[2].scheduled)[0] == 40  # the whole prompt: the load brought nothing
    assert s.requests[0].status is Status.FINISHED and s.kv_used == 0


def test_a_recomputing_request_that_does_not_fit_stays_first_in_the_holders_queue_and_can_be_cancelled():
    pol = policy(connector={**OFFLOAD, "load_failure": "recompute"}, admission={"reserve_full_prompt": False},
                 batch={"max_num_seqs": 4, "max_num_batched_tokens": 512})
    specs = [spec(0, 250, output=12), spec(1, 160, external_tokens=64, load_steps=3, load_fails=True),
             spec(2, 16, arrival_step=3)]
    decisions, s = run(pol, specs, 6)
    assert s.holders == [s.requests[1]] and s.requests[1].blocks == 0 and s.requests[2].status is Status.WAITING
    decisions, s = run(pol, specs, 6, cancel={1: 5})
    assert s.holders == [] and s.requests[1].status is Status.CANCELLED


def test_the_engine_keeps_stepping_while_a_grammar_compiles_and_fast_forward_changes_nothing():
    pol = policy(queue={"blocked_waiting": "skip"})
    rs = RequestSet([spec(0, 20, output=40, grammar_steps=5), spec(1, 30, output=60)], ["default"], ["default"], "t")
    fast = simulate(pol, rs, load_profile(None), record=False, fast_forward=True)
    slow = simulate(pol, rs, load_profile(None), record=False, fast_forward=False)
    assert not fast.stuck and fast.steps == slow.steps and fast.end_us == slow.end_us
    alone = simulate(pol, RequestSet([spec(0, 20, grammar_steps=5)], ["default"], ["default"], "t"), load_profile(None))
    assert not alone.stuck


# ---- invariants on engine traces with the new states
ALWAYS = ("request_conservation", "scheduled_requests_run", "seq_cap", "kv_never_overcommitted", "token_budget")


@pytest.mark.parametrize("failure", ["fail", "recompute"])
@pytest.mark.parametrize("caching", [False, True])
def test_pool_conservation_and_cancellation_releases_hold_with_the_new_states(tmp_path, failure, caching):
    from tests.connector_logs import policy_for

    extra = ("--kv-load-failure-policy", failure) + (("--enable-prefix-caching",) if caching else ())
    rows, flags = grammars_and_failed_loads(n=60, seed=5, grammar=0.4, fails=0.5, aborts=True, extra=extra)
    if caching:
        rows = [{**r, **({"prefix_group": i % 3} if i % 2 else {})} for i, r in enumerate(rows)]
    # and a failing load aborted while in flight: its blocks wait for the (failed) report
    rows.append({"id": "A", "arrival_step": 0, "prompt_tokens": 64, "output_tokens": 2, "external_tokens": 64,
                 "load_steps": 4, "load_fails": True, "abort_step": 1})
    pol = policy_for(flags, "t", rows)
    (tmp_path / "t.json").write_text(json.dumps(rows))
    arrivals = load_arrivals(tmp_path / "t.json")
    replay = replay_fixed_clock(pol, arrivals.specs, 400, MS)
    assert any(r.reason is Reason.LOAD_FAILED for r in replay.state.requests) == (failure == "fail")
    assert replay.state.requests[arrivals.ids.index("A")].reason is Reason.ABORTED
    assert all(r.status in (Status.FINISHED, Status.CANCELLED) for r in replay.state.requests)
    by_name = CATALOGUE
    names = ALWAYS + (("block_pool_conservation", "no_referenced_block_reused") if caching else ())
    for name in names:
        assert first_violation(by_name[name], {}, replay) is None, name
    # an aborted load's blocks wait for its report (release on_completion): loads here take at most 4 steps
    assert first_violation(by_name["cancellation_releases"], {"steps": 5}, replay) is None
    assert first_violation(by_name["cancellation_releases"], {"steps": 1}, replay) is not None  # the check can fail


def test_no_deadlock_does_not_count_a_blocked_request_as_work_but_sees_stop():
    by_name = CATALOGUE
    specs = [spec(0, 20, grammar_steps=4), spec(1, 20)]
    skip = replay_fixed_clock(policy(queue={"blocked_waiting": "skip"}), specs, 12, MS)
    stop = replay_fixed_clock(policy(queue={"blocked_waiting": "stop"}), specs, 12, MS)
    assert first_violation(by_name["no_deadlock"], {}, skip) is None
    assert first_violation(by_name["work_conserving"], {}, skip) is None
    assert first_violation(by_name["no_deadlock"], {}, stop) == 1  # 1 waits behind the blocked head, nothing runs
    assert first_violation(by_name["work_conserving"], {}, stop) == 0


# ---- inputs
def test_policy_fields_are_checked_by_name():
    with pytest.raises(Exception, match="scheduler"):
        Policy.model_validate({**BASE, "queue": {"blocked_waiting": "skip"}, "scheduler": "sglang"})
    with pytest.raises(Exception, match="load_failure"):
        Policy.model_validate({**BASE, "connector": {"load_failure": "recompute"}})
    with pytest.raises(Exception, match="blocked_waiting"):
        Policy.model_validate({**BASE, "queue": {"blocked_waiting": "sometimes"}})


def test_trace_and_counterexample_fields_round_trip(tmp_path):
    specs = [spec(0, 20, grammar_steps=3), spec(1, 40, external_tokens=32, load_fails=True)]
    assert specs_from_json(requests_json(specs)) == specs
    path = tmp_path / "t.json"
    path.write_text(json.dumps(dump_json_trace(RequestSet(specs, ["default"], ["default"], "t"))))
    assert [(s.grammar_steps, s.load_fails) for s in load_json_trace(path).specs] == [(3, False), (0, True)]
    plain = dump_json_trace(RequestSet([spec(0, 20)], ["default"], ["default"], "t"))["requests"][0]
    assert "grammar_steps" not in plain and "load_fails" not in plain


@pytest.mark.parametrize("field, value", [("grammar_steps", -1), ("grammar_steps", 1.5), ("load_fails", 1)])
def test_arrivals_fields_are_refused_located(tmp_path, field, value):
    path = tmp_path / "a.json"
    path.write_text(json.dumps([{"id": "a", "arrival_step": 0, "prompt_tokens": 8, "output_tokens": 2, field: value}]))
    with pytest.raises(InputError, match=rf"\[0\]\.{field}"):
        load_arrivals(path)


def test_the_importer_maps_kv_load_failure_policy():
    from tests.connector_logs import policy_for

    from tests.vllm_connector_harness import flags

    assert policy_for(flags("--kv-load-failure-policy", "recompute"), "t").connector.load_failure == "recompute"
    assert policy_for(flags(), "t").connector.load_failure == "fail"
    from checker.importers import import_policy
    from tests.connector_logs import import_args

    args = [a.replace('"kv_role"', '"kv_load_failure_policy": "retry", "kv_role"') for a in import_args(flags())]
    with pytest.raises(InputError, match="kv_load_failure_policy fail or recompute"):
        import_policy("vllm", args, name="t")


# ---- refusals: z3, any-N, the liveness explorer, diff
SKIP = {"queue": {"blocked_waiting": "skip"}}
MAY_FAIL = {"connector": {"kind": "offload", "loads_may_fail": True}}


@pytest.mark.parametrize("sections, field", [(SKIP, "queue.blocked_waiting"), (MAY_FAIL, "connector.loads_may_fail")])
def test_the_solver_tools_refuse_the_new_fields_by_name(tmp_path, sections, field):
    from checker.diff.run import run_diff
    from checker.liveness.check import run_liveness
    from checker.verify.run import run_verify

    path = tmp_path / "p.json"
    path.write_text(json.dumps({**BASE, **sections}))
    # verify's bounded search encodes blocked waiting states (tests/quality/test_blocked_smt_finds.py); its proofs
    # and any-N do not
    calls = [lambda: run_verify(str(path), out_dir=None, proof_dir=None, unbounded=field != "connector.loads_may_fail"),
             lambda: run_verify(str(path), any_n=True, out_dir=None, proof_dir=None),
             *([] if field == "queue.blocked_waiting" else  # the explorer covers blocked waiting states
               [lambda: run_liveness(str(path), out_dir=None)]),
             lambda: run_diff(str(path), str(path))]
    for call in calls:
        with pytest.raises(InputError) as err:
            call()
        assert f"p.json:" in str(err.value) and field in str(err.value)


def test_the_z3_step_and_the_explorer_refuse_them_too():
    from checker.liveness.explore import LivenessEnv, explore
    from checker.smt.encode import SymbolicStep

    from checker.semantics.state import FIELDS
    from checker.smt.encode import SlotState

    proof_state = SlotState(slots=[{f: 0 for f in FIELDS}], next_seq=1, step=0, counters=[0])  # no ready_step
    with pytest.raises(InputError, match="queue.blocked_waiting"):
        SymbolicStep(None, policy(**SKIP), [], proof_state, 0, [])
    with pytest.raises(InputError, match="connector.loads_may_fail"):
        SymbolicStep(None, policy(**MAY_FAIL), [], proof_state, 0, [])
    with pytest.raises(InputError, match="connector.loads_may_fail"):
        explore(policy(**MAY_FAIL), LivenessEnv(requests=1, prompts=(16,), outputs=(2,)))


def test_verify_exits_2_on_the_command_line(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text(json.dumps({**BASE, **SKIP}))
    done = subprocess.run([sys.executable, "-m", "checker.cli", "verify", str(path), "--unbounded"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "queue.blocked_waiting" in done.stderr and "p.yaml:1" in done.stderr


# ---- fuzz stresses
def test_fuzz_draws_the_new_stresses_only_where_the_policy_chooses_them():
    from checker.fuzz.run import check_stresses
    from checker.fuzz.strategies import default_stresses

    assert "blocked_grammars" not in default_stresses(policy()) and "failed_loads" not in default_stresses(
        policy(connector=OFFLOAD))
    assert "blocked_grammars" in default_stresses(policy(**SKIP)) and "failed_loads" in default_stresses(
        policy(**MAY_FAIL))
    with pytest.raises(InputError, match="blocked_grammars"):
        check_stresses(["blocked_grammars"], policy())
    with pytest.raises(InputError, match="failed_loads"):
        check_stresses(["failed_loads"], policy())


def test_the_stresses_draw_grammars_and_failing_loads():
    from hypothesis import HealthCheck, given, settings

    from checker.fuzz.strategies import blocked_grammars, failed_loads, ranges
    from checker.workload import Workload
    from checker.loading import load_model

    w = load_model(Workload, "spec/workloads/chat_mixed.yaml")
    seen = {"grammar": 0, "fails": 0, "loads": 0}

    @settings(max_examples=30, database=None, suppress_health_check=list(HealthCheck), derandomize=True)
    @given(blocked_grammars(ranges(w), policy(**SKIP), 10), failed_loads(ranges(w), policy(**MAY_FAIL), 10))
    def draw(grammars, loads):
        seen["grammar"] += sum(d.grammar_steps > 0 for d in grammars)
        seen["loads"] += sum(d.external_tokens > 0 for d in loads)
        seen["fails"] += sum(d.load_fails for d in loads)
    draw()
    assert seen["grammar"] and seen["fails"] and seen["loads"] > seen["fails"]
    random.seed(0)
