"""VACUOUS split in two (issue 19): "never occurs at any depth" (proved) vs "not reached within the bounds",
told apart in the JSON (vacuity) and, with verify --split-vacuous, by the exit code (4 vs 3); without the
flag both exit 3 as before."""

from __future__ import annotations

import json

from checker.cli import main
from checker.exitcodes import ExitCode
from checker.verify.env import default_environment
from checker.verify.run import Checked, Verdict, overall_exit
from invariants.catalogue import CATALOGUE
from tests.helpers import POLICIES

V1 = str(POLICIES / "vllm_v1.yaml")


def _checked(verdict: Verdict, never_occurs: bool = False) -> Checked:
    from checker.inputfiles import load_policy

    env = default_environment(load_policy(V1), 2, 2)
    return Checked(CATALOGUE["kv_never_overcommitted"], {}, verdict, env, 0.0, never_occurs=never_occurs)


def test_the_exit_codes_of_the_two_kinds():
    never, within = _checked(Verdict.VACUOUS, True), _checked(Verdict.VACUOUS)
    proved, violated = _checked(Verdict.PROVED), _checked(Verdict.VIOLATED)
    assert (never.vacuity, within.vacuity, proved.vacuity) == (
        "never occurs at any depth", "not reached within the bounds", None)
    assert overall_exit([never, proved]) == ExitCode.INCONCLUSIVE  # unchanged without the flag
    assert overall_exit([never, proved], split_vacuous=True) == ExitCode.NEVER_OCCURS == 4
    assert overall_exit([never, within], split_vacuous=True) == ExitCode.INCONCLUSIVE
    assert overall_exit([never, violated], split_vacuous=True) == ExitCode.VIOLATED
    assert overall_exit([proved], split_vacuous=True) == ExitCode.OK


def test_not_reached_within_the_bounds_still_exits_3_with_the_flag(capsys, tmp_path):
    code = main(["verify", V1, "--invariant", "cancellation_releases:0", "--requests", "2", "--depth", "3",
                 "--prompt-range", "1:64", "--no-cancellations", "--out", str(tmp_path), "--split-vacuous", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 3 and doc["exit_code"] == 3
    assert [(r["verdict"], r["vacuity"]) for r in doc["results"]] == [("VACUOUS", "not reached within the bounds")]


def test_never_occurs_at_any_depth_exits_4_with_the_flag(capsys, tmp_path):
    # two requests of prompts up to 512 tokens cannot fill the shipped pool (2,500 blocks; 76 such requests could,
    # more than verify raises N to for kv_never_overcommitted): it never occurs, by arithmetic (2 x 33 blocks).
    # A rule the proof for any N does not cover (a prefill threshold not applied to a request alone reads how
    # many requests are eligible) keeps that arithmetic answer: on the plain policy the default proves it for any N
    policy = tmp_path / "threshold_not_alone.yaml"
    policy.write_text(open(V1).read().replace("  long_prefill_token_threshold: 0",
                                              "  long_prefill_token_threshold: 256\n  threshold_when_alone: false"))
    argv = ["verify", str(policy), "--invariant", "kv_never_overcommitted", "--requests", "2", "--depth", "2",
            "--unbounded", "--prompt-range", "1:512", "--timeout", "400", "--out", str(tmp_path), "--json"]
    code = main(argv + ["--split-vacuous"])
    doc = json.loads(capsys.readouterr().out)
    assert [(r["verdict"], r["vacuity"]) for r in doc["results"]] == [("VACUOUS", "never occurs at any depth")]
    assert code == 4 and doc["exit_code"] == 4
