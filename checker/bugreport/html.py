"""The bug report as one static HTML file (``report --html``): the markdown report's content, and an
interactive timeline drawn as inline SVG from the same Timeline the PNG is drawn from: one row per request
(segments by phase, markers for events), tokens per iteration against the budget, KV blocks in use against
the pool. Hovering an iteration shows what every panel says there; clicking a request row highlights it. No
server, no external file or script: everything is in the page.
"""

from __future__ import annotations

import html
import json
import re

from checker.bugreport.timeline import Event, Phase, Timeline

ROW_H, LABEL_W, PLOT_W, PANEL_H, PAD = 18, 230, 900, 90, 8
PHASE_COLOURS = {Phase.WAITING: "#d9d9d9", Phase.REQUEUED: "#fdd0a2", Phase.PREFILL: "#4c78a8",
                 Phase.DECODE: "#59a14f", Phase.STALLED: "#9ecae9", Phase.HELD: "#e15759"}
MARKS = {Event.PREEMPTED: "#f28e2b", Event.CANCELLED: "#b07aa1", Event.FINISHED: "#222", Event.REJECTED: "#e15759"}


# ----------------------------------------------------------------------------------------- markdown -> HTML
def _inline(text: str) -> str:
    """One line of the report's markdown as HTML: code spans (any number of backticks), **strong**, backslash
    escapes (checker.bugreport.markdown quotes input text with them); everything else is text, escaped."""
    out: list[str] = []
    pos = 0
    for m in _CODE_SPAN.finditer(text):
        out.append(_text_html(text[pos:m.start()]))
        body = m.group(2)
        if body.startswith(" ") and body.endswith(" ") and body.strip():
            body = body[1:-1]
        out.append(f"<code>{html.escape(body, quote=False)}</code>")
        pos = m.end()
    out.append(_text_html(text[pos:]))
    return "".join(out)


_CODE_SPAN = re.compile(r"(?<![`\\])(`+)(?!`)(.+?)(?<!`)\1(?!`)")


def _text_html(text: str) -> str:
    """Markdown text outside code spans: the PNG image is dropped (the page draws its own timeline), **x** is
    strong, a backslash escape is its character, and every character is HTML-escaped."""
    text = re.sub(r"!\[[^\]]*\]\([^)]*\)", "", text)
    parts = re.split(r"(\\.|\*\*)", text)
    out, strong = [], False
    for part in parts:
        if part == "**":
            out.append("</strong>" if strong else "<strong>")
            strong = not strong
        elif len(part) == 2 and part.startswith("\\"):
            out.append(html.escape(part[1], quote=False))
        else:
            out.append(html.escape(part, quote=False))
    if strong:  # an unpaired ** is text
        out[len(out) - 1 - out[::-1].index("<strong>")] = "**"
    return "".join(out)


def markdown_html(text: str) -> str:
    """The report's markdown (headings, paragraphs, lists, tables, fenced code) as HTML."""
    out: list[str] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("```"):
            ticks = len(line) - len(line.lstrip("`"))
            j = i + 1
            while j < len(lines) and not (lines[j].strip().strip("`") == "" and len(lines[j].strip()) >= ticks):
                j += 1
            out.append("<pre><code>" + html.escape("\n".join(lines[i + 1:j])) + "</code></pre>")
            i = j + 1
        elif line.startswith("#"):
            level = len(line) - len(line.lstrip("#"))
            out.append(f"<h{level}>{_inline(line[level:].strip())}</h{level}>")
            i += 1
        elif line.startswith("|"):
            rows = []
            while i < len(lines) and lines[i].startswith("|"):
                rows.append(lines[i])
                i += 1
            out.append(_table(rows))
        elif line.startswith("- "):
            items = []
            while i < len(lines) and lines[i].startswith("- "):
                items.append(f"<li>{_inline(lines[i][2:])}</li>")
                i += 1
            out.append("<ul>" + "".join(items) + "</ul>")
        elif line.strip():
            para = []
            while i < len(lines) and lines[i].strip() and not lines[i].startswith(("#", "|", "- ", "```")):
                para.append(lines[i])
                i += 1
            text_html = _inline(" ".join(para))
            if text_html.strip():
                out.append(f"<p>{text_html}</p>")
        else:
            i += 1
    return "\n".join(out)


def _cells(row: str) -> list[str]:
    cells = re.split(r"(?<!\\)\|", row.strip())[1:-1]
    return [c.strip().replace("\\|", "|") for c in cells]


def _table(rows: list[str]) -> str:
    head, body = _cells(rows[0]), [_cells(r) for r in rows[2:]]
    th = "".join(f"<th>{_inline(c)}</th>" for c in head)
    trs = "".join("<tr>" + "".join(f"<td>{_inline(c)}</td>" for c in r) + "</tr>" for r in body)
    return f"<table><thead><tr>{th}</tr></thead><tbody>{trs}</tbody></table>"


# ----------------------------------------------------------------------------------------- the timeline as SVG
def _x(t: Timeline, k: float) -> float:
    return LABEL_W + PLOT_W * k / max(t.steps, 1)


def timeline_svg(t: Timeline) -> str:
    rows_h = ROW_H * len(t.rows)
    height = rows_h + 2 * (PANEL_H + PAD) + 3 * PAD
    parts = [f'<svg id="timeline" xmlns="http://www.w3.org/2000/svg" width="{LABEL_W + PLOT_W + PAD}" '
             f'height="{height}" data-steps="{t.steps}">']
    if t.violation is not None:
        parts.append(f'<rect class="violation" x="{_x(t, t.violation):.1f}" y="0" width="{PLOT_W / max(t.steps, 1):.1f}" '
                     f'height="{height}" fill="#fbe3e3"><title>{html.escape(t.violation_label or "violation")} '
                     f'(iteration {t.violation})</title></rect>')
    if t.cycle is not None:
        start, length = t.cycle
        parts.append(f'<rect class="cycle" x="{_x(t, start):.1f}" y="0" width="{_x(t, start + 2 * length) - _x(t, start):.1f}" '
                     f'height="{height}" fill="#eef3fb"><title>the cycle, two turns</title></rect>')
    for n, row in enumerate(t.rows):
        y = n * ROW_H
        parts.append(f'<g class="row" data-rid="{row.rid}" transform="translate(0,{y})">'
                     f'<text x="4" y="{ROW_H - 5}" font-size="11">{html.escape(row.label)}</text>')
        for seg in row.segments:
            w = _x(t, seg.end) - _x(t, seg.start)
            label = seg.phase.value + (f", {seg.tokens} tokens" if seg.tokens else "")
            parts.append(f'<rect class="seg" data-phase="{seg.phase.name}" x="{_x(t, seg.start):.1f}" y="2" '
                         f'width="{max(w, 0.5):.1f}" height="{ROW_H - 4}" fill="{PHASE_COLOURS[seg.phase]}">'
                         f'<title>req {row.rid}: {html.escape(label)}, iterations {seg.start}-{seg.end - 1}</title></rect>')
        for mark in row.marks:
            x = _x(t, mark.step + (1 if mark.at_end else 0))
            colour = MARKS[mark.event]
            parts.append(f'<circle class="mark" data-event="{html.escape(mark.event.value)}" cx="{x:.1f}" '
                         f'cy="{ROW_H / 2}" r="3.5" fill="{colour}"><title>req {row.rid}: '
                         f'{html.escape(mark.event.value)} (iteration {mark.step})</title></circle>')
        parts.append("</g>")
    top = rows_h + 2 * PAD
    parts.append(_panel(t, top, "tokens", [p + d for p, d in zip(t.prefill_tokens, t.decode_tokens)],
                        t.token_budget, "tokens per iteration (prefill + decode)", "token budget"))
    parts.append(_panel(t, top + PANEL_H + PAD, "kv", t.kv_used, t.kv_blocks, "KV blocks in use", "pool"))
    parts.append(f'<line id="cursor" x1="0" x2="0" y1="0" y2="{height}" stroke="#333" stroke-dasharray="3,3" '
                 'visibility="hidden"/></svg>')
    return "".join(parts)


def _panel(t: Timeline, top: float, name: str, values: list[int], limit: int, title: str, limit_name: str) -> str:
    scale = max([limit, *values, 1])

    def y(v: float) -> float:
        return top + PANEL_H - PANEL_H * v / scale
    pts = " ".join(f"{_x(t, k):.1f},{y(v):.1f} {_x(t, k + 1):.1f},{y(v):.1f}" for k, v in enumerate(values))
    return (f'<g class="panel" id="panel-{name}"><text x="4" y="{top + 12}" font-size="11">{html.escape(title)}</text>'
            f'<line x1="{LABEL_W}" x2="{LABEL_W + PLOT_W}" y1="{y(limit):.1f}" y2="{y(limit):.1f}" stroke="#e15759">'
            f'<title>{limit_name}: {limit}</title></line>'
            f'<polyline fill="none" stroke="#4c78a8" stroke-width="1.5" points="{pts}"/></g>')


SCRIPT = """
const svg = document.getElementById('timeline'), info = document.getElementById('info');
const data = JSON.parse(document.getElementById('timeline-data').textContent);
const cursor = document.getElementById('cursor');
svg.addEventListener('mousemove', e => {
  const box = svg.getBoundingClientRect(), x = e.clientX - box.left;
  const k = Math.floor((x - data.label_w) / data.plot_w * data.steps);
  if (k < 0 || k >= data.steps) { cursor.setAttribute('visibility', 'hidden'); return; }
  const cx = data.label_w + data.plot_w * (k + 0.5) / data.steps;
  cursor.setAttribute('x1', cx); cursor.setAttribute('x2', cx); cursor.setAttribute('visibility', 'visible');
  info.textContent = `iteration ${k}: ${data.prefill[k]} prefill + ${data.decode[k]} decode tokens ` +
    `(budget ${data.budget}), KV ${data.kv[k]}/${data.pool} blocks, ${data.running[k]} running, ` +
    `${data.waiting[k]} waiting` + (k === data.violation ? ' | the property fails here' : '');
});
svg.querySelectorAll('g.row').forEach(g => g.addEventListener('click', () => g.classList.toggle('picked')));
"""

STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em; max-width: 1200px; }
table { border-collapse: collapse; margin: 0.5em 0; } td, th { border: 1px solid #ccc; padding: 2px 6px; }
pre { background: #f6f6f6; padding: 0.5em; overflow-x: auto; } code { background: #f6f6f6; }
#info { font-family: monospace; min-height: 1.4em; margin: 0.4em 0; }
g.row.picked rect.seg { stroke: #000; stroke-width: 1.5; } g.row:hover text { font-weight: bold; }
"""


def render(markdown_text: str, t: Timeline, title: str) -> str:
    """The whole page."""
    data = {"steps": t.steps, "label_w": LABEL_W, "plot_w": PLOT_W, "prefill": t.prefill_tokens,
            "decode": t.decode_tokens, "kv": t.kv_used, "pool": t.kv_blocks, "budget": t.token_budget,
            "running": t.running, "waiting": t.waiting, "violation": t.violation}
    blob = json.dumps(data).replace("</", "<\\/")
    return (f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title>"
            f"<style>{STYLE}</style></head><body>\n{markdown_html(markdown_text)}\n"
            f"<h2>Interactive timeline</h2><p>{html.escape(t.title)}. Hover an iteration to read every panel there; "
            f"click a request's row to highlight it.</p><div id=\"info\"></div>\n{timeline_svg(t)}\n"
            f"<script type=\"application/json\" id=\"timeline-data\">{blob}</script>\n<script>{SCRIPT}</script>"
            "\n</body></html>\n")
