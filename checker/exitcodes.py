"""Process exit codes of every batchcheck command. Stable: CI scripts depend on them."""

from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0  # all properties hold (for the strength stated in the verdict) / command succeeded
    VIOLATED = 1  # a property is violated (a replayed counterexample exists)
    INPUT_ERROR = 2  # usage error or bad input file (policy, workload, trace, profile)
    INCONCLUSIVE = 3  # timeout, solver unknown, or a check that could not decide
    NEVER_OCCURS = 4  # only with verify --split-vacuous: no violation, and some invariant's situation is proved
    #                   never to occur at any depth (VACUOUS: nothing was checked); without the flag that exits 3
    INTERNAL_ERROR = 101  # a bug in batchcheck: engine and solver disagree, an asserted budget broke, ...
    INTERRUPTED = 130  # stopped by Ctrl-C (SIGINT; 128 + 2, as shells report it): no verdict, nothing half-written
