"""Which policy field each finding is about, and on which line of the policy YAML it stands.

One table per kind of check: an invariant (an SLO property kind, a liveness property) names the policy fields whose rule it
judges, most specific first. A finding is located at the first of them the policy file spells out; where
the file leaves them all to their defaults, at the section that would hold the first one, else at the
policy's ``name:`` line, else line 1. Code scanning drops results without a location, so every result
gets one.
"""

from __future__ import annotations

from checker.ci.tomllines import LineMap

INVARIANT_FIELDS: dict[str, tuple[str, ...]] = {
    "kv_never_overcommitted": ("kv.check_allocation", "kv.num_blocks", "kv.watermark"),
    "lookahead_fits": ("speculative.reserve_lookahead", "speculative.num_tokens", "kv.num_blocks"),
    "token_budget": ("batch.max_num_batched_tokens",),
    "seq_cap": ("batch.max_num_seqs",),
    "scheduled_requests_run": ("preemption.triggers", "preemption.victim"),
    "request_conservation": ("kv.allocation", "kv.num_blocks"),
    "sglang_memory_identity": ("sglang.radix_cache", "kv.num_blocks"),
    "prompt_fully_computed": ("batch.max_num_batched_tokens", "sglang.mixed_chunk"),
    "block_pool_conservation": ("kv.prefix_caching", "kv.num_blocks"),
    "no_referenced_block_reused": ("kv.prefix_caching", "kv.num_blocks"),
    "hit_only_on_identical_chain": ("kv.prefix_caching",),
    "cancellation_releases": ("cancellation.release_lag_steps",),
    "finished_releases": ("connector.release", "connector.release_deadline_steps"),
    "no_hold_and_wait": ("connector.holders_first", "connector.release", "connector.release_deadline_steps"),
    "decode_progress": ("batch.phase_mode",),
    "bounded_starvation": ("queue.order", "queue.head_of_line"),
    "no_deadlock": ("admission.reject_never_fits", "kv.num_blocks"),
    "bounded_preemptions": ("preemption.victim", "preemption.triggers"),
    "bounded_preemptions_per_step": ("admission.reject_never_fits", "chunking.long_prefill_token_threshold",
                                     "preemption.victim"),
    "preemption_frees_capacity": ("preemption.mode", "kv.num_blocks"),
    "work_conserving": ("batch.phase_mode",),
    "priority_inversion": ("queue.order", "preemption.triggers"),
    "tenant_fairness": ("queue.order", "queue.vtc"),
    "degradation_order": ("preemption.victim", "queue.order"),
}

SLO_FIELDS: dict[str, tuple[str, ...]] = {
    "latency:queue_delay_ms": ("queue.order", "admission.max_queue_len"),
    "latency:ttft_ms": ("batch.max_num_batched_tokens", "chunking.long_prefill_token_threshold"),
    "latency:tpot_ms": ("batch.phase_mode", "batch.max_num_batched_tokens"),
    "latency:max_tbt_ms": ("batch.phase_mode", "chunking.long_prefill_token_threshold"),
    "latency:e2e_ms": ("batch.max_num_seqs", "batch.max_num_batched_tokens"),
    "rejection_rate": ("admission.max_inflight", "admission.max_queue_len", "admission.max_queued_tokens"),
    "tenant_fairness": ("queue.order", "queue.vtc"),
    "degradation_order": ("queue.order", "preemption.victim"),
    "kv_within_pool": ("kv.check_allocation", "kv.num_blocks"),
    "lookahead_within_pool": ("speculative.reserve_lookahead", "speculative.num_tokens", "kv.num_blocks"),
}

# The liveness properties (docs/liveness.md), also the rules a lasso's bug report quotes (docs/report.md):
# - eventually_served: who is picked from the queue and whether waiting raises a request's rank (order,
#   aging, head-of-line) and whether a newcomer can push a running request out (preemption triggers);
# - no_livelock: a request that can never fit is admitted (reject_never_fits), grows into a pool too small
#   for it and is preempted and recomputed from scratch (mode) again and again;
# - no_deadlock: as the bounded invariant no_deadlock: a request that can never fit, not rejected.
LIVENESS_FIELDS: dict[str, tuple[str, ...]] = {
    "eventually_served": ("queue.order", "queue.aging_interval_ms", "queue.head_of_line", "preemption.triggers"),
    "no_livelock": ("admission.reject_never_fits", "kv.num_blocks", "preemption.mode"),
    "no_deadlock": ("admission.reject_never_fits", "kv.num_blocks"),
    "no_hold_and_wait": ("connector.holders_first", "connector.release", "connector.release_deadline_steps"),
}

DOCUMENT = ""  # the field path of a finding that no table names (a user invariant): the whole policy


def fields_for(kind: str, rule: str, metric: str | None = None) -> tuple[str, ...]:
    if kind == "fuzz":
        return SLO_FIELDS.get(f"{rule}:{metric}", SLO_FIELDS.get(rule, ()))
    if kind == "liveness":
        return LIVENESS_FIELDS.get(rule, ())
    return INVARIANT_FIELDS.get(rule, ())


def locate(fields: tuple[str, ...], lines: LineMap) -> tuple[str, int]:
    """(field path, 1-based line) of the first field the policy file spells out, with the fallbacks above."""
    for path in fields:
        key = tuple(path.split("."))
        if key in lines:
            return path, lines[key]
    if fields:
        section = tuple(fields[0].split("."))[:1]
        if section in lines:
            return fields[0], lines[section]
    if ("name",) in lines:
        return fields[0] if fields else DOCUMENT, lines[("name",)]
    return fields[0] if fields else DOCUMENT, 1


def changed_lines(old_text: str, new_text: str) -> set[int]:
    """The 1-based lines of NEW that a diff from OLD inserts or replaces (where a reviewer's change is)."""
    import difflib

    old, new = old_text.splitlines(), new_text.splitlines()
    changed: set[int] = set()
    for tag, _, _, j1, j2 in difflib.SequenceMatcher(None, old, new, autojunk=False).get_opcodes():
        if tag in ("replace", "insert"):
            changed.update(range(j1 + 1, j2 + 1))
    return changed


def locate_change(fields: tuple[str, ...], lines: LineMap, changed: set[int]) -> tuple[str, int]:
    """A diff finding: at the first of its fields that stands on a changed line; else at the first changed line
    that holds a field (a regression caused by kv.num_blocks is annotated at that line, which a pull request's
    review shows, not at an unchanged one that GitHub hides); else as ``locate``."""
    for path in fields:
        key = tuple(path.split("."))
        if lines.get(key) in changed:
            return path, lines[key]
    on_changed = sorted((line, -len(key), key) for key, line in lines.items() if line in changed)
    if on_changed:
        line, _, key = on_changed[0]
        return ".".join(key), line
    return locate(fields, lines)

