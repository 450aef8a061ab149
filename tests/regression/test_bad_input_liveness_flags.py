"""liveness's own flags are validated like every numeric flag (issue 23): huge or zero values exit 2 with the
range, and `--arrivals-per-step 0`, an instance in which nothing ever arrives, is refused instead of PROVING
every property on an empty system (also in batchcheck.toml)."""

from __future__ import annotations

import pytest

from checker.cli import main
from tests.helpers import POLICIES

POLICY = str(POLICIES / "strict_priority.yaml")


@pytest.mark.parametrize("argv, message", [
    (["--arrivals-per-step", "0"], "argument --arrivals-per-step: '0' (expected a whole number >= 1 and <= 64)"),
    (["--tenants", "9223372036854775808"], "argument --tenants: '9223372036854775808' (expected a whole number of "
                                           "tenants >= 1 and <= 64)"),
    (["--requests", "20"], "argument --requests: '20' (expected a whole number of requests >= 1 and <= 16)"),
    (["--requests", "0"], "argument --requests: '0' (expected a whole number of requests >= 1 and <= 16)"),
    (["--max-states", "0"], "argument --max-states: '0' (expected a whole number of states >= 1 and <= 100,000,000)"),
    (["--timeout", "nan"], "argument --timeout: 'nan'"),
])
def test_liveness_flags_out_of_range_exit_2(capsys, argv, message):
    with pytest.raises(SystemExit) as exit_:
        main(["liveness", POLICY, *argv])
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err


def test_the_library_refuses_an_instance_where_nothing_arrives():
    from checker.api import run_liveness
    from checker.errors import InputError

    with pytest.raises(InputError) as error:
        run_liveness(POLICY, arrivals_per_step=0, out_dir=None)
    assert "--arrivals-per-step=0 (expected >= 1 (with 0 nothing ever arrives" in str(error.value)
