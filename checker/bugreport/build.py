"""Building a bug report (markdown and PNG) from a counterexample file, and a timeline PNG from a run.

Everything is rendered in memory first; then the files are written atomically, the PNG before the
markdown that links it, and if the second write fails the first is taken back, so a failed report
leaves nothing behind (checker.fileio.write_atomic; the PNG bytes come from an in-memory buffer).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from checker.bugreport import markdown
from checker.bugreport.plot import render_png
from checker.bugreport.replayed import ReplayedCounterexample, replay_for_report, time_edges
from checker.bugreport.rules import implicated_rules, policy_excerpt, policy_overrides
from checker.bugreport.timeline import ClassLatency, Timeline, build_timeline
from checker.engine import SimResult
from checker.errors import InputError, Problem
from checker.fileio import write_atomic

MAX_ROWS = 40  # request rows drawn for a whole run (spread evenly; the title says so)


@dataclass(frozen=True)
class ReportFiles:
    markdown: Path
    png: Path
    still_violated: bool
    verdict_line: str
    html: Path | None = None


def counterexample_timeline(r: ReplayedCounterexample) -> Timeline:
    pol = r.doc.policy.spec
    name = r.doc.policy.name or pol.name
    t = build_timeline(pol, r.specs, r.decisions, r.edges, title=f"{name}, replayed on the engine: {r.verdict_line}",
                       x_label=r.x_label, iteration_axis=r.iteration_axis, class_names=r.class_names,
                       violation=None if r.lasso else r.violation, violation_label=r.property_label)
    if r.lasso is not None:  # the two turns of the cycle are shaded instead of one failing iteration
        t.cycle = (r.lasso.prefix, r.lasso.cycle)
    return t


def run_timeline(result: SimResult, max_rows: int = MAX_ROWS) -> Timeline:
    """The timeline of a whole engine run (recorded with ``record=True``)."""
    if result.decisions is None:
        raise ValueError("the run was not recorded (simulate(..., record=True))")
    edges, x_label = time_edges(result.decisions, result.end_us)
    specs = result.requests.specs
    title = (f"{result.policy.name} on {Path(result.requests.source).name}: {len(specs):,} requests, "
             f"{len(result.decisions):,} iterations, {result.end_us / 1e6:.1f} s simulated")
    t = build_timeline(result.policy, specs, result.decisions, edges, title=title, x_label=x_label,
                       iteration_axis=False, class_names=result.requests.class_names, max_rows=max_rows)
    if t.rows_capped:
        stride = t.rows[1].rid - t.rows[0].rid if len(t.rows) > 1 else len(specs)
        t.title += f"\nrows: every {_ordinal(stride)} request in arrival order ({len(t.rows)} of {len(specs):,} shown)"
    t.latency = class_latency(result, x_label)
    return t


def class_latency(result: SimResult, x_label: str) -> list[ClassLatency]:
    """Per class, each request's TTFT and queue delay against its arrival (every request, not only the rows)."""
    from checker.metrics import UNSET

    times, names = result.times, result.requests.class_names
    scale = 1e6 if x_label == "time (s)" else 1e3  # the x axis's unit (time_edges)
    out = [ClassLatency(name, [], [], []) for name in names]
    for spec in result.requests.specs:
        first, scheduled = times.first_token[spec.rid], times.first_scheduled[spec.rid]
        if first == UNSET or scheduled == UNSET:
            continue
        c = out[spec.cls]
        c.arrival.append(spec.arrival_us / scale)
        c.ttft_ms.append((first - spec.arrival_us) / 1e3)
        c.queue_ms.append((scheduled - spec.arrival_us) / 1e3)
    return [c for c in out if c.arrival]


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def _output_dir(out_dir: str | Path) -> Path:
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise InputError(Problem("--out", str(out), "a directory, not a file"))
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(Problem("--out", str(out), f"a writable directory ({exc.strerror})")) from None
    return out


def write_together(files: list[tuple[Path, str | bytes]], flag: str) -> None:
    """Write each file atomically, in order; if one fails, restore those already written (their earlier
    content, or no file), so the set is written whole or not at all."""
    done: list[tuple[Path, bytes | None]] = []
    try:
        for path, data in files:
            before = path.read_bytes() if path.is_file() else None
            write_atomic(path, data, flag=flag)
            done.append((path, before))
    except BaseException:
        for path, before in reversed(done):
            if before is None:
                path.unlink(missing_ok=True)
            else:
                write_atomic(path, before, flag=flag)
        raise


def write_report(counterexample: str | Path, out_dir: str | Path = "reports", html: bool = False,
                 invariant_modules: list[str] | None = None) -> ReportFiles:
    """Replay a counterexample on the engine and write ``<name>.md`` and ``<name>.png`` into ``out_dir`` (with
    ``html``, also ``<name>.html``: the same content and an interactive timeline, one static file)."""
    r = replay_for_report(counterexample, invariant_modules)
    timeline = counterexample_timeline(r)
    png = render_png(timeline)
    p = r.doc.property
    overrides = policy_overrides(r.doc.environment)
    rules = implicated_rules(p.kind, p.name, p.spec.model_dump(mode="json") if p.spec is not None else None, overrides)
    excerpt = policy_excerpt(r.doc.policy.file, r.doc.policy.sha256, r.doc.policy.spec.model_dump(mode="json"),
                             rules, Path(counterexample), overrides)
    stem = Path(counterexample).stem
    text = markdown.render(r, timeline, excerpt, rules, f"{stem}.png", str(counterexample))
    out = _output_dir(out_dir)
    md_path, png_path = out / f"{stem}.md", out / f"{stem}.png"
    files: list[tuple[Path, str | bytes]] = [(png_path, png), (md_path, text)]
    html_path = None
    if html:
        from checker.bugreport import html as html_report

        html_path = out / f"{stem}.html"
        files.append((html_path, html_report.render(text, timeline, f"{stem}: bug report")))
    write_together(files, "--out")
    return ReportFiles(md_path, png_path, r.still_violated, r.verdict_line, html_path)


def write_run_plot(result: SimResult, path: str | Path, max_rows: int = MAX_ROWS) -> Path:
    """The timeline of a recorded engine run as a PNG file (``simulate --plot``)."""
    target = Path(path)
    if target.is_dir():
        raise InputError(Problem("--plot", str(target), "a file path for the PNG, not a directory"))
    write_atomic(target, render_png(run_timeline(result, max_rows)), flag="--plot")
    return target
