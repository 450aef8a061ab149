"""The bug report as markdown: what failed, where in the policy, under which assumptions, iteration by
iteration (from the engine's replay), the timeline picture, and the command that replays it."""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from typing import Any

import yaml

from checker.bugreport.replayed import ReplayedCounterexample
from checker.bugreport.rules import Excerpt
from checker.bugreport.timeline import Timeline
from checker.semantics.decision import StepDecision

MAX_TABLE_ROWS = 120  # iteration rows after merging repeated steps; the rest is summarised in one line
SHORT_HASH = 12


# ----------------------------------------------------------------------------------------- quoting input text
# Whatever the report prints from its input files (policy and file names, class and tenant names, property
# names and statements, recorded details, the policy's own lines) is quoted so that it cannot become markdown
# or HTML: no link, image, raw HTML (``</script>``), code span or fence it closes, table cell or line it breaks.
# checker/bugreport/html.py reads the same quoting back (backslash escapes, code spans and fences of any length).
# escapes, code, emphasis, links and images, raw HTML and autolinks (a table cell's | is _table's to escape)
_SPECIAL = frozenset("\\`*[]<")
_PROSE = _SPECIAL - frozenset("`*")  # a statement may hold code spans and emphasis: still no link or HTML


def one_line(value: object) -> str:
    return " ".join(str(value).splitlines()) if value is not None else "-"


def text(value: object, special: frozenset[str] = _SPECIAL) -> str:
    """Input text as literal markdown text (backslash escapes; line breaks become spaces)."""
    return "".join("\\" + c if c in special else c for c in one_line(value))


def prose(value: object) -> str:
    """A property's statement: its code spans and emphasis kept, nothing that links, embeds or breaks the line."""
    return text(value, _PROSE)


def code(value: object) -> str:
    """Input text as a markdown code span, on one line: fenced by more backticks than any run it holds (with a
    space inside when it starts or ends with one)."""
    body = one_line(value)
    ticks = "`" * (1 + max(map(len, re.findall(r"`+", body)), default=0))
    pad = " " if body.startswith("`") or body.endswith("`") else ""
    return f"{ticks}{pad}{body}{pad}{ticks}"


def fence(lines: Sequence[str], info: str = "") -> list[str]:
    """Lines as a fenced code block whose fence no line can close (longer than any backtick run in them)."""
    longest = max((len(run) for line in lines for run in re.findall(r"`+", line)), default=0)
    ticks = "`" * max(3, longest + 1)
    return [ticks + info, *lines, ticks]


def _cell(items: Sequence[object]) -> str:
    return ",".join(map(str, items)) or "-"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
    return out


def _quiet_repeat(a: StepDecision, b: StepDecision) -> bool:
    """b does what a did (the same requests, the same tokens) and nothing else changes."""
    return (a.scheduled == b.scheduled and not (b.arrived or b.admitted or b.preempted or b.finished or b.rejected
                                                 or b.cancelled or b.released)
            and (a.num_running, a.num_waiting) == (b.num_running, b.num_waiting))


def iteration_rows(r: ReplayedCounterexample, kv_blocks: int) -> list[list[str]]:
    """One row per iteration; runs of identical quiet iterations (same requests and tokens, no events)
    are merged into one row ``a-b``."""
    d, holds = r.decisions, r.holds
    rows: list[list[str]] = []
    k = 0
    while k < len(d):
        end = k
        while (end + 1 < len(d) and _quiet_repeat(d[k], d[end + 1])
               and (holds is None or holds[end + 1] == holds[k]) and end + 1 != r.violation and k != r.violation
               and (r.lasso is None or r.lasso.part(end + 1) == r.lasso.part(k))):
            end += 1
        first, last = d[k], d[end]
        span = str(k) if end == k else f"{k}-{end}"
        t_ms = f"{first.now_us / 1000:g}" if end == k else f"{first.now_us / 1000:g}-{last.now_us / 1000:g}"
        kv = (f"{first.kv_blocks_used}/{kv_blocks}" if first.kv_blocks_used == last.kv_blocks_used else
              f"{first.kv_blocks_used}->{last.kv_blocks_used}/{kv_blocks}")
        row = [span, t_ms, _cell(first.arrived), _cell(first.admitted),
               " ".join(f"{rid}:{n}" for rid, n in first.scheduled) or "-", _cell(first.preempted),
               _cell(first.finished), _cell(first.cancelled), kv, str(first.num_running), str(first.num_waiting)]
        if r.lasso is not None:
            row.append(r.lasso.part(k))
        if holds is not None:
            row.append("holds" if holds[k] else "**VIOLATED**")
        rows.append(row)
        k = end + 1
    return rows


def _environment_lines(r: ReplayedCounterexample) -> list[str]:
    env = r.doc.environment
    if r.doc.is_slo:
        lines = [f"found by a Hypothesis search (seed {text(env.get('seed'))}, {text(env.get('examples_run'))} examples "
                 f"run) on the workload {code(env.get('workload'))} with the SLO file {code(env.get('slo'))}, then shrunk",
                 "stresses: " + (", ".join(map(text, env.get("stresses", []))) or "-"),
                 f"service-curve profile {code(r.doc.profile.name if r.doc.profile else '-')} (stored in the file): "
                 "time is the engine's, each iteration as long as the profile says"]
        return [f"- {line}" for line in lines]
    if r.lasso is not None:
        return _lasso_environment_lines(r)
    from checker.verify.env import Environment

    try:
        described = Environment(env["requests"], env["depth"], tuple(env["prompt_tokens"]), tuple(env["output_tokens"]),
                                env["max_output_cap"], tuple(env.get("priorities", (0,))), env.get("tenants", 1),
                                env.get("cancellations", True), env.get("step_us", r.doc.clock.step_us),
                                max_accepted=(env.get("speculative") or {}).get("accepted", [0, 0])[1]).describe()
    except (KeyError, TypeError, ValueError):  # an environment written by another version: show it as stored
        described = [f"{text(key)}: {text(value)}" for key, value in env.items()]
    return [f"- {line}" for line in described] + [
        f"- clock: iteration k starts at k x {r.doc.clock.step_us / 1000:g} ms (the verifier's fixed clock)"]


def _lasso_environment_lines(r: ReplayedCounterexample) -> list[str]:
    from checker.liveness.explore import LivenessEnv

    env = r.doc.environment
    try:
        described = LivenessEnv(env["requests_in_flight"], tuple(env["prompt_tokens"]), tuple(env["output_tokens"]),
                                tuple(env.get("priorities", (0,))), env.get("tenants", 1), env.get("cancellations", False),
                                env.get("arrivals_per_step"), env.get("step_us", r.doc.clock.step_us)).describe()
    except (KeyError, TypeError, ValueError):  # an environment written by another version: show it as stored
        described = [f"{text(key)}: {text(value)}" for key, value in env.items() if key != "policy_overrides"]
    overrides = env.get("policy_overrides") or []
    lines = described + ["policy overrides it was found with: " + (", ".join(code(o) for o in overrides) or "none")]
    g = r.doc.graph
    if g:
        generated = f", {g['generated']:,} successor states generated" if "generated" in g else ""
        complete = ("complete: every state reachable in this environment was explored" if g.get("complete") else
                    "not complete: the exploration stopped early")
        lines.append(f"state graph: {g.get('states', '?'):,} states, {g.get('edges', '?'):,} edges{generated}, "
                     f"{g.get('seconds', '?')} s; {complete}")
    return [f"- {line}" for line in lines] + [
        f"- clock: iteration k starts at k x {r.doc.clock.step_us / 1000:g} ms (the fixed clock of the state graph)"]


def _request_rows(r: ReplayedCounterexample) -> list[list[str]]:
    rows = []
    for q in r.doc.requests:
        cancel = "-" if q.cancel_after_ms is None else f"{q.cancel_after_ms:g}"
        rows.append([str(q.id), f"{q.arrival_ms:g}", str(q.prompt_tokens), str(q.output_tokens),
                     str(q.max_output_tokens), str(q.priority), text(q.tenant), text(q.class_ or "-"), cancel])
    return rows


def _excerpt_lines(ex: Excerpt, rules: Sequence[str]) -> list[str]:
    width = max((len(str(n)) for n, _ in ex.lines if n is not None), default=0)
    body = [(f"{n:>{width}}  " if ex.numbered and n is not None else " " * (width + 2) if ex.numbered else "") + text
            for n, text in ex.lines]
    where = (f"{code(ex.source)}, line numbers on the left ({prose(ex.note)})" if ex.numbered else
             f"{text(ex.source)} ({prose(ex.note)})")
    return [f"Rules that decide this property: {', '.join(code(rule) for rule in rules)}. From {where}:", "",
            *fence([one_line(line) for line in body], "text" if ex.numbered else "yaml")]


def _property_lines(r: ReplayedCounterexample) -> list[str]:
    p = r.doc.property
    if r.lasso is not None:
        return [f"**{code(r.property_label)}** (liveness, violated by a lasso: a prefix, then a cycle the system can "
                f"repeat forever): {prose(r.statement)}"]
    if not r.doc.is_slo:
        return [f"**{code(r.property_label)}** (invariant): {prose(r.statement)}"]
    spec: dict[str, Any] = p.spec.model_dump(mode="json", by_alias=True) if p.spec is not None else {}
    flow = yaml.safe_dump(spec, default_flow_style=True, sort_keys=False, width=10_000).strip()
    return [f"**{code(p.name)}** (SLO property, kind {code(spec.get('kind'))}): {prose(r.statement)}", "",
            f"- declared: {code(flow)}",
            f"- recorded when found: observed {text(p.observed)} > allowed {text(p.allowed)} ({text(p.detail)})"]


def _span(iterations: range) -> str:
    return f"iteration {iterations[0]}" if len(iterations) == 1 else f"iterations {iterations[0]}-{iterations[-1]}"


def _reqs(rids: Sequence[int]) -> str:
    return ", ".join(f"req {rid}" for rid in rids) or "none"


def _lasso_lines(r: ReplayedCounterexample, timeline: Timeline) -> list[str]:
    """What the lasso is, and what the engine's replay did on its cycle, per property."""
    from checker.liveness.lasso import EVENTUALLY_SERVED, NO_HOLD_AND_WAIT, NO_LIVELOCK

    lasso, name = r.lasso, r.doc.property.name
    one, two = lasso.turn(1), lasso.turn(2)
    prefix = (f"{_span(range(lasso.prefix))} ({lasso.prefix} iteration{'s' if lasso.prefix != 1 else ''}), from the "
              "empty system" if lasso.prefix else "none: the cycle starts at the empty system")
    first = f"after iteration {lasso.prefix - 1}" if lasso.prefix else "before iteration 0 (the empty system)"
    states = f"the canonical state (docs/liveness.md) {first}, after iteration {one[-1]} and after iteration {two[-1]}"
    closes = (f"on the replay, {states} is the same, so the cycle can repeat forever" if lasso.closes else
              f"**on the replay the cycle does not repeat**: {states} is not the same")
    lines = [f"- prefix: {prefix}",
             f"- cycle: {lasso.cycle} iteration{'s' if lasso.cycle != 1 else ''}, replayed twice: turn 1 is "
             f"{_span(one)}, turn 2 is {_span(two)}",
             f"- {closes}"]
    if name == EVENTUALLY_SERVED:
        if lasso.live_through:
            rid = lasso.live_through[0]
            row = next((row for row in timeline.rows if row.rid == rid), None)
            doing = "; ".join(f"{k}: {row.at(k) or '-'}" for k in one) if row is not None else "-"
            lines.append(f"- req {rid} is live when the cycle starts and stays live through both turns, never served "
                         f"(turn 1, per iteration: {doing})")
        else:
            lines.append(f"- live when the cycle starts: {_reqs(lasso.live_at_start)}; none of them stays live "
                         "through both turns")
        lines.append(f"- meanwhile finished: {_reqs(lasso.finished[0])} in turn 1, {_reqs(lasso.finished[1])} in turn 2"
                     " (each arrival in a turn is a new request)")
    elif name == NO_LIVELOCK:
        preempted = [[rid for k in turn for rid in r.decisions[k].preempted] for turn in (one, two)]
        lines.append(f"- tokens scheduled: {lasso.tokens[0]} in turn 1, {lasso.tokens[1]} in turn 2; finished: "
                     f"{_reqs(lasso.finished[0] + lasso.finished[1])}; cancelled: "
                     f"{_reqs(lasso.cancelled[0] + lasso.cancelled[1])}; preempted: {_reqs(preempted[0])} in turn 1, "
                     f"{_reqs(preempted[1])} in turn 2: work is done and thrown away, no completion")
    elif name == NO_HOLD_AND_WAIT:
        lines.append(f"- every state of the cycle has KV blocks held outside the running batch (a request loading, "
                     f"loaded and waiting, or held after an abort or a finish), and from none of them can the system "
                     f"reach a state where they run or are released; tokens scheduled: {lasso.tokens[0]} in turn 1, "
                     f"{lasso.tokens[1]} in turn 2")
    else:
        cancelled = lasso.cancelled[0] + lasso.cancelled[1]
        lines.append(f"- live when the cycle starts: {_reqs(lasso.live_at_start)}; tokens scheduled: {lasso.tokens[0]} "
                     f"in turn 1, {lasso.tokens[1]} in turn 2; cancelled: {_reqs(cancelled)}")
        if lasso.idle_live and not cancelled:
            lines.append("- nothing can progress: every iteration of both turns starts with live requests, schedules "
                         "no token, and no client cancels")
    return lines


def _what_happened(r: ReplayedCounterexample, timeline: Timeline) -> list[str]:
    if r.violation is None or r.lasso is not None:
        return []
    k = r.violation
    lines = [f"At iteration {k}, where {code(r.property_label)} fails:", ""]
    lines += [f"- {text(row.label)}: {text(row.at(k))}" for row in timeline.rows if row.at(k)]
    return lines + [""]


def render(r: ReplayedCounterexample, timeline: Timeline, excerpt: Excerpt, rules: Sequence[str], png_name: str,
           shown_path: str) -> str:
    """The whole report; ``shown_path`` is the counterexample path as the user gave it (for commands)."""
    doc = r.doc
    pol = doc.policy
    name = pol.name or pol.spec.name or "policy"
    verdict = doc.verdict
    found = str((doc.model_extra or {}).get("#meta", {}).get("source", "batchcheck"))
    minimal = verdict.get("minimality") if verdict.get("minimal") is True else verdict.get("minimal")
    if doc.is_lasso:
        recorded = f"VIOLATED by a lasso: {doc.prefix} iteration(s) to a cycle of {doc.cycle} that repeats forever"
    else:
        recorded = f"VIOLATED at iteration {doc.violation.iteration}" if not doc.is_slo else "VIOLATED"
    recorded += f" (found by {found}" + (f"; minimal: {minimal}" if minimal else "") + ")"
    kv_blocks = pol.spec.kv.num_blocks
    lines = [f"# {text(name)} violates {text(r.property_label)}", ""]
    lines += _table(["", ""], [
        ["verdict", f"**{text(recorded)}**"],
        ["replayed on the engine", text(r.verdict_line) if r.still_violated else f"**{text(r.verdict_line)}**"],
        ["counterexample", code(shown_path)],
        ["policy", code(name) + (f" from {code(pol.file)}" if pol.file else "") + f", sha256 {code(pol.sha256[:SHORT_HASH])}"],
    ])
    if not r.still_violated:
        lines += ["", "**The engine no longer fails this property on the trace**: the semantics changed since the "
                      "counterexample was found, or it was edited. The tables below show what the engine does now."]
    lines += ["", "## Property", "", *_property_lines(r)]
    if r.lasso is not None:
        lines += ["", "## Lasso (replayed on the engine: the prefix, then two turns of the cycle)", "",
                  *_lasso_lines(r, timeline)]
    lines += ["", "## Policy excerpt", "", *_excerpt_lines(excerpt, rules)]
    lines += ["", "## Environment assumptions", "", *_environment_lines(r)]
    lines += ["", "## Requests", "", *_table(["req", "arrival (ms)", "prompt", "output", "max output", "priority",
                                            "tenant", "class", "cancel after (ms)"], _request_rows(r))]
    if r.request_table is not None:
        lines += ["", "Latencies on the engine's replay (ms):", "", *fence(r.request_table.splitlines())]
    header = ["iteration", "t (ms)", "arrived", "admitted", "scheduled (req:tokens)", "preempted", "finished",
              "cancelled", "KV blocks", "running", "waiting"] + (["lasso"] if r.lasso is not None else []) + \
        ([r.property_label] if r.holds is not None else [])
    rows = iteration_rows(r, kv_blocks)
    lines += ["", "## Iterations (replayed on the engine)", "",
              "What each iteration decided, after it ran. Repeated quiet iterations (the same requests and tokens, "
              "nothing else happening) share one row `a-b`.", "", *_what_happened(r, timeline),
              *_table(header, rows[:MAX_TABLE_ROWS])]
    if len(rows) > MAX_TABLE_ROWS:
        lines += ["", f"... {len(rows) - MAX_TABLE_ROWS} more rows (iterations {rows[MAX_TABLE_ROWS][0].split('-')[0]} "
                      f"to {len(r.decisions) - 1}): see the timeline and `batchcheck replay`."]
    lines += ["", "## Timeline", "", f"![timeline: one row per request, tokens and KV blocks per iteration]({png_name})",
              "", "One row per request: waiting, prefill chunks (labelled with their tokens), decode, admitted "
                  "without tokens, holding KV after a cancel; markers where it is preempted, cancelled, finished or "
                  "rejected. Below: tokens per iteration against the token budget, KV blocks in use against the pool."
              + (" The shaded iteration is where the property fails." if r.violation is not None and r.lasso is None
                 else "")
              + (" The two shaded spans are the two turns of the cycle, each starting at a dashed line."
                 if r.lasso is not None else "")]
    command = f"batchcheck replay {shlex.quote(one_line(shown_path))}"
    lines += ["", "## How to replay", "", *fence([command], "bash"), "",
              "It exits 1 while the policy still fails on this trace. To check a fix, replay under the changed policy "
              "(exit 0 once it no longer fails):", "", *fence([f"{command} --policy FIXED_POLICY.yaml"], "bash"), ""]
    return "\n".join(lines)
