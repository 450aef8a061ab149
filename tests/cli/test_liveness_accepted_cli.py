"""`--accepted LIST` on `liveness` and `verify --liveness` (speculative decoding: the drafts the verifier may accept
in a step): bad values exit 2 with a located message, never a traceback; a good one is stated with the verdicts."""

from __future__ import annotations

import json

import pytest

from checker.cli import main
from tests.helpers import POLICIES

DEADLOCK = str(POLICIES / "broken" / "eagle_lookahead_deadlock.yaml")
PLAIN = str(POLICIES / "vllm_v1.yaml")
INSTANCE = ["--prompts", "8", "--outputs", "2"]


@pytest.mark.parametrize("verb", [["liveness"], ["verify", "--liveness"]], ids=["liveness", "verify"])
@pytest.mark.parametrize("policy, value, message", [
    (DEADLOCK, "0,5", "--accepted='0,5' (expected draft counts in 0..4 (speculative.num_tokens=4"),
    (DEADLOCK, "-1", "--accepted='-1' (expected draft counts in 0..4"),
    (PLAIN, "0", "--accepted='0' (expected only with speculative decoding (speculative.method other than none"),
    (DEADLOCK, "two", "argument --accepted: 'two' (expected integers like 16,48 or a range like 1:4)"),
])
def test_bad_accepted_counts_exit_2_located(tmp_path, capsys, verb, policy, value, message):
    try:
        code = main([*verb, policy, *INSTANCE, "--accepted", value, "--out", str(tmp_path)])
    except SystemExit as exit_:  # argparse's own refusal
        code = exit_.code
    err = capsys.readouterr().err
    assert code == 2 and message in err and "Traceback" not in err, err


def test_accepted_is_stated_and_recorded(tmp_path, capsys):
    code = main(["liveness", DEADLOCK, *INSTANCE, "--accepted", "0:1", "--property", "no_deadlock", "--json",
                 "--out", str(tmp_path)])
    doc = json.loads(capsys.readouterr().out)
    assert code == 1 and doc["environment"]["accepted_drafts"] == [0, 1]
    assert any("of how many it accepts, in {0, 1}" in line for line in doc["assumptions"])
