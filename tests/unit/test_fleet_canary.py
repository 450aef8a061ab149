"""The canary: a policy change on a stable share of the requests (a hash of the session or the request, the same
on every run and for every retry), routed to the canary group's replicas only, judged against the rest on the same
arrivals: rolled back when a declared condition is met on a class both arms served enough of, promoted when none
is, undecided (exit 3) with why when an arm served too few. The shipped pair: a worse policy rolled back, a
neutral change promoted."""

from __future__ import annotations

import json

import pytest

from checker.cli import main
from checker.errors import InputError
from checker.fleet import canary
from checker.fleet.run import run_fleet
from checker.fleet.spec import load_fleet
from checker.requests import RequestSpec
from tests.helpers import WORKLOADS
from tests.unit.test_fleet_cli import FLEETS

ROLLBACK, PROMOTE = FLEETS / "canary_rollback.yaml", FLEETS / "canary_promote.yaml"


def verdict(run) -> str:
    return next(f.verdict for f in run.findings if f.prop.name == "canary")


def test_a_worse_policy_is_rolled_back_and_a_neutral_change_promoted(capsys):
    worse, neutral = run_fleet(ROLLBACK), run_fleet(PROMOTE)
    w, n = worse.summary["canary"], neutral.summary["canary"]
    assert (w["verdict"], verdict(worse), n["verdict"], verdict(neutral)) == ("rollback", "VIOLATED", "promote",
                                                                             "HOLDS")
    row = w["classes"]["interactive"]
    assert row["judged"] and row["canary"]["ttft_p99_ms"] > 4 * row["baseline"]["ttft_p99_ms"]
    assert w["observed"] == row["ttft_p99_worse_ms"] > 500 == w["allowed"]
    assert "interactive: canary p99 TTFT" in w["why"][0]
    assert 0 <= n["observed"] <= 500 and n["classes"]["interactive"]["judged"]
    # the same requests go to the canary in both files: the assignment is the hash, not the run
    assert worse.result.arms == neutral.result.arms and w["requests"] == n["requests"]
    assert main(["simulate", "--fleet", str(PROMOTE), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["canary"]["verdict"] == "promote"
    assert main(["fleet", str(ROLLBACK)]) == 1
    out = capsys.readouterr().out
    assert "canary: group canary (canary; 25% of requests by session, 71 requests): ROLLBACK" in out
    assert "VIOLATED  canary                       observed 4130.821 > allowed 500.0 (rollback" in out


def test_too_few_requests_in_an_arm_is_undecided_and_exits_3(capsys):
    run = run_fleet(PROMOTE, limit=60)
    c = run.summary["canary"]
    assert c["verdict"] == "undecided" and verdict(run) == "UNKNOWN" and not run.decided and not run.violated
    assert c["why"] == ["interactive: 8 served on the canary, 44 on the baseline (a class is judged from 50 in each)"]
    assert main(["fleet", str(PROMOTE), "--limit", "60"]) == 3
    assert "UNKNOWN   canary                       undecided (canary: 25% of requests by session): interactive: 8" \
        in capsys.readouterr().out


def test_assignment_is_stable_and_every_attempt_stays_in_its_arm():
    full, first = run_fleet(ROLLBACK), run_fleet(ROLLBACK, limit=100)
    assert first.result.arms == full.result.arms[:100]  # a request's arm does not depend on the others
    arms = full.result.arms
    assert 0.15 < sum(arms) / len(arms) < 0.35  # about the declared share (25 %: one replica of four)
    on_canary = canary.canary_replicas(full.fleet)
    assert on_canary == {3}
    for att in full.result.attempts:
        assert (att.replica in on_canary) == arms[att.request]
    fleet = load_fleet(ROLLBACK)
    turn = RequestSpec(0, 0, 100, 10, 10, 0, 0, 0, None, ((7, 64), (9, 36)))
    later = RequestSpec(5, 9_000_000, 300, 10, 10, 0, 0, 0, None, ((7, 64), (9, 36), (11, 200)))
    other = RequestSpec(6, 0, 100, 10, 10, 0, 0, 0, None, ((8, 64), (9, 36)))
    shares = [f / 50 for f in range(1, 50)]
    arm = {name: [canary.in_canary(fleet.spec.canary, f, i, spec) for f in shares]
           for name, i, spec in (("turn", 0, turn), ("later", 41, later), ("other", 6, other))}
    assert arm["turn"] == arm["later"]  # two turns of one session (the same first run): one arm at any share
    assert arm["other"] != arm["turn"]  # another session hashes elsewhere
    picks = [canary.in_canary(fleet.spec.canary, 0.5, i, RequestSpec(i, 0, 100, 10, 10, 0, 0, 0)) for i in range(400)]
    assert 150 < sum(picks) < 250  # requests of their own tokens: each its own session, hashed by index


def test_a_fleet_without_a_canary_reports_none():
    run = run_fleet(FLEETS / "mixed_least_outstanding.yaml", limit=20)
    assert "canary" not in run.summary and run.result.arms is None
    assert all(f.prop.kind != "canary" for f in run.findings)


BASE = ("replicas:\n  - {name: a, policy: vllm_v1, count: 2}\n  - {name: b, policy: vllm_v1}\n"
        "workload: chat_mixed\n")


@pytest.mark.parametrize("body, message", [
    ("canary: {group: c, rollback: {ttft_p99_worse_ms: 5}}\n",
     "{f}:6: canary.group='c' (expected a replica group of the fleet: a, b)"),
    ("canary: {group: b, share: 1, rollback: {ttft_p99_worse_ms: 5}}\n",
     "{f}:6: canary.share=1 (expected a number < 1)"),
    ("canary: {group: b, rollback: {}}\n",
     "{f}:6: canary.rollback.ttft_p99_worse_ms=None (expected at least one rollback condition: ttft_p99_worse_ms (ms) "
     "or lost_share_worse (a share))"),
    ("canary: {group: b, key: tenant, rollback: {lost_share_worse: 0.1}}\n",
     "{f}:6: canary.key='tenant' (expected one of: session or request)"),
    ("canary: {group: b, classes: [chat], rollback: {lost_share_worse: 0.1}}\n",
     "{f}: canary.classes='chat' (expected a class of the requests: interactive, background)"),
])
def test_canary_errors_are_located(tmp_path, capsys, body, message):
    path = tmp_path / "fleet.yaml"
    path.write_text("format: batchcheck-fleet\n" + BASE + body)
    assert main(["fleet", str(path), "--limit", "5"]) == 2
    err = capsys.readouterr().err
    assert message.format(f=path) in err and "Traceback" not in err, err


def test_a_canary_group_alone_is_refused(tmp_path):
    path = tmp_path / "fleet.yaml"
    path.write_text("format: batchcheck-fleet\nreplicas:\n  - {name: b, policy: vllm_v1, count: 2}\n"
                    "canary: {group: b, rollback: {lost_share_worse: 0.1}}\n")
    with pytest.raises(InputError) as exc:
        load_fleet(path)
    assert str(exc.value) == (f"{path}:4: canary.group='b' (expected a group beside others (the baseline is the "
                              "replicas of the other groups))")
