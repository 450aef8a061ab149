"""Running the checks: serially, on local processes (``--jobs N``), or on a Dask cluster
(``--scheduler tcp://HOST:PORT``, or a ``distributed.Client``).

A worker gets a Check (with the text of the files it needs), writes them to a private temporary folder
(checker.ci.plan.materialise), runs the check's own entry point there (checker.verify.run.run_verify,
checker.fuzz.run.run_fuzz, checker.diff.run.run_diff, checker.liveness.check.run_liveness), and returns a
Result (checker.ci.results) holding the verdict and the text of any counterexample or certificate it
produced. The liveness checks of one instance (one per property) are one unit of work: the state graph is
explored once for all of them. Nothing is written to the project by workers: the caller writes each check's
files as its result comes back (checker/ci/run.py).
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from checker.ci.plan import DIFF, FUZZ, LIVENESS, Check, load_invariant_modules, materialise
from checker.ci.results import CERTIFICATE, COUNTEREXAMPLE, Artifact, Result, shown_paths
from checker.errors import BatchcheckError
from checker.exitcodes import ExitCode
from checker.parallel import map_dask, map_processes, quiet_worker


class CheckError(BatchcheckError):
    """An error raised by a check in a worker, carried back with its exit code (picklable)."""

    def __init__(self, message: str, code: int):
        super().__init__(message, code)
        self.message, self.exit_code = message, ExitCode(code)

    def __str__(self) -> str:
        return self.message


def run_check(check: Check) -> Result:
    """Run one check in a private temporary folder; return its verdict and artifacts (picklable)."""
    return run_unit([check])[0]


def run_unit(checks: Sequence[Check]) -> list[Result]:
    """Run one unit of work (one check, or the liveness checks of one instance); picklable results."""
    try:
        if checks[0].kind == LIVENESS:
            from checker.ci.livenesshook import run_liveness_checks

            return run_liveness_checks(checks)
        return [_run_check(checks[0])]
    except BatchcheckError as exc:
        names = ", ".join(c.name for c in checks)
        raise CheckError(f"{checks[0].where}, policy {checks[0].policy.shown}, {names}: {exc}", int(exc.exit_code)) \
            from None
    except BaseException as exc:  # a user invariant module's exception (SystemExit included) is the user's error
        from checker.ci.usercode import user_code_error

        if (error := user_code_error(exc)) is None:
            raise
        names = ", ".join(c.name for c in checks)
        raise CheckError(f"{checks[0].where}, policy {checks[0].policy.shown}, {names}: {error}",
                         int(error.exit_code)) from None


def _run_check(check: Check) -> Result:
    from checker.fuzz.run import run_fuzz
    from checker.verify.run import run_verify

    started = time.monotonic()
    load_invariant_modules(check.modules)
    with tempfile.TemporaryDirectory(prefix="batchcheck-ci-") as tmp:
        folder = Path(tmp)
        paths = materialise(folder, {"policy": check.policy, "workload": check.workload, "slo": check.slo,
                                     "profile": check.profile, "old": check.old})
        cex_dir, proof_dir = folder / "counterexamples", folder / "proofs"
        if check.kind == DIFF:
            from checker.ci.diffhook import run_diff_check

            verdict, detail, line = run_diff_check(check, paths, cex_dir)
        elif check.kind == FUZZ:
            results = run_fuzz(paths["policy"], paths["workload"], slo=paths["slo"], properties=[check.name],
                               max_examples=check.max_examples, time_budget_s=check.time_budget_s,
                               seed=check.seed, profile=paths["profile"], out_dir=cex_dir, database_dir=None,
                               max_requests=check.max_requests)
            r = results[0]
            verdict = "VIOLATED" if r.violated else "NO_COUNTEREXAMPLE"
            detail = {"property": check.name, "verdict": verdict, "examples": r.examples,
                      "observed": r.outcome.observed if r.outcome else None,
                      "allowed": r.outcome.allowed if r.outcome else None,
                      "requests": len(r.trace) if r.violated else None}
            line = r.line()
        else:
            _, results = run_verify(paths["policy"], [check.name], requests=check.requests, depth=check.depth,
                                    timeout_s=check.timeout_s, workload=paths["workload"], out_dir=cex_dir,
                                    unbounded=check.unbounded, proof_dir=proof_dir,
                                    temporal_induction=check.temporal_induction)
            r = results[0]
            verdict, detail, line = r.verdict.value, r.as_dict(), r.line()
        artifacts = []
        for path in sorted(cex_dir.glob("*.json")) if cex_dir.is_dir() else []:
            doc = shown_paths(json.loads(path.read_text(encoding="utf-8")), paths, check)
            artifacts.append(Artifact(COUNTEREXAMPLE, path.name, json.dumps(doc, indent=1) + "\n"))
        for path in sorted(proof_dir.glob("*")) if proof_dir.is_dir() else []:
            from checker.verify.certificate import with_policy_file

            artifacts.append(Artifact(CERTIFICATE, path.name, with_policy_file(path.read_text(encoding="utf-8"),
                                                                               check.policy.shown)))
        for key in ("counterexample", "certificate"):
            if detail.get(key):
                detail[key] = Path(detail[key]).name  # the caller replaces it with where it wrote the file
        line = line.replace(str(cex_dir) + os.sep, "").replace(str(proof_dir) + os.sep, "")
    return Result(verdict, line, detail, time.monotonic() - started, artifacts)


def _cost(check: Check) -> float:
    """Rough seconds a check may take, to start the long ones first (better packing on few workers)."""
    if check.kind == FUZZ:
        return check.time_budget_s
    return check.timeout_s * (2 if check.unbounded is not False or check.kind == DIFF else 1)


def units(checks: Sequence[Check]) -> list[list[int]]:
    """The checks grouped into units of work, longest first (better packing on few workers): one check
    each, but the liveness checks of one instance (same policy and instance, any property) together."""
    groups: dict[Any, list[int]] = {}
    for i, check in enumerate(checks):
        key = replace(check.key, name="", rule="") if check.kind == LIVENESS else i
        groups.setdefault(key, []).append(i)
    return sorted(groups.values(), key=lambda unit: -_cost(checks[unit[0]]))


def run_serial(checks: Sequence[Check], done: Callable[[int, Result], None] | None = None) -> list[Result]:
    return run_processes(checks, 1, done)


def run_processes(checks: Sequence[Check], jobs: int, done: Callable[[int, Result], None] | None = None) -> list[Result]:
    """Each unit in a fresh worker process of a local pool (spawned: no z3 or Hypothesis state shared);
    ``jobs`` 1: serially, in this process, in the order of the checks (checker.parallel); else the longest
    first."""
    plan = units(checks)
    plan = sorted(plan) if jobs <= 1 or len(plan) <= 1 else plan
    return _by_check(checks, plan, map_processes(run_unit, [[checks[i] for i in unit] for unit in plan], jobs,
                                                 _unit_done(plan, done), _worker_started, (os.getpid(),)))


def _unit_done(plan: list[list[int]], done: Callable[[int, Result], None] | None):
    """``done`` per check, from the results of one unit as it finishes."""
    if done is None:
        return None
    return lambda k, unit_results: [done(i, r) for i, r in zip(plan[k], unit_results)]


def _by_check(checks: Sequence[Check], plan: list[list[int]], unit_results: list[list[Result]]) -> list[Result]:
    results = {i: r for unit, rs in zip(plan, unit_results) for i, r in zip(unit, rs)}
    return [results[i] for i in range(len(checks))]


def _worker_started(parent: int) -> None:
    """A local worker leaves Ctrl-C to the parent, which stops it (z3 would take SIGINT itself during a check
    and answer 'unknown', a verdict the run never finished), and dies with the parent (a SIGKILLed ``ci``
    cannot stop its workers: checker.childproc)."""
    from checker.smt.ops import z3

    quiet_worker(parent)
    z3.set_param("ctrl_c", False)


def run_dask(checks: Sequence[Check], scheduler: Any, done: Callable[[int, Result], None] | None = None) -> list[Result]:
    """On a Dask cluster: ``scheduler`` is an address (tcp://HOST:PORT) or a distributed.Client. Workers
    need batchcheck installed (the same version); they need no copy of the project's files."""
    plan = units(checks)
    return _by_check(checks, plan, map_dask(run_unit, [[checks[i] for i in unit] for unit in plan], scheduler,
                                            _unit_done(plan, done)))
