"""`replay LASSO --policy P` of a lasso found with --set overrides re-applies them (issue: it dropped them
and printed "holds on this trace: the policy no longer fails it" against the very policy it was found on)."""

from __future__ import annotations

from checker.api import run_liveness
from checker.cli import main
from tests.helpers import POLICIES


def test_a_lasso_found_with_overrides_still_fails_its_own_policy(tmp_path, capsys):
    policy = POLICIES / "strict_priority.yaml"
    report = run_liveness(policy, ["eventually_served"], overrides=["batch.max_num_seqs=1"], out_dir=tmp_path)
    (lasso,) = [r.counterexample for r in report.results if r.counterexample is not None]
    capsys.readouterr()
    assert main(["replay", str(lasso), "--policy", str(policy)]) == 1
    out = capsys.readouterr().out
    assert "with the overrides it was found with (batch.max_num_seqs=1)" in out.splitlines()[0]
    assert out.splitlines()[-1].startswith("eventually_served VIOLATED at iteration")
