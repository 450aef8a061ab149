"""`report` quotes what it prints from its input files: a policy name, a policy file name, a class or a tenant
that holds HTML (``</script>``), markdown links or images, backticks, pipes or line breaks stays text in the
markdown report and in the HTML page (issue 23: no injection through a counterexample file)."""

from __future__ import annotations

import json
import re

from checker.bugreport.build import write_report
from checker.bugreport.html import markdown_html
from checker.bugreport.markdown import code, fence, text
from tests.helpers import ROOT

SHIPPED = ROOT / "counterexamples" / "vllm_v0_no_chunking__decode_progress__ec9280ee.json"
HOSTILE_NAME = "</script><script>alert(1)</script>[click](https://evil.example)![x](https://evil.example/x.png)"
HOSTILE_FILE = "a`b``c|d\n# injected heading\n<img src=x onerror=alert(2)>"
HOSTILE_CLASS = "x | y <b>bold</b> **loud**"


def test_text_and_code_spans_quote_everything():
    assert text("a[b](c)") == "a\\[b\\](c)"
    assert text("</script>") == "\\</script>"
    assert text("one\ntwo three") == "one two three"
    assert code("plain") == "`plain`"
    assert code("a`b``c") == "```a`b``c```"
    assert code("`edge`") == "`` `edge` ``"
    assert fence(["```", "x"], "yaml") == ["````yaml", "```", "x", "````"]


def test_the_html_page_reads_the_quoting_back_as_text():
    assert markdown_html(text(HOSTILE_NAME)) == (
        "<p>&lt;/script&gt;&lt;script&gt;alert(1)&lt;/script&gt;[click](https://evil.example)![x](https://evil.example/"
        "x.png)</p>")
    assert markdown_html("from " + code(HOSTILE_FILE)) == (
        "<p>from <code>a`b``c|d # injected heading &lt;img src=x onerror=alert(2)&gt;</code></p>")
    assert markdown_html("\n".join(fence(["```", "<b>"]))) == "<pre><code>```\n&lt;b&gt;</code></pre>"


def _hostile_counterexample(tmp_path):
    doc = json.loads(SHIPPED.read_text())
    doc["policy"]["name"] = HOSTILE_NAME
    doc["policy"]["file"] = HOSTILE_FILE
    for row in doc["requests"]:
        row["class"] = HOSTILE_CLASS
    path = tmp_path / "hostile.json"
    path.write_text(json.dumps(doc))
    return path


def test_a_hostile_counterexample_gives_a_report_that_quotes_it(tmp_path):
    files = write_report(_hostile_counterexample(tmp_path), tmp_path / "out", html=True)
    md = files.markdown.read_text()
    lines = md.splitlines()
    assert lines[0] == ("# \\</script>\\<script>alert(1)\\</script>\\[click\\](https://evil.example)!\\[x\\]"
                        "(https://evil.example/x.png) violates decode_progress(gap=1)")
    assert ("| policy | `" + HOSTILE_NAME + "` from ```a`b``c\\|d # injected heading <img src=x onerror=alert(2)>```, "
            "sha256 `") in md
    assert "# injected heading" not in [line.strip() for line in lines]  # no line of its own
    assert "| 0 | 0 | 1 | 2 | 2 | 1 | 0 | x \\| y \\<b>bold\\</b> \\*\\*loud\\*\\* | 20 |" in lines
    page = files.html.read_text()
    assert len(re.findall(r"<script\b", page)) == 2  # the page's own: its data and its code
    assert "alert(1)</script>" not in page and "<img" not in page and "<b>" not in page
    assert 'href="https://evil.example' not in page and "<a " not in page
    assert "&lt;/script&gt;&lt;script&gt;alert(1)&lt;/script&gt;" in page


def test_a_foreign_file_named_as_the_policy_is_not_echoed(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("root:x:0:0:root:/root:/bin/bash\n")
    doc = json.loads(SHIPPED.read_text())
    doc["policy"]["file"] = str(secret)
    path = tmp_path / "foreign.json"
    path.write_text(json.dumps(doc))
    files = write_report(path, tmp_path / "out", html=True)
    md = files.markdown.read_text()
    assert "root:x" not in md and "root:x" not in files.html.read_text()
    assert (f"From the spec embedded in the counterexample ({secret} does not load as a policy):") in md
