"""The same input gives the same verdict (issue 19): a time budget (or a loaded machine) may turn a verdict into
UNKNOWN, never one decided verdict into another. Identical runs once gave kv_never_overcommitted PROVED twice and
VACUOUS once, and `--requests 2 --depth 8` VACUOUS on one run and HOLDS_UP_TO on another: the vacuity side checks
(is the invariant's situation reachable?) had a share of the clock. They are now bounded by z3's resource count
(deterministic), or decided by arithmetic.

"Load" is simulated without timing anything: the process clock (time.monotonic) jumps far ahead when the bounded
search's last query is asked, as if the machine had stalled there; the verdict must be the idle run's or UNKNOWN.
No assertion here reads a duration."""

from __future__ import annotations

import time

import pytest
import yaml

from checker.api import run_verify
from checker.smt.ops import SmtSession
from checker.verify.run import Verdict
from tests.helpers import POLICIES

V1 = POLICIES / "vllm_v1.yaml"
BROKEN = POLICIES / "broken" / "unchecked_growth.yaml"


def _verdicts(tmp_path, policy, invariant, **kw) -> list[Verdict]:
    _, results = run_verify(policy, [invariant], out_dir=tmp_path / "cx", proof_dir=tmp_path / "proofs", **kw)
    return [r.verdict for r in results]


@pytest.fixture
def stall_at_last_depth(monkeypatch):
    """Make the clock jump an hour ahead when the query of the last depth (``fails@K-1``) is asked: every check
    after it sees its time spent, as on a machine that stalled there."""
    real = time.monotonic
    offset = [0.0]

    def arm(depth: int) -> None:
        check = SmtSession.check

        def stalling(self, *assumptions):
            if any(str(a) == f"fails@{depth - 1}" for a in assumptions):
                offset[0] = 3600.0
            return check(self, *assumptions)

        monkeypatch.setattr(SmtSession, "check", stalling)
        monkeypatch.setattr(time, "monotonic", lambda: real() + offset[0])

    return arm


# (policy, invariant, keyword arguments of run_verify): bounded searches whose vacuity side check runs after the
# last depth (the window a clock-bounded check lost on a loaded machine)
BOUNDED = [
    (BROKEN, "cancellation_releases:0", dict(requests=2, depth=3, prompt=(1, 64), cancellations=False)),
    (BROKEN, "token_budget", dict(requests=2, depth=3, prompt=(1, 64))),
    (V1, "seq_cap", dict(requests=2, depth=3)),
]


@pytest.mark.parametrize("policy, invariant, kw", BOUNDED, ids=[c[1] for c in BOUNDED])
def test_a_stall_after_the_last_depth_does_not_change_the_bounded_verdict(tmp_path, stall_at_last_depth, policy,
                                                                          invariant, kw):
    idle = _verdicts(tmp_path / "idle", policy, invariant, timeout_s=120, **kw)
    stall_at_last_depth(kw["depth"])
    loaded = _verdicts(tmp_path / "loaded", policy, invariant, timeout_s=120, **kw)
    assert idle[0] is not Verdict.UNKNOWN
    assert loaded[0] in (idle[0], Verdict.UNKNOWN), (idle, loaded)


def test_a_stall_does_not_turn_vacuous_into_holds(tmp_path, stall_at_last_depth):
    """vllm_v1 on a 2,000-block pool: two requests could hold it (2 x 1,024 blocks), but not within 2 iterations of
    8,192 tokens: VACUOUS (not reached within the bounds), which z3 decides in its trigger check after the last
    depth. A clock-bounded check that found its time spent there said HOLDS_UP_TO instead."""
    doc = yaml.safe_load(V1.read_text(encoding="utf-8"))
    doc["kv"]["num_blocks"] = 2000
    policy = tmp_path / "small_pool.yaml"
    policy.write_text(yaml.safe_dump(doc), encoding="utf-8")
    kw = dict(requests=2, depth=2, timeout_s=120)
    idle = _verdicts(tmp_path / "idle", policy, "kv_never_overcommitted", **kw)
    stall_at_last_depth(2)
    loaded = _verdicts(tmp_path / "loaded", policy, "kv_never_overcommitted", **kw)
    assert idle == [Verdict.VACUOUS]
    assert loaded[0] in (Verdict.VACUOUS, Verdict.UNKNOWN), loaded


@pytest.mark.parametrize("timeout_s", [0.01, 600])
def test_the_issue_case_is_vacuous_whatever_the_budget(tmp_path, timeout_s):
    """`verify vllm_v1.yaml --invariant kv_never_overcommitted --requests 2 --depth 8` (bounded): VACUOUS in 70 s on
    one run, HOLDS_UP_TO in 120 s on another. Two requests cannot hold the 2,500-block pool (2 x 1,024 blocks):
    the situation never occurs, by arithmetic, whatever the budget (here 10 ms and 10 min)."""
    _, (checked,) = run_verify(V1, ["kv_never_overcommitted"], requests=2, depth=8, timeout_s=timeout_s,
                               out_dir=tmp_path / "cx", proof_dir=tmp_path / "proofs")
    assert checked.verdict is Verdict.VACUOUS and checked.never_occurs


def test_proof_with_two_very_different_budgets(tmp_path):
    """The default (the proof first) on the shipped vllm_v1 with a 1 s and a 10 min budget: the same verdict,
    or UNKNOWN with the small one."""
    big = _verdicts(tmp_path / "big", V1, "request_conservation", requests=2, depth=2, timeout_s=600,
                    unbounded=True)
    small = _verdicts(tmp_path / "small", V1, "request_conservation", requests=2, depth=2, timeout_s=1,
                      unbounded=True)
    assert big == [Verdict.PROVED]
    assert small[0] in (Verdict.PROVED, Verdict.UNKNOWN), small


def test_a_proof_cut_by_the_clock_never_leaves_a_vacuous_verdict(tmp_path, monkeypatch):
    """When the action-wise proof does not finish in time (simulated: it answers "unknown", as on a clock cut), the
    bounded search goes on; a bounded VACUOUS then could contradict the PROVED the finished proof gives, so it is
    UNKNOWN, saying what was tried and what to try next. The same check with the proof finishing: PROVED."""
    from checker.verify import actions
    from checker.verify.induction import InductionResult

    # vllm_v1, N raised to 3 for the pool: the pool fills at iteration 7 of an engine run, not within 2 iterations
    policy, kw = V1, dict(requests=2, depth=2, timeout_s=120, unbounded=True)
    _, (finished,) = run_verify(policy, ["kv_never_overcommitted"], out_dir=tmp_path / "a", proof_dir=tmp_path, **kw)
    monkeypatch.setattr(actions, "prove", lambda *a, **k: InductionResult("unknown", 0.0))
    _, (cut,) = run_verify(policy, ["kv_never_overcommitted"], out_dir=tmp_path / "b", proof_dir=tmp_path, **kw)
    assert finished.verdict is Verdict.PROVED
    assert cut.verdict is Verdict.UNKNOWN
    assert "the action-wise proof did not finish within the time given" in cut.line()
    assert "try next: more time (--timeout 360)" in cut.line()
