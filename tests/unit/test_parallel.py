"""checker.parallel: results in task order whichever way the tasks run; an input error raised in a worker comes back
to the caller with its message and exit code (exit 2), not as a pickling failure (exit 101)."""

from __future__ import annotations

import pytest

from checker.errors import InputError, Problem
from checker.parallel import TaskError, map_processes, start_method


def square_or_refuse(n: int) -> int:
    if n < 0:
        raise InputError(Problem("--knob", n, "a number >= 0"), "task")
    return n * n


def test_results_in_task_order_serially_and_on_processes():
    seen = []
    assert map_processes(square_or_refuse, [3, 1, 2], 1, lambda i, r: seen.append((i, r))) == [9, 1, 4]
    assert seen == [(0, 9), (1, 1), (2, 4)]
    assert map_processes(square_or_refuse, [3, 1, 2, 5], 2) == [9, 1, 4, 25]


def test_an_input_error_in_a_worker_comes_back_as_exit_2():
    with pytest.raises(TaskError) as exc:
        map_processes(square_or_refuse, [1, -4], 2)
    assert int(exc.value.exit_code) == 2 and str(exc.value) == "task: --knob=-4 (expected a number >= 0)"
    with pytest.raises(InputError):  # in this process: the error itself
        map_processes(square_or_refuse, [-4], 1)



UNPICKLED = 0  # in a worker: how many times shared data was unpickled there


class Offset:
    """Shared data that counts its unpicklings in the process that receives it."""

    def __init__(self, offset: int):
        self.offset = offset

    def __reduce__(self):
        return (_unpickle_offset, (self.offset,))


def _unpickle_offset(offset: int) -> Offset:
    global UNPICKLED
    UNPICKLED += 1
    return Offset(offset)


def offset_by(shared: Offset, n: int) -> tuple[int, int]:
    return n + shared.offset, UNPICKLED


@pytest.mark.parametrize("start", ["spawn", "fork"])
def test_shared_data_goes_to_each_worker_once_not_with_each_task(start):
    serial = map_processes(offset_by, list(range(8)), 1, shared=Offset(100))
    assert serial == [(100 + n, 0) for n in range(8)]
    two = map_processes(offset_by, list(range(8)), 2, start=start, shared=Offset(100))
    assert [r for r, _ in two] == [r for r, _ in serial]
    # forked workers inherit it (never unpickled), spawned ones unpickle it once at their start; one copy per task
    # would count up to the tasks a worker ran (at least 4 of the 8 on one of the two)
    assert {n for _, n in two} == ({0} if start_method(start) == "fork" else {1})


def test_fork_only_where_asked_and_on_linux():
    import sys

    assert start_method("spawn") == "spawn"
    assert start_method("fork") == ("fork" if sys.platform.startswith("linux") else "spawn")
