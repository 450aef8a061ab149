"""replay and report of a counterexample of a user invariant: the file records the invariant's module and
they load it again (or take --invariant-module) (issue 19)."""

from __future__ import annotations

import json

from checker.cli import main
from invariants.catalogue import CATALOGUE
from tests.helpers import POLICIES

BROKEN = POLICIES / "broken" / "unchecked_growth.yaml"
PLUGIN = '''
from invariants import invariant
from checker.semantics.state import Status


def at_most_one_running(o, ctx, t):
    """At most one request runs at a time."""
    return sum(o.b2i(s["status"] == int(Status.RUNNING)) for s in ctx.frames[t].slots) <= 1


def two_arrived(o, ctx, t):
    return sum(o.b2i(s["status"] != int(Status.PENDING)) for s in ctx.frames[t].slots) >= 2


INVARIANTS = [invariant(at_most_one_running, two_arrived)]
'''


def _found(capsys, tmp_path):
    plugin = tmp_path / "my_invariants.py"
    plugin.write_text(PLUGIN)
    code = main(["verify", str(BROKEN), "--invariant-module", str(plugin), "--invariant", "at_most_one_running",
                 "--requests", "2", "--depth", "3", "--prompt-range", "1:32", "--out", str(tmp_path / "cex")])
    capsys.readouterr()
    assert code == 1
    (cex,) = (tmp_path / "cex").glob("*.json")
    CATALOGUE.pop("at_most_one_running")  # as in a fresh process: the user invariant is not loaded
    return plugin, cex


def test_replay_and_report_load_the_module_the_counterexample_records(capsys, tmp_path):
    plugin, cex = _found(capsys, tmp_path)
    assert json.loads(cex.read_text())["property"]["module"] == str(plugin)
    code = main(["replay", str(cex)])
    out, err = capsys.readouterr()
    assert (code, err) == (1, "")
    assert out.splitlines()[-1] == "at_most_one_running VIOLATED at iteration 0 (recorded: iteration 0)"
    CATALOGUE.pop("at_most_one_running")
    code = main(["report", str(cex), "--out", str(tmp_path / "reports")])
    out, err = capsys.readouterr()
    assert (code, err) == (0, "")
    assert out.startswith(f"{tmp_path / 'reports' / cex.stem}.md: bug report (at_most_one_running VIOLATED")


def test_a_recorded_module_that_is_gone_is_named_and_invariant_module_replaces_it(capsys, tmp_path):
    plugin, cex = _found(capsys, tmp_path)
    moved = tmp_path / "moved.py"
    plugin.rename(moved)
    code = main(["replay", str(cex)])
    assert code == 2
    err = capsys.readouterr().err  # the path is shortened past 80 characters, as every value in a message
    assert err.startswith(f"batchcheck: error: {cex}: property.module=")
    assert err.endswith(" (expected an existing .py file or an importable module: the module of user invariant "
                        "at_most_one_running, recorded when it was found (give it with --invariant-module))\n")
    code = main(["replay", str(cex), "--invariant-module", str(moved)])
    out, err = capsys.readouterr()
    assert (code, err) == (1, "")
    assert out.splitlines()[-1] == "at_most_one_running VIOLATED at iteration 0 (recorded: iteration 0)"


def test_a_builtin_invariant_counterexample_records_no_module(capsys, tmp_path):
    code = main(["verify", str(POLICIES / "broken" / "vllm_v1_small_pool.yaml"), "--invariant", "no_deadlock",
                 "--requests", "1", "--depth", "2", "--prompt-range", "1:4096", "--output-range", "1:8",
                 "--out", str(tmp_path)])
    capsys.readouterr()
    assert code == 1
    (cex,) = tmp_path.glob("*.json")
    assert "module" not in json.loads(cex.read_text())["property"]
