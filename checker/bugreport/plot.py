"""Drawing a timeline as a PNG (matplotlib, Agg canvas; no pyplot, so no global backend state).

Top panel: one row per request, coloured by phase per iteration (waiting, prefill chunk, decode, admitted
without tokens, cancelled still holding KV), with markers where it is preempted, cancelled, finished or
rejected. Below: tokens scheduled per iteration against the token budget, and KV blocks in use against
the pool. Long runs are aggregated into time bins (mean tokens per iteration, peak KV per bin); when a
limit is far above what the run used, that panel is drawn on a log scale so both stay readable.
"""

from __future__ import annotations

import io
from collections.abc import Sequence

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from checker.bugreport.timeline import Event, Phase, Timeline

WIDTH_IN = 13.0
DPI = 100
ROW_IN = 0.34  # height of one request row
PANEL_IN = 1.7  # height of each panel below
CLASS_COLORS = ("#4c78a8", "#f58518", "#54a24b", "#b279a2", "#e45756", "#72b7b2", "#9d755d", "#bab0ac")
TITLE_IN = 0.9
BAR_HEIGHT = 0.62
MAX_BARS = 120  # iterations drawn one bar each; beyond, the lower panels are binned
BINS = 300
LOG_SCALE_BELOW = 0.1  # a panel whose peak is below this share of its limit uses a log scale
LABEL_MIN_SHARE = 0.035  # a prefill chunk at least this share of the x span is labelled with its tokens
LABEL_MAX_SEGMENTS = 60  # no chunk labels on busier rows
BINNED_MARKER_SCALE = 0.4  # long runs: smaller markers, so short requests stay visible under them
X_PAD_SHARE = 0.015  # room at both ends for the markers at the first and last edge

PHASE_STYLE: dict[Phase, dict] = {
    Phase.WAITING: {"facecolor": "#d4d4d4", "edgecolor": "#a0a0a0"},
    Phase.REQUEUED: {"facecolor": "#f3b3b3", "edgecolor": "#c86464"},
    Phase.PREFILL: {"facecolor": "#3a6fb0", "edgecolor": "#1f3f66"},
    Phase.DECODE: {"facecolor": "#4fa35b", "edgecolor": "#2b6a35"},
    Phase.STALLED: {"facecolor": "#f2c14e", "edgecolor": "#a07000", "hatch": "///"},
    Phase.HELD: {"facecolor": "#9a9a9a", "edgecolor": "#404040", "hatch": "xx"},
}
EVENT_STYLE: dict[Event, dict] = {
    Event.PREEMPTED: {"marker": "v", "color": "#c0392b", "s": 70},
    Event.CANCELLED: {"marker": "X", "color": "#111111", "s": 70},
    Event.FINISHED: {"marker": "o", "color": "#111111", "s": 30},
    Event.REJECTED: {"marker": "s", "color": "#c0392b", "s": 45},
}
BUDGET_COLOR = "#c0392b"
VIOLATION_COLOR = "#e74c3c"
CYCLE_COLORS = ("#f39c12", "#8e44ad")  # a lasso's cycle: first and second turn
PREFILL_COLOR = PHASE_STYLE[Phase.PREFILL]["facecolor"]
DECODE_COLOR = PHASE_STYLE[Phase.DECODE]["facecolor"]
KV_COLOR = "#7a5195"
PEAK_COLOR = "#b9d3ee"
OVER_COLOR = "#c0392b"
BAR_EDGE = {"edgecolor": "white", "linewidth": 0.5}  # adjacent bars on a time axis stay apart


def _x(t: Timeline, step: int) -> float:
    return t.edges[step]


def _draw_requests(ax, t: Timeline) -> tuple[set[Phase], set[Event]]:
    span = (t.edges[-1] - t.edges[0]) or 1.0
    marker_scale = 1.0 if t.steps <= MAX_BARS else BINNED_MARKER_SCALE
    phases: set[Phase] = set()
    events: set[Event] = set()
    for y, row in enumerate(t.rows):
        by_phase: dict[Phase, list[tuple[float, float]]] = {}
        for seg in row.segments:
            x0 = _x(t, seg.start)
            by_phase.setdefault(seg.phase, []).append((x0, _x(t, seg.end) - x0))
        for phase, bars in by_phase.items():
            ax.broken_barh(bars, (y - BAR_HEIGHT / 2, BAR_HEIGHT), linewidth=0.6, **PHASE_STYLE[phase])
            phases.add(phase)
        if len(row.segments) <= LABEL_MAX_SEGMENTS:
            for seg in row.segments:
                x0, x1 = _x(t, seg.start), _x(t, seg.end)
                if seg.phase is Phase.PREFILL and (x1 - x0) / span >= LABEL_MIN_SHARE:
                    ax.text((x0 + x1) / 2, y, f"{seg.tokens}", ha="center", va="center", fontsize=8,
                            color="white", fontweight="bold", clip_on=True)
        for mark in row.marks:
            x = _x(t, mark.step + 1 if mark.at_end else mark.step)
            style = EVENT_STYLE[mark.event]
            ax.scatter([x], [y], zorder=4, linewidths=0.8, edgecolors="white", marker=style["marker"],
                       color=style["color"], s=style["s"] * marker_scale)
            events.add(mark.event)
    ax.set_yticks(range(len(t.rows)), [row.label for row in t.rows], fontsize=9)
    ax.set_ylim(len(t.rows) - 0.5, -0.5)
    ax.set_ylabel("requests")
    return phases, events


def _binned(t: Timeline, values: Sequence[int], how: str) -> tuple[np.ndarray, np.ndarray]:
    """Values per time bin: edges of the bins and the mean (per iteration) or max of the iterations in each;
    an empty bin keeps the previous bin's value for 'max' (a level) and is 0 for 'mean' (a rate)."""
    edges = np.asarray(t.edges, dtype=float)
    lo, hi = edges[0], edges[-1]
    bin_edges = np.linspace(lo, hi if hi > lo else lo + 1, BINS + 1)
    idx = np.clip(np.searchsorted(bin_edges, edges[:-1], side="right") - 1, 0, BINS - 1)
    vals = np.asarray(values, dtype=float)
    counts = np.bincount(idx, minlength=BINS)
    if how == "mean":
        return bin_edges, np.bincount(idx, weights=vals, minlength=BINS) / np.maximum(counts, 1)
    out = np.full(BINS, -1.0)
    np.maximum.at(out, idx, vals)
    last = 0.0
    for i in range(BINS):
        last = out[i] = out[i] if counts[i] else last
    return bin_edges, out


def _scale(ax, peak: float, limit: int) -> str:
    if 0 < peak < LOG_SCALE_BELOW * limit:
        ax.set_yscale("log")
        ax.set_ylim(0.7, limit * 2.5)
        return "\n(log scale)"
    ax.set_ylim(0, max(peak, limit) * 1.15)
    return ""


def _bars(t: Timeline) -> tuple[list[float], list[float]]:
    lefts = [t.edges[k] for k in range(t.steps)]
    widths = [(t.edges[k + 1] - t.edges[k]) * (0.8 if t.iteration_axis else 1.0) for k in range(t.steps)]
    if t.iteration_axis:
        lefts = [x + 0.1 for x in lefts]
    return lefts, widths


def _value_labels(ax, t: Timeline, lefts: list[float], widths: list[float], values: Sequence[int]) -> None:
    """The value above each bar wide enough to carry it."""
    span = (t.edges[-1] - t.edges[0]) or 1.0
    for x, w, n in zip(lefts, widths, values):
        if n and w / span >= LABEL_MIN_SHARE:
            ax.text(x + w / 2, n, f"{n}", ha="center", va="bottom", fontsize=8)


def _draw_tokens(ax, t: Timeline) -> None:
    total = [p + d for p, d in zip(t.prefill_tokens, t.decode_tokens)]
    if t.steps <= MAX_BARS:
        lefts, widths = _bars(t)
        ax.bar(lefts, t.prefill_tokens, widths, align="edge", color=PREFILL_COLOR, label="prefill tokens", **BAR_EDGE)
        ax.bar(lefts, t.decode_tokens, widths, bottom=t.prefill_tokens, align="edge", color=DECODE_COLOR,
               label="decode tokens", **BAR_EDGE)
        suffix = _scale(ax, max(total, default=0), t.token_budget)
        ax.set_ylabel("tokens per\niteration" + suffix)
        _value_labels(ax, t, lefts, widths, total)
    else:
        bins, prefill = _binned(t, t.prefill_tokens, "mean")
        _, decode = _binned(t, t.decode_tokens, "mean")
        _, peak = _binned(t, total, "max")
        ax.stairs(peak, bins, fill=True, color=PEAK_COLOR, label="most tokens in one iteration")
        ax.stairs(prefill, bins, fill=True, color=PREFILL_COLOR, label="prefill tokens (mean per iteration)")
        ax.stairs(prefill + decode, bins, baseline=prefill, fill=True, color=DECODE_COLOR,
                  label="decode tokens (mean per iteration)")
        suffix = _scale(ax, float(peak.max(initial=0)), t.token_budget)
        ax.set_ylabel(f"tokens per iteration\n({BINS} time bins){suffix}")
    ax.axhline(t.token_budget, color=BUDGET_COLOR, linestyle="--", linewidth=1.4,
               label=f"token budget ({t.token_budget})")
    ax.legend(loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=8, frameon=False)


def _draw_kv(ax, t: Timeline) -> None:
    if t.steps <= MAX_BARS:
        lefts, widths = _bars(t)
        colors = [OVER_COLOR if kv > t.kv_blocks else KV_COLOR for kv in t.kv_used]
        ax.bar(lefts, t.kv_used, widths, align="edge", color=colors, label="KV blocks in use", **BAR_EDGE)
        suffix = _scale(ax, max(t.kv_used, default=0), t.kv_blocks)
        _value_labels(ax, t, lefts, widths, t.kv_used)
        ax.set_ylabel("KV blocks" + suffix)
    else:
        bins, peak = _binned(t, t.kv_used, "max")
        ax.stairs(peak, bins, fill=True, color=KV_COLOR, alpha=0.85, label="KV blocks in use (peak per bin)")
        suffix = _scale(ax, float(peak.max(initial=0)), t.kv_blocks)
        ax.set_ylabel(f"KV blocks\n({BINS} time bins){suffix}")
    ax.axhline(t.kv_blocks, color=BUDGET_COLOR, linestyle="--", linewidth=1.4, label=f"KV pool ({t.kv_blocks} blocks)")
    handles, _ = ax.get_legend_handles_labels()
    if any(kv > t.kv_blocks for kv in t.kv_used):
        handles.append(Patch(color=OVER_COLOR, label="KV blocks in use, over the pool"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=8, frameon=False)


def _draw_queue(ax, t: Timeline) -> None:
    """Long runs: how many requests run and wait (peak per bin), since the sampled rows show few of them."""
    bins, running = _binned(t, t.running, "max")
    _, waiting = _binned(t, t.waiting, "max")
    ax.stairs(running, bins, color=DECODE_COLOR, linewidth=1.2, label="running (peak per bin)")
    ax.stairs(waiting, bins, color="#777777", linewidth=1.2, label="waiting (peak per bin)")
    ax.set_ylim(0, max(float(running.max(initial=0)), float(waiting.max(initial=0)), 1.0) * 1.15)
    ax.set_ylabel(f"requests\n({BINS} time bins)")
    ax.legend(loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=8, frameon=False)


def _legend(ax, phases: set[Phase], events: set[Event]) -> None:
    handles = [Patch(label=p.value, linewidth=0.6, **PHASE_STYLE[p]) for p in Phase if p in phases]
    for e in Event:
        if e in events:
            style = EVENT_STYLE[e]
            handles.append(Line2D([], [], linestyle="none", marker=style["marker"], color=style["color"],
                                  markersize=7, label=e.value))
    if handles:
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=8, frameon=False)


def _shade_cycle(axes, ax_req, t: Timeline) -> None:
    """A lasso: each turn of its cycle shaded in its own tint, a dashed line where each turn starts."""
    start, length = t.cycle
    parts = []
    for turn, color in enumerate(CYCLE_COLORS):
        first = start + turn * length
        last = min(first + length, t.steps)
        if first >= last:
            break
        parts.append(f"turn {turn + 1}: iteration{'s' if last - first > 1 else ''} "
                     + (f"{first}-{last - 1}" if last - first > 1 else str(first)))
        for ax in axes:
            ax.axvspan(t.edges[first], t.edges[last], color=color, alpha=0.12, zorder=0)
            ax.axvline(t.edges[first], color=color, linestyle="--", linewidth=1.0, zorder=1)
    ax_req.set_title(f"shaded: the cycle of the {t.violation_label} lasso ({'; '.join(parts)})", fontsize=9,
                     color="#6c3483", loc="left")


def draw(t: Timeline) -> Figure:
    """The figure: requests, tokens against the budget, KV blocks against the pool."""
    rows_in = max(1.0, ROW_IN * len(t.rows) + 0.5)
    binned = t.steps > MAX_BARS
    latency = 2 if t.latency else 0  # whole runs: TTFT and queue delay by class, below the KV panel
    panels = [rows_in] + [PANEL_IN] * ((3 if binned else 2) + latency)
    fig = Figure(figsize=(WIDTH_IN, TITLE_IN + sum(panels)), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(panels), 1, sharex=True, height_ratios=panels)
    ax_req, ax_tok, ax_kv = axes[0], axes[-2 - latency], axes[-1 - latency]
    fig.suptitle(t.title, fontsize=11, fontweight="bold")
    if t.steps == 0:
        ax_req.text(0.5, 0.5, "no iterations", transform=ax_req.transAxes, ha="center")
        return fig
    phases, events = _draw_requests(ax_req, t)
    _legend(ax_req, phases, events)
    if binned:
        _draw_queue(axes[1], t)
    _draw_tokens(ax_tok, t)
    _draw_kv(ax_kv, t)
    if latency:
        _draw_latency(axes[-2], t, "ttft_ms", "TTFT (ms)\nby arrival")
        _draw_latency(axes[-1], t, "queue_ms", "queue delay (ms)\nby arrival")
    if t.violation is not None:
        for ax in axes:
            ax.axvspan(t.edges[t.violation], t.edges[t.violation + 1], color=VIOLATION_COLOR, alpha=0.13, zorder=0)
        ax_req.set_title(f"shaded: iteration {t.violation}, where {t.violation_label} is VIOLATED", fontsize=9,
                         color="#a93226", loc="left")
    if t.cycle is not None:
        _shade_cycle(axes, ax_req, t)
    pad = (t.edges[-1] - t.edges[0]) * X_PAD_SHARE
    ax_req.set_xlim(t.edges[0] - pad, t.edges[-1] + pad)
    if t.iteration_axis and t.steps <= LABEL_MAX_SEGMENTS:
        ax_kv.set_xticks([k + 0.5 for k in range(t.steps)], [str(k) for k in range(t.steps)])
    for ax in axes:
        ax.grid(axis="x", color="#e6e6e6", linewidth=0.6)
        ax.set_axisbelow(True)
    axes[-1].set_xlabel(t.x_label if not latency else f"{t.x_label} (latency panels: at each request's arrival)")
    return fig


def _draw_latency(ax, t: Timeline, series: str, label: str) -> None:
    """One point per request that got its first token: its latency at its arrival, coloured by class."""
    for i, c in enumerate(t.latency or []):
        ax.scatter(c.arrival, getattr(c, series), s=6, color=CLASS_COLORS[i % len(CLASS_COLORS)], alpha=0.7,
                   label=f"{c.name} ({len(c.arrival):,})", linewidths=0)
    ax.set_ylabel(label)
    ax.set_ylim(bottom=0)
    ax.legend(loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=8, frameon=False)


def render_png(t: Timeline) -> bytes:
    """The timeline as PNG bytes (drawn in memory, so a file is written whole or not at all)."""
    buffer = io.BytesIO()
    draw(t).savefig(buffer, format="png", dpi=DPI)
    return buffer.getvalue()
