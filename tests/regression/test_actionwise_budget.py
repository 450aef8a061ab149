"""Issue 19: ``--timeout`` is honoured by every verify phase. The action-wise proof ran past its share of the budget
(``verify vllm_v1.yaml --unbounded --requests 16 --timeout 60``: 121 s on kv_never_overcommitted), because each
query of an action got the whole time left (a loop of queries, each up to it) and building the queries and the
engine probes looked at no clock. Now each query gets only what is left to the deadline and the Python work is
interrupted at it (checker/verify/budget.py); without a clock (the vacuity side checks' resource count) nothing
changes."""

from __future__ import annotations

import time

from checker.inputfiles import load_policy
from checker.smt.ops import SmtSession
from checker.verify import actions
from checker.verify.env import default_environment
from invariants.catalogue import CATALOGUE
from tests.helpers import POLICIES


def test_a_query_past_the_deadline_is_unknown_without_asking_the_solver(monkeypatch):
    def no_solver(self, *assumptions):
        raise AssertionError("the solver was asked after the deadline")

    monkeypatch.setattr(SmtSession, "check", no_solver)
    smt = SmtSession()
    goals = [("g", smt.bool_var("g"))]
    status, dropped, _ = actions._drop_until_unsat(smt, goals, deadline=time.monotonic() - 1)
    assert (status, dropped) == ("unknown", set())


def test_work_between_queries_is_cut_at_the_budget(monkeypatch):
    """Building an action's queries (plain Python) past the budget: the proof stops, UNKNOWN, at the budget."""
    def building_forever(*args, **kwargs):
        until = time.monotonic() + 30
        while time.monotonic() < until:  # Python work with no clock of its own (as the step encoding)
            pass
        raise AssertionError("the proof's budget was not honoured while its queries were being built")

    monkeypatch.setattr(actions, "_survives", building_forever)
    policy = load_policy(POLICIES / "vllm_v1.yaml")
    result = actions.prove(policy, CATALOGUE["seq_cap"], {}, default_environment(policy, 2, 2), 0.5)
    assert result.status == "unknown"


