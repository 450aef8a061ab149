"""Worker processes die with the process that started them: a SIGKILLed ``ci --jobs N`` or ``liveness --jobs N``
(no chance to stop its pool) leaves no worker running on (issue 23).

``die_with_parent(parent)``, called first thing in a worker: on Linux the kernel sends the worker SIGKILL when
its parent exits (``prctl(PR_SET_PDEATHSIG)``, through ctypes); everywhere a daemon thread also checks every
WATCH_S seconds that the parent is still the worker's parent, and ends the worker if it is not (also covering
the moment between the fork and the prctl, and a parent whose starting thread ended: the kernel's signal
follows that thread, not the process)."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

WATCH_S = 0.5
PR_SET_PDEATHSIG = 1


def die_with_parent(parent: int) -> None:
    """End this process (SIGKILL) as soon as ``parent`` (the pid that started it) is gone."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):  # no libc prctl: the thread below still watches
            pass
    if os.getppid() != parent:  # the parent died before the prctl
        os._exit(1)

    def watch() -> None:
        while True:
            time.sleep(WATCH_S)
            if os.getppid() != parent:
                os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="batchcheck-parent-watch", daemon=True).start()
