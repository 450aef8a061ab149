"""The library facade, on top of every package it fronts (none of them imports it): what the CLI calls.

Here: input file kinds and validation, simulation, the fleet (``fleet``: replicas behind a router, retries,
faults; its search is ``fleet_search``), the capacity audit of record files, replay and proof re-checking,
importers, CI and bug reports. The other entry points live with the
concept they run (docs/design.md, "Who owns what") and are re-exported under the same names: policy files
and overrides (checker.inputfiles), SLO files (checker.fuzz.slo), the derived audit (checker.audit);
verify, fuzz, diff, liveness and check-log are imported on first use (they load z3, Hypothesis or networkx).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from checker.audit import AuditContract, AuditResult, AuditWorkload
from checker.audit import run_derived_audit  # noqa: F401  (re-exported)
from checker.engine import SimResult, simulate
from checker.errors import InputError, Problem
from checker.fleet.spec import Fleet
from checker.fuzz.slo import SLOFile
from checker.fuzz.slo import load_slo, slo_file_for  # noqa: F401  (re-exported)
from checker.inputfiles import PolicyInput, load_policy
from checker.inputfiles import apply_overrides, trace_requests  # noqa: F401  (re-exported)
from checker.loading import load_document, validate
from checker.policy import Policy
from checker.profile import Profile, load_profile
from checker.traces import Trace, TraceOptions, load_azure_csv, load_requests
from checker.workload import Workload

MODELS = {"policy": Policy, "workload": Workload, "trace": Trace, "profile": Profile}
MODELS.update({"audit-contract": AuditContract, "audit-workload": AuditWorkload})  # batchcheck audit's records
MODELS["slo"] = SLOFile
MODELS["fleet"] = Fleet  # batchcheck fleet's file (docs/fleet.md)

# Entry points re-exported from the check that owns each, imported on first use (see __getattr__).
_ON_FIRST_USE = {"DEFAULT_INVARIANTS": "checker.verify.run", "run_verify": "checker.verify.run",
                 "run_fuzz": "checker.fuzz.run", "DIFF_INVARIANTS": "checker.diff.run", "run_diff": "checker.diff.run",
                 "liveness_env": "checker.liveness.check", "run_liveness": "checker.liveness.check",
                 "CHECK_LOG_INVARIANTS": "checker.checklog", "run_check_log": "checker.checklog"}
_ON_FIRST_USE["fleet_search"] = "checker.fleet.search"  # the fleet's Hypothesis search (docs/fleet.md)
_ON_FIRST_USE["fleet_sweep"] = "checker.fleet.sweep"  # the sweep over fleet configurations (docs/fleet.md)


def __getattr__(name: str):
    if name not in _ON_FIRST_USE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = globals()[name] = getattr(importlib.import_module(_ON_FIRST_USE[name]), name)
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_ON_FIRST_USE})


def json_schema(kind: str) -> dict:
    return MODELS[kind].model_json_schema()


def guess_kind(path: str | Path, data: object) -> str:
    if str(path).endswith(".csv"):
        return "trace"
    if isinstance(data, dict):
        if data.get("format") == "batchcheck-trace":
            return "trace"
        if data.get("format") == "batchcheck-profile":
            return "profile"
        if data.get("format") == "batchcheck-slo":
            return "slo"
        if data.get("format") == "batchcheck-fleet":
            return "fleet"
        if data.get("format") in ("batchcheck-audit-contract", "batchcheck-audit-workload"):
            return str(data["format"]).removeprefix("batchcheck-")
        if "classes" in data:
            return "workload"
        if "kv" in data or "max_model_len" in data:
            return "policy"
    raise InputError(Problem("", Path(path).name, "a policy (has kv:), workload (has classes:), "
                             "trace (format: batchcheck-trace) or profile; or pass --kind"), str(path))


def validate_file(path: str | Path, kind: str | None = None) -> str:
    """Validate one input file; return its kind. Raises InputError on any problem."""
    if str(path).endswith(".csv"):
        load_azure_csv(path)
        return "trace"
    data, lines = load_document(path)
    kind = kind or guess_kind(path, data)
    validate(MODELS[kind], data, str(path), lines)
    return kind


def run_simulation(policy: PolicyInput, workload: str | Path | None = None, trace: str | Path | None = None,
                   profile: str | Path | None = None, limit: int | None = None, record: bool = False,
                   options: TraceOptions | None = None) -> SimResult:
    pol = load_policy(policy)
    prof: Profile = load_profile(profile)
    requests = load_requests(workload=workload, trace=trace, limit=limit, options=options)
    return simulate(pol, requests, prof, record=record)


# ----------------------------------------------------------------------------------------- fleet
def fleet(fleet_file: str | Path, workload: str | Path | None = None, trace: str | Path | None = None,
          limit: int | None = None, replay: str | Path | None = None, options: TraceOptions | None = None):
    """A fleet file run on requests (the workload or trace given, else the one it names; ``options`` apply to a
    trace), or a saved fleet counterexample replayed on it: a checker.fleet.run.FleetRun (summary, and each
    property's verdict)."""
    from checker.fleet.run import replay_fleet, run_fleet

    if replay is not None:
        return replay_fleet(fleet_file, replay)
    return run_fleet(fleet_file, workload, trace, limit, options)


# ----------------------------------------------------------------------------------------- capacity audit
def run_audit(contract: str | Path, workload: str | Path) -> AuditResult:
    """The fluid capacity audit of an audit workload record against the contract it names (docs/audit.md)."""
    from checker.audit import audit_files

    return audit_files(contract, workload)


# ----------------------------------------------------------------------------------------- verification
def run_recheck(certificate: str | Path, policy: PolicyInput | None = None, invariant: str | None = None,
                requests: int | None = None) -> tuple[str, int]:
    """Re-check a proof certificate with a fresh solver: ('unsat', queries) confirms it (a certificate of
    action-wise induction holds one query per scheduler action, whole-step induction one). InputError (exit 2)
    when it is refused: no binding, edited queries, bound to another policy / invariant / N than the ones
    given, or queries unsat by themselves (``recheck_certificate`` says more)."""
    result = recheck_certificate(certificate, policy, invariant, requests)
    return result.solver, result.queries


def recheck_certificate(certificate: str | Path, policy: PolicyInput | None = None, invariant: str | None = None,
                        requests: int | None = None, invariant_modules: list[str] | None = None):
    """``run_recheck`` with what the certificate was held to (a checker.verify.certificate.Recheck)."""
    from checker.verify.certificate import recheck

    for module in invariant_modules or []:
        from invariants.plugins import load_module

        load_module(module)
    pol = load_policy(policy) if policy is not None else None
    parsed = None
    if invariant is not None:
        from checker.verify.run import parse_invariant

        inv, params = parse_invariant(invariant)
        parsed = (inv.name, params)
    shown = str(policy) if policy is not None and not isinstance(policy, Policy) else None
    return recheck(certificate, pol, shown, parsed, requests)


def run_replay(counterexample: str | Path, policy: PolicyInput | None = None,
               invariant_modules: list[str] | None = None) -> tuple[str, bool]:
    """Re-run a counterexample on the engine (under its own policy, or under another one). Returns the
    text to show (an iteration or request table and a verdict line) and whether it still fails. A user
    invariant's module: ``invariant_modules``, else the one the counterexample records."""
    outcome = replay_outcome(counterexample, policy, invariant_modules)
    return outcome.text, outcome.violated


@dataclass
class ReplayOutcome:
    """A counterexample replayed on the engine: the text ``replay`` prints and the same as JSON
    (docs/schemas/replay.schema.json)."""

    text: str
    violated: bool
    doc: dict = field(repr=False)

    def as_dict(self) -> dict:
        return {**self.doc, "violated": self.violated}


def replay_outcome(counterexample: str | Path, policy: PolicyInput | None = None,
                   invariant_modules: list[str] | None = None) -> ReplayOutcome:
    """``run_replay`` with the replay's figures as well (``ReplayOutcome.as_dict``)."""
    from checker.bugreport.document import load_counterexample
    from checker.verify.replay import replay_counterexample, replay_table

    pol = load_policy(policy) if policy is not None else None
    doc, _ = load_counterexample(counterexample, invariant_modules)  # every section checked (types, bounds, states) before replaying
    if doc["property"].get("kind") == "slo":
        from checker.fuzz.counterexample import replay as replay_slo

        r = replay_slo(doc, pol)
        head = f"replaying {counterexample} under policy {r.policy.name}"
        o = r.outcome
        verdict = (f"{r.prop.name} VIOLATED: observed {o.observed} > allowed {o.allowed} ({o.detail}); recorded "
                   f"observed {r.recorded.get('observed')}" if r.violated else
                   f"{r.prop.name} holds on this trace (observed {o.observed}, allowed {o.allowed}): "
                   "the policy no longer fails it")
        figures = {"counterexample": str(counterexample), "kind": "slo", "property": r.prop.name, "params": {},
                   "policy": r.policy.name, "overrides": [], "violation_iteration": None,
                   "recorded_iteration": None, "iterations": None,
                   "slo": {"observed": o.observed, "allowed": o.allowed, "detail": o.detail,
                           "recorded_observed": r.recorded.get("observed")}}
        return ReplayOutcome("\n".join([head, r.table, verdict]), r.violated, figures)
    report = replay_counterexample(counterexample, pol)
    head = f"replaying {counterexample} under policy {report.policy.name}"
    if report.overrides:
        head += f" with the overrides it was found with ({', '.join(report.overrides)})"
    name = report.invariant.name
    verdict = (f"{name} holds on this trace: the policy no longer fails it" if report.violation is None else
               f"{name} VIOLATED at iteration {report.violation} (recorded: iteration {report.recorded_violation})")
    figures = {"counterexample": str(counterexample), "kind": doc["property"]["kind"], "property": name,
               "params": report.params, "policy": report.policy.name, "overrides": list(report.overrides),
               "violation_iteration": report.violation, "recorded_iteration": report.recorded_violation,
               "iterations": _iteration_rows(report), "slo": None}
    return ReplayOutcome("\n".join([head, replay_table(report), verdict]), report.violation is not None, figures)


def _iteration_rows(report) -> list[dict]:
    """The replay table's rows as JSON: what the engine did at each iteration, and whether the property held."""
    from checker.smt.ops import IntOps

    r = report.replay
    return [{"iteration": k, "t_ms": d.now_us / 1000, "admitted": list(d.admitted),
             "scheduled": [{"request": rid, "tokens": n} for rid, n in d.scheduled],
             "preempted": list(d.preempted), "finished": list(d.finished), "cancelled": list(d.cancelled),
             "kv_used": d.kv_blocks_used, "kv_blocks": report.policy.kv.num_blocks, "running": d.num_running,
             "waiting": d.num_waiting, "holds": bool(report.invariant.holds(IntOps, r.ctx, k, report.params))}
            for k, d in enumerate(r.decisions)]


def run_check_metrics(policy: PolicyInput, scrapes: str | Path, checks: list[str] | None = None,
                      stall_scrapes: int | None = None):
    """Check what a server's Prometheus scrapes show against a policy (docs/check-metrics.md). Returns the
    policy and a checker.checkmetrics.CheckMetricsResult; InputError (exit 2) for a bad file."""
    from checker.checkmetrics import DEFAULT_STALL_SCRAPES, check_metrics, load_scrapes

    pol = load_policy(policy)
    return pol, check_metrics(pol, load_scrapes(scrapes), checks, stall_scrapes or DEFAULT_STALL_SCRAPES)


# ----------------------------------------------------------------------------------------- importers
def run_import(system: str, args: list[str] | tuple[str, ...] = (), config: str | Path | None = None, *,
               out: str | Path | None = None, name: str | None = None, vllm_version: str | None = None,
               usage_context: str | None = None, gpu_memory_gib: float | None = None,
               model_weights_gib: float | None = None, kv_bytes_per_token: int | None = None,
               overhead_gib: float | None = None, profile: str | Path | None = None, rules: str | None = None,
               ignore_unknown: bool = False):
    """Import a real server's scheduler configuration as a policy (docs/importers.md): ``system`` is one
    of vllm, sglang, tgi, trtllm, triton; ``args`` are that server's own arguments; ``config`` its config
    file (vLLM YAML, TensorRT-LLM LLM-API YAML, Triton config.pbtxt). The machine options size a KV pool
    that the server would compute at start-up. ``rules`` (sglang only): vllm (the default) maps SGLang
    onto the vLLM-shaped rules, sglang onto the engine's SGLang rules (``scheduler: sglang``). Returns an
    ImportResult (validated policy, YAML text, the assumed / approximated / ignored notes); with ``out``, also
    writes the YAML there atomically. Raises
    InputError/UsageError (exit 2) for an option the policy model cannot express or does not know (every one of
    them in one error); ``ignore_unknown`` leaves the unknown ones out, each listed in ``ignored``."""
    from checker.importers import import_policy
    from checker.importers.common import Machine
    from checker.importers.output import write_atomic

    machine = Machine(gpu_memory_gib, model_weights_gib, kv_bytes_per_token, overhead_gib, profile)
    result = import_policy(system, list(args), config, name=name, machine=machine, vllm_version=vllm_version,
                           usage_context=usage_context, rules=rules, ignore_unknown=ignore_unknown)
    if out is not None:
        write_atomic(out, result.text)
    return result


# ----------------------------------------------------------------------------------------- CI gating
def run_ci(config: str | Path | None = None, jobs: int | None = None, scheduler=None,
           junit: str | None = None, sarif: str | None = None, summary: str | None = None,
           policies: list[str] | None = None, done=None, base: str | None = None,
           allow_outside_modules: bool = False):
    """Run the checks a project config (batchcheck.toml, docs/ci.md) names, in parallel (``jobs`` local
    processes, or a Dask ``scheduler`` address / distributed.Client); write JUnit XML, SARIF 2.1.0 and a
    markdown summary once all have finished. ``policies``: only the checks of these policy files; ``base``: a
    git ref, only the checks of the policy files changed since it, base diffs against it;
    ``allow_outside_modules``: the config's ``invariant_modules`` may name code outside its folder. Returns
    a checker.ci.run.CiOutcome (findings, exit code). Bad config: InputError (exit 2), nothing written."""
    from checker.ci.run import run_ci as _run_ci

    return _run_ci(config, jobs, scheduler, junit, sarif, summary, policies, done, base, allow_outside_modules)


# ----------------------------------------------------------------------------------------- bug reports
def run_report(counterexample: str | Path, out_dir: str | Path = "reports", html: bool = False,
               invariant_modules: list[str] | None = None):
    """Replay a counterexample on the engine and write a markdown bug report and a PNG timeline into
    ``out_dir`` (docs/report.md), with ``html`` also an interactive HTML page. Returns the ReportFiles;
    InputError (exit 2) for a bad file or an unwritable directory, with nothing written. A user invariant's
    module: ``invariant_modules``, else the one the counterexample records."""
    from checker.bugreport.build import write_report

    return write_report(counterexample, out_dir, html, invariant_modules)


def write_run_plot(result: SimResult, path: str | Path) -> Path:
    """The timeline PNG of a run simulated with ``record=True`` (``simulate --plot``)."""
    from checker.bugreport.build import write_run_plot as write_plot

    return write_plot(result, path)
