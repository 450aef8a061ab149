"""The library API the CLI calls: load inputs, validate files, run simulations."""

from __future__ import annotations

from pathlib import Path

from checker.audit import AuditContract, AuditResult, AuditWorkload
from checker.engine import SimResult, simulate
from checker.errors import InputError, Problem
from checker.loading import load_document, validate
from checker.policy import Policy
from checker.profile import Profile, load_profile
from checker.traces import Trace, TraceOptions, load_azure_csv, load_requests
from checker.workload import Workload

MODELS = {"policy": Policy, "workload": Workload, "trace": Trace, "profile": Profile}
MODELS.update({"audit-contract": AuditContract, "audit-workload": AuditWorkload})  # batchcheck audit's records


def load_policy(path: str | Path) -> Policy:
    data, lines = load_document(path)
    policy = validate(Policy, data, str(path), lines)
    if policy.name is None:
        policy = policy.model_copy(update={"name": Path(path).stem})
    return policy


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


def run_simulation(policy: str | Path, workload: str | Path | None = None, trace: str | Path | None = None,
                   profile: str | Path | None = None, limit: int | None = None, record: bool = False,
                   options: TraceOptions | None = None) -> SimResult:
    pol = load_policy(policy)
    prof: Profile = load_profile(profile)
    requests = load_requests(workload=workload, trace=trace, limit=limit, options=options)
    return simulate(pol, requests, prof, record=record)


# ----------------------------------------------------------------------------------------- capacity audit
def run_audit(contract: str | Path, workload: str | Path) -> AuditResult:
    """The fluid capacity audit of an audit workload record against the contract it names (docs/audit.md)."""
    from checker.audit import audit_files

    return audit_files(contract, workload)


def run_derived_audit(policy: str | Path, workload: str | Path, profile: str | Path | None = None, *,
                      queue_slo_ms: int | None = None, ttft_slo_ms: int | None = None,
                      tpot_slo_ms: int | None = None) -> AuditResult:
    """The audit of the contract and workload record derived from a policy, a profile (default:
    spec/profiles/default_linear.json) and a batchcheck workload: the system `simulate` runs."""
    from checker.audit import audit, content_id
    from checker.audit.derive import derive
    from checker.loading import load_model
    from checker.profile import DEFAULT_PROFILE

    pol = load_policy(policy)
    prof = load_profile(profile)
    wl = load_model(Workload, workload)
    contract, record, derivation = derive(
        pol, prof, wl, policy_source=str(policy), profile_source=str(profile or DEFAULT_PROFILE),
        workload_source=str(workload), queue_slo_ms=queue_slo_ms, ttft_slo_ms=ttft_slo_ms, tpot_slo_ms=tpot_slo_ms)
    return audit(contract, record, content_id(contract), content_id(record), derived=derivation)


# ----------------------------------------------------------------------------------------- verification
DEFAULT_INVARIANTS = ("kv_never_overcommitted", "token_budget", "seq_cap", "request_conservation")


def run_verify(policy: str | Path, invariants: list[str] | None = None, requests: int = 3, depth: int = 5,
               timeout_s: float = 60.0, workload: str | Path | None = None, out_dir: str | Path | None = "counterexamples",
               prompt: tuple[int, int] | None = None, output: tuple[int, int] | None = None,
               cancellations: bool = True, step_ms: float = 10.0, unbounded: bool = False,
               proof_dir: str | Path | None = "proofs", invariant_modules: list[str] | None = None,
               progress=None):
    """Check invariants of a policy with z3 (bounded model checking); returns (environment, results)."""
    from checker.loading import load_model
    from checker.verify.env import default_environment
    from checker.verify.run import check_one, parse_invariant

    from invariants.plugins import load_entry_points, load_module

    load_entry_points()
    for module in invariant_modules or []:
        load_module(module)
    pol = load_policy(policy)
    chosen = [parse_invariant(text) for text in (invariants or DEFAULT_INVARIANTS)]
    wl = load_model(Workload, workload) if workload is not None else None
    env = default_environment(pol, requests, depth, wl, prompt, output, cancellations, round(step_ms * 1000))
    out = Path(out_dir) if out_dir is not None else None
    proofs = Path(proof_dir) if proof_dir is not None else None
    return env, [check_one(pol, str(policy), inv, params, env, timeout_s, out, unbounded, proofs, progress)
                 for inv, params in chosen]


def run_recheck(certificate: str | Path) -> str:
    """Re-check a proof certificate with a fresh solver: 'unsat' confirms it."""
    from checker.loading import read_text
    from checker.smt.ops import recheck_smt2

    return recheck_smt2(read_text(certificate))


def run_replay(counterexample: str | Path, policy: str | Path | None = None):
    """Re-run a counterexample on the engine (under its own policy, or under another one)."""
    from checker.verify.replay import replay_counterexample

    return replay_counterexample(counterexample, load_policy(policy) if policy is not None else None)


# ----------------------------------------------------------------------------------------- runtime verification
CHECK_LOG_INVARIANTS = ("kv_never_overcommitted", "token_budget", "seq_cap", "request_conservation")


def run_check_log(policy: str | Path, log: str | Path, arrivals: str | Path, invariants: list[str] | None = None,
                  with_conformance: bool = False):
    """Check invariants on a real scheduler's per-step log; optionally compare it with the engine."""
    from checker.checklog import check_log, conformance, load_arrivals, load_log
    from checker.verify.run import parse_invariant

    pol = load_policy(policy)
    arr = load_arrivals(arrivals)
    steps = load_log(log, arr)
    chosen = [parse_invariant(text) for text in (invariants or CHECK_LOG_INVARIANTS)]
    violation, notes = check_log(pol, arr, steps, chosen)
    conf = conformance(pol, arr, steps) if with_conformance else None
    return len(steps), chosen, violation, notes, conf
