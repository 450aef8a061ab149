"""Ctrl-C (SIGINT) stops every verb with one line on stderr and exit 130 (checker.exitcodes.INTERRUPTED), never a
traceback and never a verdict it did not finish, also while z3 is solving: z3 takes SIGINT itself during a
check and answers 'unknown', so without checker.cli's handling the run goes on (issue 23: "Ctrl-C during
verify is swallowed by z3"). Each test runs batchcheck as a process, as a terminal would: SIGINT with Python's
default handler (a background job of a non-interactive shell inherits SIGINT ignored; the tests undo that)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import POLICIES, ROOT

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")

# A verify run that spends its time in z3: without Ctrl-C it ends after about its --timeout (UNKNOWN, exit 3);
# the bounded search alone (the default proves it in seconds)
HARD_VERIFY = ["verify", str(POLICIES / "vllm_v1.yaml"), "--requests", "4", "--depth", "6", "--invariant",
               "token_budget", "--timeout", "120", "--bounded-only"]


def _interrupt(argv: list[str], after_s: float, cwd: Path = ROOT) -> tuple[int, str, str, float]:
    """Start batchcheck, send SIGINT after ``after_s`` seconds; its exit code, stdout, stderr and how long it took
    to stop after the signal."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    process = subprocess.Popen([sys.executable, "-m", "checker.cli", *argv], cwd=cwd, env=env, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        time.sleep(after_s)
        assert process.poll() is None, "the run ended before the signal: make the instance harder"
        process.send_signal(signal.SIGINT)
        sent = time.monotonic()
        out, err = process.communicate(timeout=60)
        return process.returncode, out, err, time.monotonic() - sent
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_ctrl_c_while_z3_solves_exits_130_with_one_line_and_no_verdict(tmp_path):
    code, out, err, stopped_s = _interrupt([*HARD_VERIFY, "--out", str(tmp_path)], after_s=8)
    assert (code, out, err) == (130, "", "batchcheck: interrupted\n")
    assert stopped_s < 10  # z3's check was interrupted, not left to run to its timeout
    assert list(tmp_path.iterdir()) == []


def test_ctrl_c_during_a_fuzz_search(tmp_path):
    # a property that holds, so the search runs to its budget (the shipped SLOs all fail within seconds on an idle
    # machine: the run then ended before the signal)
    slo = tmp_path / "loose.slo.yaml"
    slo.write_text("format: batchcheck-slo\nproperties:\n  - {kind: latency, name: loose_ttft, class: interactive, "
                   "metric: ttft_ms, stat: p99, bound_ms: 1000000000}\n")
    out_dir = tmp_path / "out"
    code, out, err, _ = _interrupt(["fuzz", str(POLICIES / "vllm_v1.yaml"), "--workload",
                                    str(ROOT / "spec" / "workloads" / "chat_mixed.yaml"), "--slo", str(slo),
                                    "--max-examples", "100000", "--time-budget", "600", "--database", "none",
                                    "--out", str(out_dir)], after_s=6)
    assert (code, out, err) == (130, "", "batchcheck: interrupted\n")


def _processes_in(folder: Path) -> list[int]:
    """The processes whose working directory is ``folder`` (ci's workers run there)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and Path(os.readlink(entry / "cwd")) == folder:
                found.append(int(entry.name))
        except OSError:
            continue
    return found



def _assert_no_workers_left(folder: Path) -> None:
    """No process started in ``folder`` (the command's workers) is alive 10 s after the command stopped."""
    deadline = time.monotonic() + 10
    while _processes_in(folder) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _processes_in(folder) == []

@pytest.mark.skipif(not Path("/proc/self/cwd").exists(), reason="needs /proc to find the workers")
def test_ctrl_c_during_ci_stops_its_workers_too(tmp_path):
    (tmp_path / "spec").mkdir()
    (tmp_path / "spec" / "vllm_v1.yaml").write_text((POLICIES / "vllm_v1.yaml").read_text())
    (tmp_path / "batchcheck.toml").write_text(
        'policies = ["spec/vllm_v1.yaml"]\n[defaults]\nrequests = 4\ndepth = 6\ntimeout_s = 120\nunbounded = false\n'
        '[[verify]]\ninvariants = ["token_budget", "kv_never_overcommitted", "seq_cap"]\n')
    code, out, err, stopped_s = _interrupt(["ci", "--jobs", "2", "--summary", "summary.md"], after_s=10,
                                           cwd=tmp_path)
    assert (code, out, err) == (130, "", "batchcheck: interrupted\n")
    summary = tmp_path / "summary.md"  # written only with the checks finished before the Ctrl-C, said unfinished
    assert stopped_s < 10 and (not summary.exists() or "unfinished" in summary.read_text())
    _assert_no_workers_left(tmp_path)


@pytest.mark.skipif(not Path("/proc/self/cwd").exists(), reason="needs /proc to find the workers")
def test_ctrl_c_during_a_parallel_diff_stops_its_workers_too(tmp_path):
    # both sides searched on worker processes (--jobs 2): a budget both policies reach, a search z3 spends long on
    new = (POLICIES / "vllm_v1.yaml").read_text().replace("max_num_batched_tokens: 8192", "max_num_batched_tokens: 4096")
    assert "4096" in new
    (tmp_path / "new.yaml").write_text(new)
    code, out, err, stopped_s = _interrupt(["diff", str(POLICIES / "vllm_v1.yaml"), "new.yaml", "--jobs", "2",
                                            "--invariant", "no_deadlock", "--requests", "4", "--depth", "6",
                                            "--timeout", "120", "--out", "out"], after_s=8, cwd=tmp_path)
    assert (code, out, err) == (130, "", "batchcheck: interrupted\n")
    assert stopped_s < 10 and not (tmp_path / "out").exists()
    _assert_no_workers_left(tmp_path)


@pytest.mark.skipif(not Path("/proc/self/cwd").exists(), reason="needs /proc to find the workers")
def test_ctrl_c_during_a_sweep_on_forked_workers_stops_them_too(tmp_path):
    knobs = ["replicas=1,2,3,4", "batch.max_num_seqs=4,8,16,32", "batch.max_num_batched_tokens=1024,2048,4096,8192",
             "router.load_cap=2,4,8,16"]  # 256 configurations: several seconds on two workers
    code, out, err, stopped_s = _interrupt(["sweep", str(ROOT / "spec" / "fleets" / "prefix_capped.yaml"),
                                            *(a for k in knobs for a in ("--knob", k)), "--jobs", "2", "--out",
                                            str(tmp_path / "out")], after_s=3, cwd=tmp_path)
    assert (code, out, err) == (130, "", "batchcheck: interrupted\n")
    assert stopped_s < 10 and not (tmp_path / "out").exists()  # no result written for a sweep it did not finish
    _assert_no_workers_left(tmp_path)
