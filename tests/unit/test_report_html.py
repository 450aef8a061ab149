"""report --html: the markdown report's content and an interactive SVG timeline in one static page, drawn from
the same Timeline as the PNG; rendered in a real headless browser (Debian's chromium) where one is installed."""

from __future__ import annotations

import html.parser
import json
import re
import shutil
import subprocess

import pytest

from checker.bugreport.build import counterexample_timeline
from checker.bugreport.replayed import replay_for_report
from checker.cli import main
from tests.helpers import ROOT

CEX = ROOT / "counterexamples" / "thrash_recompute__bounded_preemptions__db99befb.json"
LASSO = ROOT / "counterexamples" / "strict_priority__eventually_served_lasso__4d3d6ba9.json"
CHROMIUM = next((p for p in (shutil.which("chromium"), shutil.which("chromium-browser")) if p), None)


class Page(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.rows, self.segments, self.scripts, self.external, self.headings = [], [], [], [], []
        self._in_heading = False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "g" and a.get("class") == "row":
            self.rows.append(int(a["data-rid"]))
        if tag == "rect" and a.get("class") == "seg":
            self.segments.append(a["data-phase"])
        if a.get("src") or (tag == "link" and a.get("href")):
            self.external.append((tag, a))
        if tag in ("h1", "h2"):
            self._in_heading = True
            self.headings.append("")

    def handle_endtag(self, tag):
        if tag in ("h1", "h2"):
            self._in_heading = False

    def handle_data(self, data):
        if self._in_heading:
            self.headings[-1] += data


@pytest.mark.parametrize("cex", [CEX, LASSO], ids=["invariant", "lasso"])
def test_the_page_holds_the_report_and_the_timeline_of_the_png(tmp_path, capsys, cex):
    assert main(["report", str(cex), "--out", str(tmp_path), "--html"]) == 0
    out = capsys.readouterr().out.splitlines()
    page_path = tmp_path / f"{cex.stem}.html"
    assert out[-1] == f"{page_path}: the report as one HTML page with an interactive timeline"
    text = page_path.read_text()
    page = Page()
    page.feed(text)
    md = (tmp_path / f"{cex.stem}.md").read_text()
    md_headings = [line.lstrip("#").strip() for line in md.splitlines() if re.match(r"#{1,2} ", line)]
    assert page.headings[:len(md_headings)] == [h.replace("`", "") for h in md_headings]
    assert page.headings[len(md_headings):] == ["Interactive timeline"]
    timeline = counterexample_timeline(replay_for_report(cex))
    assert page.rows == [row.rid for row in timeline.rows]
    assert page.segments == [seg.phase.name for row in timeline.rows for seg in row.segments]
    data = json.loads(re.search(r'<script type="application/json" id="timeline-data">(.*?)</script>', text).group(1))
    assert (data["kv"], data["prefill"], data["decode"]) == (timeline.kv_used, timeline.prefill_tokens,
                                                              timeline.decode_tokens)
    assert data["violation"] == timeline.violation
    assert page.external == []  # one static file: no script, style or image from elsewhere


def test_without_html_no_page_is_written(tmp_path, capsys):
    assert main(["report", str(CEX), "--out", str(tmp_path)]) == 0
    assert not list(tmp_path.glob("*.html"))


@pytest.mark.skipif(CHROMIUM is None, reason="no headless browser: install Debian's chromium (apt-get install "
                    "chromium) to render the page in a real browser")
def test_a_real_headless_browser_renders_the_timeline(tmp_path, capsys):
    assert main(["report", str(CEX), "--out", str(tmp_path), "--html"]) == 0
    capsys.readouterr()
    page = tmp_path / f"{CEX.stem}.html"
    dom = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom", page.as_uri()],
                         capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert '<svg id="timeline"' in dom.stdout and dom.stdout.count('class="row"') == 1
    shot = tmp_path / "shot.png"
    subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", f"--screenshot={shot}",
                    "--window-size=1300,900", page.as_uri()], capture_output=True, timeout=120, check=True)
    assert shot.stat().st_size > 10_000  # a drawn page, not a blank one
