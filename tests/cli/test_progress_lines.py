"""Progress lines when stderr is not a terminal (a CI log): every verb that runs longer than a few seconds
prints `batchcheck: VERB running (T s): LATEST MESSAGE` lines (issue 19); BATCHCHECK_PROGRESS=off turns them
off (tests/conftest.py does, for every other test)."""

from __future__ import annotations

import re

import pytest

from checker.cli import main
from checker.commands.shell import TerminalProgress
from tests.helpers import POLICIES, WORKLOADS

V1, SMALL_POOL = str(POLICIES / "vllm_v1.yaml"), str(POLICIES / "broken" / "vllm_v1_small_pool.yaml")
LINE = re.compile(r"^batchcheck: (\w[\w-]*) running \(\d+ s\)(: .+)?$")


@pytest.fixture
def quick_lines(monkeypatch):
    monkeypatch.setenv("BATCHCHECK_PROGRESS", "on")
    monkeypatch.setattr(TerminalProgress, "LINE_AFTER_S", 0.05)
    monkeypatch.setattr(TerminalProgress, "LINE_EVERY_S", 0.2)


def test_diff_prints_progress_lines_with_its_latest_message(capsys, tmp_path, quick_lines):
    code = main(["diff", V1, SMALL_POOL, "--invariant", "no_deadlock", "--requests", "2", "--depth", "3",
                 "--prompt-range", "1:4096", "--output-range", "1:8", "--out", str(tmp_path)])
    out, err = capsys.readouterr()
    assert code == 1 and out.startswith("diff vllm_v1 -> vllm_v1_small_pool: REGRESSION")
    lines = err.splitlines()
    assert lines and all(LINE.match(line) for line in lines), err
    assert {LINE.match(line).group(1) for line in lines} == {"diff"}
    assert any("no_deadlock" in (LINE.match(line).group(2) or "") for line in lines), err  # the latest message


def test_a_verb_without_progress_messages_gets_the_lines_too(capsys, quick_lines, monkeypatch):
    # simulate runs in 35 ms once the modules are loaded: the first line comes at once (the heartbeat waits 0 s)
    monkeypatch.setattr(TerminalProgress, "LINE_AFTER_S", 0.0)
    code = main(["simulate", V1, "--workload", str(WORKLOADS / "chat_mixed.yaml")])
    err = capsys.readouterr().err
    assert code == 0
    assert err.startswith("batchcheck: simulate running (0 s)\n")
    assert all(LINE.match(line).group(2) is None for line in err.splitlines())


def test_off_means_no_lines(capsys, monkeypatch):
    monkeypatch.setenv("BATCHCHECK_PROGRESS", "off")
    monkeypatch.setattr(TerminalProgress, "LINE_AFTER_S", 0.0)
    code = main(["diff", V1, SMALL_POOL, "--invariant", "no_deadlock", "--requests", "1", "--depth", "2",
                 "--prompt-range", "1:4096", "--output-range", "1:8", "--out", "none"])
    assert code == 1 and capsys.readouterr().err == ""
