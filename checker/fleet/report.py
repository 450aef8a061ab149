"""The text summary of a fleet run (``batchcheck fleet`` without --json)."""

from __future__ import annotations

from checker.fleet.properties import Finding


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:,.1f}"


def format_fleet(summary: dict, findings: list[Finding]) -> str:
    offered = summary["offered"]
    lines = [f"fleet {summary['fleet']} ({len(summary['replicas'])} replicas, router {summary['router']}) on "
             f"{summary['requests_source']}: {offered['unique_requests']} requests, {summary['engine']['simulated_s']} "
             f"s simulated in {summary['engine']['wall_s']} s",
             f"  offered {offered['attempts']} ({offered['first']} first attempts, {offered['retry']} retries, "
             f"{offered['reroute']} re-routes): retry amplification {offered['retry_amplification']}",
             f"  goodput {summary['goodput']['requests']} requests within their TTFT SLO "
             f"({summary['goodput']['per_s']}/s)", "",
             f"  {'class':<16} {'requests':>8} {'finished':>8} {'cancelled':>9} {'lost':>6} {'retries':>7} "
             f"{'TTFT p50':>10} {'TTFT p99':>10} {'e2e p99':>10}  (ms)"]
    for name, g in [*summary["by_class"].items(), ("(all)", summary["overall"])]:
        lines.append(f"  {name:<16} {g['requests']:>8} {g['finished']:>8} {g['cancelled']:>9} {g['lost']:>6} "
                     f"{g['retries']:>7} {_ms(g['ttft_ms']['p50']):>10} {_ms(g['ttft_ms']['p99']):>10} "
                     f"{_ms(g['e2e_ms']['p99']):>10}")
    lost = summary["overall"]["lost_by_reason"]
    if lost:
        lines.append("  lost: " + ", ".join(f"{why} {n}" for why, n in lost.items()))
    lines.append("")
    lines.append(f"  {'replica':<16} {'attempts':>8} {'steps':>8} {'busy s':>8} {'KV peak':>8}  lives")
    for r in summary["replicas"]:
        flag = "" if r["up_at_end"] else "  (down at the end)"
        flag += "  (livelock suspected: stopped)" if r["livelock_suspected"] else ""
        lines.append(f"  {r['name']:<16} {r['attempts']:>8} {r['steps']:>8} {r['busy_s']:>8} "
                     f"{r['kv_peak_blocks']:>8}  {r['lives']}{flag}")
    for f in summary["faults"]:
        rec = ", ".join(f"{cls} {'not recovered by the end' if v is None else f'{v:,.0f} ms'}"
                        for cls, v in f["recovery_ms"].items())
        lines.append(f"  fault {f['fault']} ({f['kind']} {f['replica']} at {f['at_ms']:,.0f} ms): recovery "
                     f"{rec or 'not measured (no class has a p99 TTFT SLO)'}")
    if "pools" in summary:
        lines.extend(_pools(summary["pools"]))
    if "canary" in summary:
        lines.extend(_canary(summary["canary"]))
    if summary["engine"]["step_limit_hit"]:
        lines.append("  STOPPED: the step limit was reached; requests left are counted unfinished")
    lines.append("")
    lines.extend(f.line() for f in findings)
    return "\n".join(lines)


def _canary(c: dict) -> list[str]:
    lines = [f"  canary: group {c['group']} ({', '.join(c['replicas'])}; {c['share']:.0%} of requests by {c['key']}, "
             f"{c['requests']} requests): {c['verdict'].upper()}"]
    for name, row in c["classes"].items():
        arm, base = row["canary"], row["baseline"]
        lines.append(f"    {name:<14} p99 TTFT {_ms(arm['ttft_p99_ms'])} vs {_ms(base['ttft_p99_ms'])} ms, lost "
                     f"{arm['lost']}/{arm['served']} vs {base['lost']}/{base['served']}"
                     f"{'' if row['judged'] else '  (too few to judge)'}")
    lines.extend(f"    why: {w}" for w in c["why"])
    return lines


def _pools(p: dict) -> list[str]:
    t = p["transfer_ms"]
    lines = [f"  disaggregated: prefill {', '.join(p['prefill']['groups'])} ({p['prefill']['replicas']} replicas, "
             f"utilisation {p['prefill']['utilisation']:.2f}), decode {', '.join(p['decode']['groups'])} "
             f"({p['decode']['replicas']} replicas, utilisation {p['decode']['utilisation']:.2f}); {p['transfers']} "
             f"transfers, p50 {_ms(t['p50'])} ms, max {_ms(t['max'])} ms"]
    for name, tpot in p["tpot_ms_by_class"].items():
        lines.append(f"    {name:<14} TPOT p50 {_ms(tpot['p50'])} ms, p99 {_ms(tpot['p99'])} ms (after the first token, "
                     "the transfer included)")
    return lines
