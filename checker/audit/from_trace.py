"""The derived audit's workload record from a real trace instead of a workload spec (docs/audit.md,
"Class rates from a real trace").

The trace is read with the trace options applied (window, load scale, class rule). Its span is the time
from its first to its last arrival; each (class, tenant, priority) group of its requests becomes one audit
class whose rate is the group's served requests over that span, with the same figures as the workload
form (mean prompt and output tokens, longest prompt, cancel share). A trace without tenants or priorities
(the Azure CSV, Mooncake JSONL) has one tenant, ``default``, and priority 0.
"""

from __future__ import annotations

from checker.audit.derive import class_figures, derive_records, served_requests
from checker.audit.records import AuditContract, AuditWorkload
from checker.policy import Policy
from checker.profile import Profile
from checker.traces import RequestSet


def span_us(rs: RequestSet) -> int:
    """First to last arrival, plus one microsecond (a trace of one request spans 1 us, not 0)."""
    return rs.specs[-1].arrival_us - rs.specs[0].arrival_us + 1


def derive_from_trace(policy: Policy, profile: Profile, rs: RequestSet, *, policy_source: str = "<policy>",
                      profile_source: str = "<profile>", trace_source: str = "<trace>",
                      queue_slo_ms: int | None = None, ttft_slo_ms: int | None = None,
                      tpot_slo_ms: int | None = None) -> tuple[AuditContract, AuditWorkload, dict]:
    served = served_requests(policy, rs.specs, f"a trace with at least one request whose prompt is shorter than "
                             f"max_model_len={policy.max_model_len} of {policy_source}", trace_source)
    window = span_us(rs)
    groups: dict[tuple[int, int, int], list] = {}
    for r in served:
        groups.setdefault((r.cls, r.tenant, r.priority), []).append(r)
    per_class = {}
    for cls, _, _ in groups:
        per_class[cls] = per_class.get(cls, 0) + 1
    classes = []
    for (cls, tenant, priority), members in sorted(groups.items()):
        name, tenant_name = rs.class_names[cls], rs.tenant_names[tenant]
        if per_class[cls] > 1:  # a class whose requests differ in tenant or priority: one audit class each
            name = f"{name}:{tenant_name}:p{priority}"
        classes.append(class_figures(policy, name, tenant_name, priority, members, window))
    source = {"trace": trace_source, "requests": len(rs.specs), "trace_span_us": window}
    return derive_records(policy, profile, served, classes, source, policy_source=policy_source,
                          profile_source=profile_source, workload_source=trace_source, queue_slo_ms=queue_slo_ms,
                          ttft_slo_ms=ttft_slo_ms, tpot_slo_ms=tpot_slo_ms)
