"""``checker.cli.main`` leaves the process as it found it (issue 23): an in-process caller (the test suite,
tests/fuzz, a notebook) runs it many times, and a whole-suite run hung in a later Hypothesis ``find()`` after
in-process verify runs. What ``main`` sets up for one call (Ctrl-C's wakeup fd, watching thread and unraisable hook,
z3's ``ctrl_c`` parameter) is taken down when it returns; the garbage collector the engine turns off is on again
on every path; and verify's build budget leaves no pending asynchronous exception behind (checker/verify/budget.py:
on CPython 3.11 clearing one with ``PyThreadState_SetAsyncExc(id, NULL)`` left traced code spinning for ever)."""

from __future__ import annotations

import contextlib
import gc
import io
import signal
import subprocess
import sys
import threading

import pytest

from checker.cli import main
from checker.commands.interrupt import ctrl_c_stops_solving
from tests.helpers import POLICIES, ROOT, WORKLOADS


def _wakeup_fd() -> int:
    fd = signal.set_wakeup_fd(-1)
    signal.set_wakeup_fd(fd)
    return fd


def _state() -> dict[str, object]:
    from checker.smt.ops import z3

    return {"threads": sorted(t.name for t in threading.enumerate()), "unraisablehook": sys.unraisablehook,
            "excepthook": threading.excepthook, "sigint": signal.getsignal(signal.SIGINT), "wakeup_fd": _wakeup_fd(),
            "gc": gc.isenabled(), "recursion_limit": sys.getrecursionlimit(), "trace": sys.gettrace(),
            "profile": sys.getprofile(), "z3_ctrl_c": z3.get_param("ctrl_c")}


def _main(argv: list[str]) -> int:
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        return main(argv)


needs_default_sigint = pytest.mark.skipif(
    threading.current_thread() is not threading.main_thread()
    or signal.getsignal(signal.SIGINT) is not signal.default_int_handler,
    reason="Ctrl-C's machinery is installed only from the main thread with Python's default SIGINT handler")


@needs_default_sigint
def test_ctrl_c_machinery_is_up_during_the_call_and_down_after_it():
    before = _state()
    with ctrl_c_stops_solving("verify"):
        during = _state()
    assert during["wakeup_fd"] != -1 and "batchcheck-ctrl-c" in during["threads"]
    assert during["unraisablehook"] is not before["unraisablehook"] and during["z3_ctrl_c"] == "false"
    assert _state() == before


@needs_default_sigint
@pytest.mark.parametrize("argv", [
    ["verify", str(POLICIES / "vllm_v1.yaml"), "--invariant", "seq_cap", "--requests", "2", "--depth", "2",
     "--timeout", "5"],
    ["verify", str(POLICIES / "vllm_v1.yaml"), "--invariant", "kv_never_overcommitted", "--requests", "64",
     "--depth", "1", "--timeout", "0.5"],  # stopped while its query is built (the build budget fires)
    ["simulate", str(POLICIES / "vllm_v1.yaml"), "--workload", str(WORKLOADS / "chat_mixed.yaml"), "--limit", "20"],
    ["validate", str(POLICIES / "vllm_v1.yaml"), str(ROOT / "missing.yaml")],
])
def test_main_leaves_threads_hooks_signals_gc_and_z3_as_it_found_them(argv, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # verify proves by default: its certificates go to ./proofs, here
    before = _state()
    assert _main(argv) in (0, 1, 2, 3)
    assert _state() == before


TRACED_AFTER_A_FIRED_BUDGET = """
import sys
from checker.verify.budget import BuildTimeout, within
try:
    with within(0.1):
        while True:
            sum(range(100))
except BuildTimeout:
    pass
def tracer(frame, event, arg):
    return tracer
def called():
    return 1
sys.settrace(tracer)
called()
sys.settrace(None)
print("traced")
"""


def test_traced_code_runs_after_the_build_budget_fired():
    """On today's CPython 3.11 the old clean-up left the next traced call spinning at its first line for ever."""
    done = subprocess.run([sys.executable, "-c", TRACED_AFTER_A_FIRED_BUDGET], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert (done.returncode, done.stdout) == (0, "traced\n"), done.stderr
