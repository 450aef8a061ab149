"""ci under faults (issue 23): a SIGKILLed ``ci --jobs 2`` leaves no worker running (they die with their parent:
checker.childproc) and no partial or corrupt file in its output folder (every file there parses; a temporary
file a killed write left is removed by the next write there: checker.fileio.clean_stale_temporaries); and a
fuzz counterexample names the project's workload and SLO files, not the worker's deleted copies."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
import xml.dom.minidom
from pathlib import Path

import pytest

from checker.fileio import _host, clean_stale_temporaries, write_atomic
from tests.cli.test_cli import run
from tests.helpers import POLICIES, ROOT

FUZZ_CONFIG = '''policies = ["spec/strict_priority.yaml"]
[[fuzz]]
workload = "spec/w.yaml"
slo = "spec/s.slo.yaml"
max_examples = 30
time_budget_s = 20
[output]
counterexamples = "out/cex"
junit = "out/junit.xml"
sarif = "out/ci.sarif"
summary = "out/summary.md"
'''
SLO = ("format: batchcheck-slo\nproperties:\n  - {kind: latency, name: low_queue_max, class: low, "
       "metric: queue_delay_ms, stat: max, bound_ms: 50}\n")
# Busy workers: four checks of a few seconds each on two processes, each writing its files at the end.
BUSY_CONFIG = '''policies = ["spec/*.yaml"]
jobs = 2
[defaults]
requests = 3
depth = 4
timeout_s = 20
[[verify]]
invariants = ["kv_never_overcommitted", "token_budget"]
[output]
counterexamples = "out/cex"
proofs = "out/proofs"
junit = "out/junit.xml"
sarif = "out/ci.sarif"
summary = "out/summary.md"
'''


def _fuzz_project(tmp_path: Path) -> Path:
    (tmp_path / "spec").mkdir()
    shutil.copy(POLICIES / "strict_priority.yaml", tmp_path / "spec")
    shutil.copy(ROOT / "spec" / "workloads" / "weakness_strict_priority.yaml", tmp_path / "spec" / "w.yaml")
    (tmp_path / "spec" / "s.slo.yaml").write_text(SLO)
    (tmp_path / "batchcheck.toml").write_text(FUZZ_CONFIG)
    return tmp_path


def test_a_fuzz_counterexample_names_the_project_files_not_the_workers_copies(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(_fuzz_project(tmp_path))
    code, out, err = run(capsys, "ci", "--jobs", "1")
    assert code == 1, err
    (found,) = (tmp_path / "out" / "cex").glob("*.json")
    doc = json.loads(found.read_text())
    assert (doc["environment"]["workload"], doc["environment"]["slo"]) == ("spec/w.yaml", "spec/s.slo.yaml")
    assert doc["policy"]["file"] == "spec/strict_priority.yaml"
    for path in (tmp_path / "out").rglob("*"):
        assert "batchcheck-ci-" not in (path.read_text() if path.is_file() else ""), path


def _children(pid: int) -> set[int]:
    """The pids whose parent is ``pid`` (from /proc)."""
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.add(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _parses(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    if path.suffix in (".json", ".sarif"):
        json.loads(text)
    elif path.suffix == ".xml":
        xml.dom.minidom.parseString(text)
    elif path.suffix == ".smt2":
        assert text.strip(), path
    else:
        assert path.suffix == ".md" and text.strip(), path


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the process table from /proc")
def test_sigkill_of_ci_jobs_2_leaves_no_worker_and_no_partial_file(tmp_path):
    (tmp_path / "spec").mkdir()
    for name in ("vllm_v1.yaml", "sarathi_serve.yaml"):
        shutil.copy(POLICIES / name, tmp_path / "spec")
    (tmp_path / "batchcheck.toml").write_text(BUSY_CONFIG)
    rnd = random.Random(23)
    for attempt in range(3):
        proc = subprocess.Popen([sys.executable, "-m", "checker.cli", "ci"], cwd=tmp_path, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
        workers: set[int] = set()
        deadline = time.monotonic() + 60
        while len(workers) < 2 and time.monotonic() < deadline and proc.poll() is None:
            workers |= _children(proc.pid)
            time.sleep(0.05)
        assert workers, "ci started no worker"
        time.sleep(rnd.uniform(0, 4))  # a random moment while the workers run (or write, or have finished)
        workers |= _children(proc.pid)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        grace = time.monotonic() + 5
        while any(_alive(w) for w in workers) and time.monotonic() < grace:
            time.sleep(0.1)
        assert not [w for w in workers if _alive(w)], f"attempt {attempt}: workers alive 5 s after the SIGKILL"
        out = tmp_path / "out"
        for path in out.rglob("*") if out.is_dir() else []:
            if path.is_file() and not path.name.endswith(".tmp"):
                _parses(path)


def test_the_next_write_removes_only_the_temporaries_of_killed_writers(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)
    host = _host()
    stale = tmp_path / f".summary.md.bc{dead_pid}-{host}.abcd_123.tmp"
    live = tmp_path / f".junit.xml.bc{os.getppid()}-{host}.abcd_123.tmp"  # a running process's write
    other_host = tmp_path / f".x.json.bc{dead_pid}-{'0' * 8 if host != '0' * 8 else '1' * 8}.abcd_123.tmp"
    foreign = tmp_path / ".notes.tmp"  # not a name batchcheck's writer makes
    for path in (stale, live, other_host, foreign):
        path.write_text("partial")
    write_atomic(tmp_path / "summary.md", "# done\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([live.name, other_host.name, foreign.name,
                                                                 "summary.md"])
    stale.write_text("partial")
    assert clean_stale_temporaries(tmp_path) == []  # once per folder and process


# A quick check, then one that runs far longer than the test waits (an 8-slot, 40-iteration bounded search).
CUT_CONFIG = '''policies = ["spec/vllm_v1.yaml"]
[output]
counterexamples = "out/cex"
junit = "out/junit.xml"
sarif = "out/ci.sarif"
summary = "out/summary.md"
[[verify]]
invariants = ["seq_cap"]
requests = 1
depth = 1
unbounded = false
[[verify]]
invariants = ["token_budget"]
requests = 8
depth = 40
timeout_s = 3600
unbounded = false
'''


def test_a_run_cut_short_keeps_its_finished_findings_on_disk(tmp_path):
    """Issue 19: ``ci`` writes each finding (JUnit, SARIF, summary) as it completes, so a CI job's timeout keeps
    what was done. Before, every file was written only after the last check: a run killed during its second
    check left nothing."""
    (tmp_path / "spec").mkdir()
    shutil.copy(POLICIES / "vllm_v1.yaml", tmp_path / "spec")
    (tmp_path / "batchcheck.toml").write_text(CUT_CONFIG)
    proc = subprocess.Popen([sys.executable, "-m", "checker.cli", "ci", "--jobs", "1"], cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    summary = tmp_path / "out" / "summary.md"
    try:
        deadline = time.monotonic() + 300  # the first check takes about a second; the second far longer
        while not summary.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        proc.send_signal(signal.SIGKILL)  # the CI job's timeout
        proc.wait()
    assert summary.exists(), "no summary on disk while the run was going"
    text = summary.read_text()
    assert "unfinished (1 of 2 checks finished)" in text and "seq_cap" in text and "token_budget" not in text
    junit = xml.dom.minidom.parseString((tmp_path / "out" / "junit.xml").read_text())
    (suites,) = junit.getElementsByTagName("testsuites")
    assert suites.getAttribute("name") == "batchcheck ci (unfinished: 1 of 2 checks finished)"
    assert [c.getAttribute("name") for c in junit.getElementsByTagName("testcase")] == ["verify seq_cap"]
    sarif = json.loads((tmp_path / "out" / "ci.sarif").read_text())
    (invocation,) = sarif["runs"][0]["invocations"]
    assert invocation["executionSuccessful"] is False
    assert "1 of 2 checks finished" in invocation["toolExecutionNotifications"][0]["message"]["text"]


def test_a_finished_run_overwrites_the_unfinished_reports(capsys, tmp_path, monkeypatch):
    (tmp_path / "spec").mkdir()
    shutil.copy(POLICIES / "vllm_v1.yaml", tmp_path / "spec")
    (tmp_path / "batchcheck.toml").write_text(CUT_CONFIG.replace("depth = 40\ntimeout_s = 3600", "depth = 1"))
    monkeypatch.chdir(tmp_path)
    code, out, err = run(capsys, "ci", "--jobs", "1")
    assert code == 0, out + err
    assert "unfinished" not in (tmp_path / "out" / "summary.md").read_text()
    assert "unfinished" not in (tmp_path / "out" / "junit.xml").read_text()
    sarif = json.loads((tmp_path / "out" / "ci.sarif").read_text())
    assert sarif["runs"][0]["invocations"] == [{"executionSuccessful": True}]
    assert "verify token_budget" in (tmp_path / "out" / "junit.xml").read_text()
