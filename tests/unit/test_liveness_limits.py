"""The explorer's limits hold while one state's successors are generated (issue 23): a large instance has
millions of environment choices in a single state (``liveness --requests 16``: 131,071 from the empty
system), and --timeout / --max-states were checked only between states (88 s for a 3 s limit; 14.8 GB at
--requests 20 before --requests was bounded). Workers of ``--jobs`` stop at the same limits, leave Ctrl-C to
the parent (one line, exit 130, no worker traceback) and end with it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from checker.liveness.explore import LivenessEnv, explore
from checker.api import load_policy
from tests.helpers import POLICIES, ROOT

BIG = LivenessEnv(16, (16, 48), (1, 3))  # the empty system alone has 131,071 arrival choices


@pytest.mark.parametrize("workers", [1, 2])
def test_the_time_limit_holds_inside_one_states_successors(workers):
    started = time.monotonic()
    sg = explore(load_policy(POLICIES / "vllm_v1.yaml"), BIG, timeout_s=1.0, workers=workers)
    assert not sg.complete and sg.stop_reason == "time limit (1 s) reached"
    assert sg.seconds < 1.6 and time.monotonic() - started < 6  # within the limit's tenth, plus the pool's start


def test_the_state_limit_holds_inside_one_states_successors():
    env = LivenessEnv(5, (16, 48, 300), (1, 3), cancellations=True)
    sg = explore(load_policy(POLICIES / "vllm_v1.yaml"), env, max_states=3, timeout_s=60)
    assert not sg.complete and sg.stop_reason == "state limit (3) reached"
    assert sg.states <= 3 and sg.seconds < 30


def _children(pid: int) -> set[int]:
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    found.add(int(entry.name))
            except OSError:
                continue
    return found


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the process table from /proc")
@pytest.mark.parametrize("how", ["ctrl-c", "sigkill"])
def test_jobs_workers_stop_with_the_parent(how):
    """Ctrl-C (SIGINT to the process group, as a terminal sends it): exit 130 with one line and no worker
    traceback; SIGKILL of the parent: the workers end within a few seconds."""
    argv = [sys.executable, "-m", "checker.cli", "liveness", "vllm_v1", "--requests", "9", "--set",
            "batch.max_num_seqs=2", "--cancellations", "--jobs", "2", "--timeout", "120"]
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    workers: set[int] = set()
    deadline = time.monotonic() + 60
    while len(workers) < 2 and time.monotonic() < deadline and proc.poll() is None:
        workers |= _children(proc.pid)
        time.sleep(0.05)
    assert len(workers) == 2 and proc.poll() is None
    time.sleep(1.0)  # the workers are expanding a level
    if how == "ctrl-c":
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=30)
        assert (proc.returncode, err) == (130, "batchcheck: interrupted\n")
    else:
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=30)
    grace = time.monotonic() + 5
    while any(_alive(w) for w in workers) and time.monotonic() < grace:
        time.sleep(0.1)
    assert not [w for w in workers if _alive(w)]
