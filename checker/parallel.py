"""Running independent tasks in parallel: on local worker processes (``--jobs N``) or on a Dask cluster
(``--scheduler tcp://HOST:PORT``, or a ``distributed.Client``). ``ci`` runs its checks with it, ``sweep`` its
configurations (docs/ci.md, "Scale-out: Dask distributed", says why Dask).

Local workers are spawned (no solver or Hypothesis state shared with the parent) and stopped at once when the
caller stops (Ctrl-C or an error); with one job, or one task, everything runs in this process, in order. The
results come back in the order of the tasks; ``done(i, result)`` is called as each one finishes."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from multiprocessing import get_context
from typing import Any

from checker.errors import BatchcheckError
from checker.exitcodes import ExitCode

MAX_JOBS = 1024  # the most worker processes --jobs (ci, diff, fleet) and a config's jobs may ask for
SCHEDULER_CONNECT_S = 20  # how long --scheduler waits for a Dask scheduler to answer

Done = Callable[[int, Any], None] | None


class TaskError(BatchcheckError):
    """An error batchcheck raised on purpose in a worker's task (bad input: exit 2, ...), carried back to the caller
    with its message and exit code (the error itself may not pickle)."""

    def __init__(self, message: str, code: int):
        super().__init__(message, code)
        self.message, self.exit_code = message, ExitCode(code)

    def __str__(self) -> str:
        return self.message


class _Carrying:
    """``fn`` in a worker: its BatchcheckError comes back as a TaskError (picklable)."""

    def __init__(self, fn: Callable[[Any], Any]):
        self.fn = fn

    def __call__(self, task: Any) -> Any:
        try:
            return self.fn(task)
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


def map_processes(fn: Callable[[Any], Any], tasks: Sequence[Any], jobs: int, done: Done = None,
                  initializer: Callable[..., None] | None = None, initargs: tuple = ()) -> list[Any]:
    """``fn(task)`` for each task, on ``jobs`` spawned worker processes (each started with ``initializer``)."""
    results: dict[int, Any] = {}

    def finished(i: int, result: Any) -> None:
        results[i] = result
        if done is not None:
            done(i, result)

    if jobs <= 1 or len(tasks) <= 1:
        for i, task in enumerate(tasks):
            finished(i, fn(task))
        return [results[i] for i in range(len(tasks))]
    pool = ProcessPoolExecutor(max_workers=min(jobs, len(tasks)), mp_context=get_context("spawn"),
                               initializer=initializer, initargs=initargs)
    try:
        futures = {pool.submit(_Carrying(fn), task): i for i, task in enumerate(tasks)}
        for future in as_completed(futures):
            finished(futures[future], future.result())
    except BaseException:  # Ctrl-C or an error: stop the workers now, run nothing more
        for process in list((getattr(pool, "_processes", None) or {}).values()):
            process.terminate()
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown()
    return [results[i] for i in range(len(tasks))]


def map_dask(fn: Callable[[Any], Any], tasks: Sequence[Any], scheduler: Any, done: Done = None) -> list[Any]:
    """``fn(task)`` for each task, one Dask task each: ``scheduler`` is an address (tcp://HOST:PORT) or a
    distributed.Client. Workers need batchcheck installed (the same version). A usage error (exit 2) when Dask
    is not installed or no scheduler answers."""
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
        futures = client.map(_Carrying(fn), list(tasks), pure=False)
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
