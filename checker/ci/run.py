"""``batchcheck ci``: validate the project config, run every check (in parallel), then write the JUnit XML,
SARIF, markdown summary, counterexamples and certificates, all at the end and each atomically."""

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
    scheduler address or distributed.Client instead. Bad input raises InputError before anything runs;
    files are written only after every check has finished. Without ``config``, the nearest batchcheck.toml
    from the working directory up is used. ``base``: a git ref (``ci --base``): the checks of the policy files
    changed since it, and [[diff]] entries without old/new compare each with its version there.
    ``allow_outside_modules``: ``invariant_modules`` may name code outside the config's folder."""
    started = time.monotonic()
    if config is None:
        config = find_config()
    cfg, lines = load_config(config)
    plan = build_plan(cfg, lines, str(config), policies, base, allow_outside_modules)
    checks = plan.checks
    total = len(checks)

    def report(i: int, result: Result) -> None:
        if done is not None:
            done(i, total, checks[i], result)

    if scheduler is not None:
        where = f"Dask cluster at {scheduler}" if isinstance(scheduler, str) else "Dask cluster"
        results = run_dask(checks, scheduler, report) if checks else []
    else:
        n = jobs or cfg.jobs or os.cpu_count() or 1
        where = f"{min(n, max(1, total))} local process(es)" if n > 1 else "serial"
        results = run_processes(checks, n, report)
    pairs = list(zip(checks, results))
    inconclusive_gates = cfg.gate.inconclusive == "error"
    findings = [make_finding(c, r, plan.policies[c.policy.shown], inconclusive_gates) for c, r in pairs]
    outcome = CiOutcome(plan, findings, exit_code(findings, cfg.gate.split_vacuous), 0.0, where)
    outcome.notes += plan.notes
    if plan.not_configured:
        outcome.notes.append("not covered by any entry of the config (not checked): " + ", ".join(plan.not_configured))
    if not checks:
        outcome.notes.append("no check selected")
    _write_artifacts(outcome, cfg.output.counterexamples, cfg.output.proofs, plan.root)
    outcome.seconds = time.monotonic() - started
    reports = (("--junit", lambda: junit_xml(findings, outcome.seconds), _output(junit, cfg.output.junit, plan.root)),
               ("--sarif", lambda: sarif_text(findings, plan.root), _output(sarif, cfg.output.sarif, plan.root)),
               ("--summary", lambda: summary_markdown(findings, outcome.exit_code, outcome.seconds, where,
                                                      outcome.notes), _output(summary, cfg.output.summary, plan.root)))
    for flag, text, path in reports:
        if path is not None:
            write_atomic(path, text(), create_dirs=True, flag=flag)
            outcome.written.append(path)
    return outcome


def _write_artifacts(outcome: CiOutcome, cex_dir: str, proof_dir: str | None, root: Path) -> None:
    for f in outcome.findings:
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
            outcome.written.append(path)
