"""Plain-text rendering of simulation summaries (stable, for terminals and logs)."""

from __future__ import annotations


def _num(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.1f}"
    return str(value)


def _table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
    lines = ["  ".join(h.ljust(w) if i == 0 else h.rjust(w) for i, (h, w) in enumerate(zip(header, widths)))]
    for r in rows:
        lines.append("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))))
    return "\n".join(lines)


GROUP_COLUMNS = ["requests", "finished", "rejected", "cancelled", "unfinished", "preemptions",
                 "queue p99", "ttft p50", "ttft p99", "tpot p50", "tpot p99", "max tbt", "e2e p99"]


def _group_row(name: str, g: dict) -> list[str]:
    return [name] + [_num(g[k]) for k in ("requests", "finished", "rejected", "cancelled", "unfinished",
                                          "preemptions")] + [
        _num(g["queue_delay_ms"]["p99"]), _num(g["ttft_ms"]["p50"]), _num(g["ttft_ms"]["p99"]),
        _num(g["tpot_ms"]["p50"]), _num(g["tpot_ms"]["p99"]), _num(g["max_tbt_ms"]["max"]),
        _num(g["e2e_ms"]["p99"])]


CACHE_COLUMNS = ["admitted", "hit tokens", "token hit %", "requests hit", "request hit %", "prefill saved"]


def _pct(rate: float | None) -> str:
    return "-" if rate is None else f"{100 * rate:.1f}"


def _cache_row(name: str, g: dict) -> list[str]:
    c = g["prefix_cache"]
    return [name, _num(c["admitted"]), _num(c["hit_tokens"]), _pct(c["token_hit_rate"]), _num(c["requests_with_hit"]),
            _pct(c["request_hit_rate"]), _num(c["prefill_tokens_saved"])]


def _groups(summary: dict) -> list[tuple[str, dict]]:
    """The table's rows: all, then each class and each tenant when there are several."""
    rows = [("all", summary["overall"])]
    if len(summary["by_class"]) > 1:
        rows += [(f"class {k}", g) for k, g in summary["by_class"].items()]
    if len(summary["by_tenant"]) > 1:
        rows += [(f"tenant {k}", g) for k, g in summary["by_tenant"].items()]
    return rows


def format_summary(summary: dict) -> str:
    e = summary["engine"]
    out = [f"policy {summary['policy']}  |  requests from {summary['source']}  |  profile {summary['profile']}",
           f"steps {e['steps']}  simulated {e['simulated_s']} s  busy {e['busy_s']} s  "
           f"output {e['output_tokens_per_s']} tok/s  KV peak {e['kv_peak_blocks']}/{e['kv_blocks']} blocks "
           f"({e['kv_peak_pct']}%)  running peak {e['running_peak']}  waiting peak {e['waiting_peak']}  "
           f"idle-slot steps {e['idle_slot_steps']}  engine wall {e['wall_s']} s",
           "times in ms"]
    rows = [_group_row(name, g) for name, g in _groups(summary)]
    out.append(_table([""] + GROUP_COLUMNS, rows))
    if "prefix_cache" in summary["overall"]:
        out.append("prefix cache (first admissions; saved: prefill tokens of every admission)")
        out.append(_table([""] + CACHE_COLUMNS, [_cache_row(name, g) for name, g in _groups(summary)]))
    spec = e.get("speculative")
    if spec is not None:
        out.append(f"speculative decoding: {spec['drafts']} drafts verified, {spec['accepted']} accepted "
                   f"(acceptance {_pct(spec['acceptance_rate'])} %), {spec['tokens_per_verifying_row']} tokens per "
                   f"verifying row, {spec['output_tokens_per_step']} output tokens per step")
    rejected = summary["overall"]["rejected_by_reason"]
    if rejected:
        out.append("rejected: " + ", ".join(f"{k} {v}" for k, v in rejected.items()))
    if e["stuck_requests"] and not e["livelock_suspected"]:
        out.append(f"STUCK: {e['stuck_requests']} requests never finished and no event was left that could "
                   "unblock them (a deadlock under this policy)")
    if e["livelock_suspected"]:
        out.append("STOPPED: livelock suspected: tokens kept being scheduled while no request produced a token "
                   "(recompute thrash); the requests left are counted as unfinished")
    if e["step_limit_hit"]:
        out.append("STOPPED at the step limit: metrics cover only the steps run")
    return "\n".join(out)
