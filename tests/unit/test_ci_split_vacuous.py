"""``[gate] split_vacuous`` in batchcheck.toml (issue 19): ci offers verify --split-vacuous's exit codes. A gating
VACUOUS whose situation never occurs at any depth (proved) gives exit 4 when nothing else gates; one not reached
within the bounds, an UNKNOWN or a violation keep 3 / 1; off (the default) every VACUOUS is inconclusive (3)."""

from __future__ import annotations

import pytest

from checker.ci.config import load_config
from checker.ci.findings import Finding
from checker.ci.results import Result
from checker.ci.run import exit_code
from checker.errors import InputError
from checker.exitcodes import ExitCode


def _finding(verdict: str, vacuity: str | None = None, gating: bool = True) -> Finding:
    result = Result(verdict, f"{verdict} ...", {"verdict": verdict, "vacuity": vacuity}, 0.0)
    return Finding(None, result, "", 0, gating)  # exit_code reads the verdict and whether it gates only


NEVER = _finding("VACUOUS", "never occurs at any depth")
WITHIN = _finding("VACUOUS", "not reached within the bounds")
PROVED, UNKNOWN, VIOLATED = _finding("PROVED"), _finding("UNKNOWN"), _finding("VIOLATED")


def test_the_exit_codes_with_and_without_the_split():
    assert exit_code([NEVER, PROVED]) == ExitCode.INCONCLUSIVE  # off: unchanged
    assert exit_code([NEVER, PROVED], split_vacuous=True) == ExitCode.NEVER_OCCURS == 4
    assert exit_code([NEVER, WITHIN], split_vacuous=True) == ExitCode.INCONCLUSIVE
    assert exit_code([NEVER, UNKNOWN], split_vacuous=True) == ExitCode.INCONCLUSIVE
    assert exit_code([NEVER, VIOLATED], split_vacuous=True) == ExitCode.VIOLATED
    assert exit_code([PROVED, _finding("VACUOUS", "never occurs at any depth", gating=False)],
                     split_vacuous=True) == ExitCode.OK  # a warning-level check does not gate
    assert exit_code([PROVED], split_vacuous=True) == ExitCode.OK


def test_the_key_is_read_and_checked(tmp_path):
    config = tmp_path / "batchcheck.toml"
    body = 'policies = ["p.yaml"]\n[[verify]]\ninvariants = ["seq_cap"]\n'
    config.write_text(body)
    assert load_config(config)[0].gate.split_vacuous is False
    config.write_text(body + "[gate]\nsplit_vacuous = true\n")
    assert load_config(config)[0].gate.split_vacuous is True
    config.write_text(body + '[gate]\nsplit_vacuous = "yes please"\n')
    with pytest.raises(InputError, match="split_vacuous"):
        load_config(config)
