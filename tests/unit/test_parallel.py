"""checker.parallel: results in task order whichever way the tasks run; an input error raised in a worker comes back
to the caller with its message and exit code (exit 2), not as a pickling failure (exit 101)."""

from __future__ import annotations

import pytest

from checker.errors import InputError, Problem
from checker.parallel import TaskError, map_processes


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
