"""The capacity audit: a deterministic integer fluid screen of one batching contract against one
workload written for it (docs/audit.md).

- records.py: the contract and workload records, and their content id;
- fluid.py: the arithmetic and the decision;
- derive.py: both records derived from a policy, a profile and a batchcheck workload;
- from_trace.py: the same with the classes and their rates taken from a real trace;
- here: the audit of two record files (``audit_files``) and of the records derived from a policy file
  (``run_derived_audit``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from checker.audit.fluid import BOUNDS, CLAIM, WITHIN, AuditResult, audit
from checker.audit.records import AuditClass, AuditContract, AuditWorkload, Slo, canonical_json, content_id
from checker.errors import InputError, Problem
from checker.inputfiles import PolicyInput, load_policy, policy_source, trace_requests
from checker.loading import LineMap, load_document, load_model, validate
from checker.profile import DEFAULT_PROFILE, load_profile
from checker.traces import TraceOptions
from checker.workload import Workload

__all__ = ["BOUNDS", "CLAIM", "WITHIN", "AuditClass", "AuditContract", "AuditResult", "AuditWorkload", "Slo",
           "audit", "audit_files", "canonical_json", "check_pair", "content_id", "load_contract", "load_workload",
           "run_derived_audit"]

Lines = Callable[[], LineMap]
FOREIGN = "workload belongs to another batching contract"


def _load(model: type[AuditContract] | type[AuditWorkload], path: str | Path) -> tuple[Any, Lines]:
    data, lines = load_document(path)
    want = model.model_fields["format"].default
    given = data.get("format") if isinstance(data, dict) else None
    if isinstance(given, str) and given.startswith("batchcheck-audit-") and given != want:
        hint = "CONTRACT comes first, then the WORKLOAD written for it"
        raise InputError(Problem("format", given, f"{want}: {hint}", lines().get(("format",))), str(path))
    return validate(model, data, str(path), lines), lines


def load_contract(path: str | Path) -> tuple[AuditContract, Lines]:
    return _load(AuditContract, path)


def load_workload(path: str | Path) -> tuple[AuditWorkload, Lines]:
    return _load(AuditWorkload, path)


def check_pair(contract: AuditContract, workload: AuditWorkload, contract_source: str = "<contract>",
               workload_source: str | None = None, workload_lines: Lines | None = None) -> str:
    """Refuse a workload written for another contract (scope or content id differ), or naming a
    tenant the contract's explicit shares do not list. Returns the contract's content id."""
    cid = content_id(contract)
    line_map = workload_lines() if workload_lines else {}

    def at(*loc: Any) -> int | None:  # the line of loc, or of the nearest enclosing field
        for cut in range(len(loc), -1, -1):
            if loc[:cut] in line_map:
                return line_map[loc[:cut]]
        return None

    problems = []
    if workload.scope != contract.scope:
        problems.append(Problem("scope", workload.scope,
                                f"{contract.scope!r}, the scope of {contract_source}: {FOREIGN}", at("scope")))
    if workload.contract_id != cid:
        problems.append(Problem("contract_id", workload.contract_id,
                                f"{cid}, the content id of {contract_source}: {FOREIGN}", at("contract_id")))
    shares = contract.tenant_shares_permille
    if not problems and shares is not None:
        for i, k in enumerate(workload.classes):
            if k.tenant not in shares:
                problems.append(Problem(f"classes[{i}].tenant", k.tenant,
                                        f"a tenant with a share in {contract_source} ({', '.join(sorted(shares))})",
                                        at("classes", i, "tenant")))
    if problems:
        raise InputError(problems, workload_source)
    return cid


def audit_files(contract_path: str | Path, workload_path: str | Path) -> AuditResult:
    contract, _ = load_contract(contract_path)
    workload, lines = load_workload(workload_path)
    cid = check_pair(contract, workload, str(contract_path), str(workload_path), lines)
    return audit(contract, workload, cid, content_id(workload))


def run_derived_audit(policy: PolicyInput, workload: str | Path | None = None, profile: str | Path | None = None, *,
                      queue_slo_ms: int | None = None, ttft_slo_ms: int | None = None,
                      tpot_slo_ms: int | None = None, trace: str | Path | None = None,
                      trace_options: TraceOptions | None = None) -> AuditResult:
    """The audit of the contract and workload record derived from a policy, a profile (default:
    spec/profiles/default_linear.json) and a batchcheck workload: the system `simulate` runs. With
    ``trace`` instead of ``workload``, the classes and their rates come from a real trace (docs/audit.md,
    "Class rates from a real trace")."""
    from checker.audit.derive import derive  # (a name here would hide the module checker.audit.derive)
    from checker.audit.from_trace import derive_from_trace

    pol = load_policy(policy)
    prof = load_profile(profile)
    sources = {"policy_source": policy_source(policy) or f"policy {pol.name} (a Policy object)", "profile_source": str(profile or DEFAULT_PROFILE),
               "queue_slo_ms": queue_slo_ms, "ttft_slo_ms": ttft_slo_ms, "tpot_slo_ms": tpot_slo_ms}
    if trace is not None:
        rs = trace_requests(trace, trace_options)
        contract, record, derivation = derive_from_trace(pol, prof, rs, trace_source=str(trace), **sources)
    else:
        wl = load_model(Workload, workload)
        contract, record, derivation = derive(pol, prof, wl, workload_source=str(workload), **sources)
    return audit(contract, record, content_id(contract), content_id(record), derived=derivation)
