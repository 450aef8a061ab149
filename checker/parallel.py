"""Running independent tasks in parallel: on local worker processes (``--jobs N``) or on a Dask cluster
(``--scheduler tcp://HOST:PORT``, or a ``distributed.Client``). ``ci`` runs its checks with it, ``sweep`` its
configurations (docs/ci.md, "Scale-out: Dask distributed", says why Dask).

Local workers are spawned by default (no solver or Hypothesis state shared with the parent); a caller whose parent
holds no such state (``sweep``: a loaded fleet and its requests) may ask for ``start="fork"`` on Linux: a forked
worker starts at once, with batchcheck imported and the caller's data in memory, where a spawned one imports
batchcheck first (about half a second of CPU each) and receives what it needs pickled. Workers are stopped at
once when the caller stops (Ctrl-C or an error); with one job, or one task, everything runs in this process, in
order. The results come back in the order of the tasks; ``done(i, result)`` is called as each one finishes.

``shared``: data every task needs (a sweep's fleets and requests), sent to each worker once (forked workers
inherit it, spawned ones receive it pickled at their start, Dask workers get one broadcast copy) rather than with
every task; ``fn`` is then called as ``fn(shared, task)``."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from multiprocessing import get_all_start_methods, get_context
from typing import Any

from checker.errors import BatchcheckError
from checker.exitcodes import ExitCode

MAX_JOBS = 1024  # the most worker processes --jobs (ci, diff, fleet) and a config's jobs may ask for
SCHEDULER_CONNECT_S = 20  # how long --scheduler waits for a Dask scheduler to answer

Done = Callable[[int, Any], None] | None
NOTHING: Any = object()  # no ``shared`` data: fn(task)
_SHARED: Any = NOTHING  # a local worker's shared data (set at its start)


class TaskError(BatchcheckError):
    """An error batchcheck raised on purpose in a worker's task (bad input: exit 2, ...), carried back to the caller
    with its message and exit code (the error itself may not pickle)."""

    def __init__(self, message: str, code: int):
        super().__init__(message, code)
        self.message, self.exit_code = message, ExitCode(code)

    def __str__(self) -> str:
        return self.message


class _Carrying:
    """``fn`` in a worker: its BatchcheckError comes back as a TaskError (picklable). With ``shared``:
    ``fn(shared, task)``, the shared data given (Dask) or the worker's own copy (local processes)."""

    def __init__(self, fn: Callable[..., Any], shared: bool = False):
        self.fn, self.shared = fn, shared

    def __call__(self, task: Any, shared: Any = NOTHING) -> Any:
        try:
            if not self.shared:
                return self.fn(task)
            return self.fn(_SHARED if shared is NOTHING else shared, task)
        except TaskError:
            raise
        except BatchcheckError as exc:
            raise TaskError(str(exc), int(exc.exit_code)) from None


def quiet_worker(parent: int) -> None:
    """A local worker's start: it leaves Ctrl-C to the parent, which stops it, and dies with the parent (a
    SIGKILLed caller cannot stop its workers: checker.childproc)."""
    import signal

    from checker.childproc import die_with_parent

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    die_with_parent(parent)


def _start(shared: Any, initializer: Callable[..., None] | None, initargs: tuple) -> None:
    """A local worker's start: ``initializer(*initargs)``, then the shared data kept for its tasks."""
    global _SHARED
    if initializer is not None:
        initializer(*initargs)
    _SHARED = shared


def start_method(start: str) -> str:
    """The start method local workers get: ``fork`` only where asked and on Linux (elsewhere forking a process
    that has imported system frameworks is unsafe: macOS), else ``spawn``."""
    return "fork" if start == "fork" and sys.platform.startswith("linux") and "fork" in get_all_start_methods() \
        else "spawn"


def map_processes(fn: Callable[..., Any], tasks: Sequence[Any], jobs: int, done: Done = None,
                  initializer: Callable[..., None] | None = None, initargs: tuple = (), start: str = "spawn",
                  shared: Any = NOTHING) -> list[Any]:
    """``fn(task)`` (or ``fn(shared, task)``) for each task, on ``jobs`` worker processes started by ``start``
    (``spawn``, or ``fork`` on Linux: start_method), each started with ``initializer``."""
    results: dict[int, Any] = {}
    given = shared is not NOTHING

    def finished(i: int, result: Any) -> None:
        results[i] = result
        if done is not None:
            done(i, result)

    if jobs <= 1 or len(tasks) <= 1:
        for i, task in enumerate(tasks):
            finished(i, fn(shared, task) if given else fn(task))
        return [results[i] for i in range(len(tasks))]
    pool = ProcessPoolExecutor(max_workers=min(jobs, len(tasks)), mp_context=get_context(start_method(start)),
                               initializer=_start, initargs=(shared, initializer, initargs))
    try:
        call = _Carrying(fn, given)
        futures = {pool.submit(call, task): i for i, task in enumerate(tasks)}
        for future in as_completed(futures):
            finished(futures[future], future.result())
    except BaseException:  # Ctrl-C or an error: stop the workers now, run nothing more
        for process in list((getattr(pool, "_processes", None) or {}).values()):
            process.terminate()
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown()
    return [results[i] for i in range(len(tasks))]


def map_dask(fn: Callable[..., Any], tasks: Sequence[Any], scheduler: Any, done: Done = None,
             shared: Any = NOTHING) -> list[Any]:
    """``fn(task)`` (or ``fn(shared, task)``, ``shared`` broadcast to the workers once) for each task, one Dask task
    each: ``scheduler`` is an address (tcp://HOST:PORT) or a distributed.Client. Workers need batchcheck installed
    (the same version). A usage error (exit 2) when Dask is not installed or no scheduler answers."""
    from checker.errors import UsageError

    try:
        from distributed import Client
        from distributed import as_completed as completed
    except ImportError:
        raise UsageError("--scheduler needs Dask distributed: python3 -m pip install 'batchcheck[scale]'") from None
    own = not isinstance(scheduler, Client)
    try:
        client = Client(scheduler, timeout=f"{SCHEDULER_CONNECT_S}s") if own else scheduler
    except (OSError, ValueError, TypeError) as exc:
        raise UsageError(f"--scheduler {scheduler}: no Dask scheduler answers there within {SCHEDULER_CONNECT_S} s "
                         f"({type(exc).__name__}: {exc})") from None
    try:
        given = shared is not NOTHING
        extra = {"shared": client.scatter(shared, broadcast=True, hash=False)} if given else {}
        futures = client.map(_Carrying(fn, given), list(tasks), pure=False, **extra)
        index = {future.key: i for i, future in enumerate(futures)}
        results: dict[int, Any] = {}
        for future in completed(futures):
            i = index[future.key]
            results[i] = future.result()
            if done is not None:
                done(i, results[i])
        return [results[i] for i in range(len(tasks))]
    finally:
        if own:
            client.close()
