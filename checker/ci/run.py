"""``batchcheck ci``: validate the project config, run every check (in parallel), and write the JUnit XML,
SARIF, markdown summary, counterexamples and certificates as each check finishes, each file atomically: a run cut
short (a CI job's timeout, a kill) leaves every finished finding on disk, the reports saying how many of the checks
had finished (issue 19); the run's end writes them once more, complete."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from checker.ci.config import load_config
from checker.ci.execute import run_dask, run_processes
from checker.ci.findings import Finding, make_finding
from checker.ci.junit import junit_xml
from checker.ci.plan import Check, Plan, build_plan
from checker.ci.results import CERTIFICATE, COUNTEREXAMPLE, FAILED, INCONCLUSIVE, Result
from checker.ci.sarif import sarif_text
from checker.ci.summary import summary_markdown
from checker.exitcodes import ExitCode
from checker.fileio import write_atomic

DEFAULT_CONFIG = "batchcheck.toml"


@dataclass
class CiOutcome:
    plan: Plan
    findings: list[Finding]
    exit_code: ExitCode
    seconds: float
    where: str  # how the checks ran, e.g. "2 local processes"
    notes: list[str] = field(default_factory=list)
    written: list[str] = field(default_factory=list)  # every file written, in order


def exit_code(findings: list[Finding], split_vacuous: bool = False) -> ExitCode:
    """1 on a gating violation, else 3 on a gating inconclusive verdict, else 0. ``split_vacuous`` (``[gate]
    split_vacuous``): a gating VACUOUS that never occurs at any depth gives 4, when nothing else gates."""
    if any(f.gating and f.outcome == FAILED for f in findings):
        return ExitCode.VIOLATED
    undecided = [f for f in findings if f.gating and f.outcome == INCONCLUSIVE]
    if any(not (split_vacuous and f.never_occurs) for f in undecided):
        return ExitCode.INCONCLUSIVE
    return ExitCode.NEVER_OCCURS if undecided else ExitCode.OK


def _output(flag: str | None, configured: str | None, root: Path) -> str | None:
    if flag is not None:
        return flag
    return os.path.relpath(root / configured) if configured is not None else None


def find_config(start: Path | None = None) -> Path:
    """The project config: ``batchcheck.toml`` in the working directory or the nearest folder above it that
    has one (as pytest and ruff find theirs); the working directory's name when none has one (the error then
    names it)."""
    here = (start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        candidate = folder / DEFAULT_CONFIG
        if candidate.is_file():
            return candidate if folder != here else Path(DEFAULT_CONFIG)
    return Path(DEFAULT_CONFIG)


def run_ci(config: str | Path | None = None, jobs: int | None = None, scheduler: Any = None,
           junit: str | None = None, sarif: str | None = None, summary: str | None = None,
           policies: list[str] | None = None, done: Callable[[int, int, Check, Result], None] | None = None,
           base: str | None = None, allow_outside_modules: bool = False) -> CiOutcome:
    """Run the checks a project config names (``policies``: only those of these policy files). ``jobs``:
    local worker processes (default: the config's ``jobs``, else the CPU count); ``scheduler``: a Dask
    scheduler address or distributed.Client instead. Bad input raises InputError before anything runs; each
    finding's files are written as it finishes, the reports rewritten with the findings so far (said unfinished)
    and once more, complete, at the end. Without ``config``, the nearest batchcheck.toml from the working directory
    up is used. ``base``: a git ref (``ci --base``): the checks of the policy files
    changed since it, and [[diff]] entries without old/new compare each with its version there.
    ``allow_outside_modules``: ``invariant_modules`` may name code outside the config's folder."""
    started = time.monotonic()
    if config is None:
        config = find_config()
    cfg, lines = load_config(config)
    plan = build_plan(cfg, lines, str(config), policies, base, allow_outside_modules)
    checks = plan.checks
    total = len(checks)

    inconclusive_gates = cfg.gate.inconclusive == "error"
    outputs = (_output(junit, cfg.output.junit, plan.root), _output(sarif, cfg.output.sarif, plan.root),
               _output(summary, cfg.output.summary, plan.root))
    finished: dict[int, Finding] = {}
    written: list[str] = []

    def report(i: int, result: Result) -> None:
        finding = make_finding(checks[i], result, plan.policies[checks[i].policy.shown], inconclusive_gates)
        written.extend(_write_artifacts(finding, cfg.output.counterexamples, cfg.output.proofs, plan.root))
        finished[i] = finding
        if len(finished) < total:  # the reports so far (the run's end writes the complete ones)
            so_far = [finished[k] for k in sorted(finished)]
            _write_reports(CiOutcome(plan, so_far, exit_code(so_far, cfg.gate.split_vacuous), time.monotonic() - started, where,
                                     notes=list(plan.notes)), outputs, f"{len(finished)} of {total} checks finished")
        if done is not None:
            done(i, total, checks[i], result)

    if scheduler is not None:
        where = f"Dask cluster at {scheduler}" if isinstance(scheduler, str) else "Dask cluster"
        results = run_dask(checks, scheduler, report) if checks else []
    else:
        n = jobs or cfg.jobs or os.cpu_count() or 1
        where = f"{min(n, max(1, total))} local process(es)" if n > 1 else "serial"
        results = run_processes(checks, n, report)
    for i, result in enumerate(results):  # every runner reports each check as it finishes: only a guard
        if i not in finished:
            report(i, result)
    findings = [finished[i] for i in range(total)]
    outcome = CiOutcome(plan, findings, exit_code(findings, cfg.gate.split_vacuous), 0.0, where, written=written)
    outcome.notes += plan.notes
    if plan.not_configured:
        outcome.notes.append("not covered by any entry of the config (not checked): " + ", ".join(plan.not_configured))
    if not checks:
        outcome.notes.append("no check selected")
    outcome.seconds = time.monotonic() - started
    outcome.written += _write_reports(outcome, outputs)
    return outcome


def _write_reports(outcome: CiOutcome, outputs: tuple[str | None, str | None, str | None],
                   unfinished: str | None = None) -> list[str]:
    """Write the JUnit XML, SARIF and summary (those with a path), each atomically; the paths written.
    ``unfinished``: how far a run still going has got (said in each file)."""
    findings, code, seconds, where = outcome.findings, outcome.exit_code, outcome.seconds, outcome.where
    texts = (("--junit", lambda: junit_xml(findings, seconds, unfinished)),
             ("--sarif", lambda: sarif_text(findings, outcome.plan.root, unfinished)),
             ("--summary", lambda: summary_markdown(findings, code, seconds, where, outcome.notes, unfinished)))
    written = []
    for (flag, text), path in zip(texts, outputs):
        if path is not None:
            write_atomic(path, text(), create_dirs=True, flag=flag)
            written.append(path)
    return written


def _write_artifacts(f: Finding, cex_dir: str, proof_dir: str | None, root: Path) -> list[str]:
    """Write a finished check's counterexample and certificate (atomically); the paths written."""
    written = []
    for artifact in f.result.artifacts:
        if artifact.kind == COUNTEREXAMPLE:
            path = os.path.relpath(root / cex_dir / artifact.name)
            f.counterexample = path
            f.result.detail["counterexample"] = path
        elif artifact.kind == CERTIFICATE and proof_dir is not None:
            path = os.path.relpath(root / proof_dir / artifact.name)
            f.certificate = path
            f.result.detail["certificate"] = path
        else:
            continue
        f.result.line = f.result.line.replace(artifact.name, path)
        write_atomic(path, artifact.text, create_dirs=True, flag="output")
        written.append(path)
    return written
