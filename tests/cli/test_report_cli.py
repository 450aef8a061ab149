"""batchcheck report and simulate --plot: files written, exit codes, and bad input word for word (exit 2,
nothing written)."""

from __future__ import annotations

import json

from checker.cli import main
from tests.helpers import POLICIES, ROOT, WORKLOADS

DECODE_STALL = ROOT / "counterexamples" / "vllm_v0_no_chunking__decode_progress__ec9280ee.json"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _png_size(data: bytes) -> tuple[int, int]:
    assert data.startswith(PNG_SIGNATURE)
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def test_report_writes_markdown_and_png(capsys, tmp_path):
    out = tmp_path / "reports"
    code, stdout, err = run(capsys, "report", str(DECODE_STALL), "--out", str(out))
    assert code == 0, err
    md, png = out / f"{DECODE_STALL.stem}.md", out / f"{DECODE_STALL.stem}.png"
    assert stdout == (f"{md}: bug report (decode_progress(gap=1) VIOLATED at iteration 1 (recorded: iteration 1))\n"
                      f"{png}: timeline\n")
    width, height = _png_size(png.read_bytes())
    assert width == 1300 and 400 < height < 900
    assert md.read_text().startswith("# vllm_v0_no_chunking violates decode_progress(gap=1)\n")
    assert sorted(p.name for p in out.iterdir()) == [md.name, png.name]  # no temporary files left


def _bad(capsys, tmp_path, name: str, text: str) -> tuple[int, str, list[str]]:
    path = tmp_path / name
    path.write_text(text)
    out = tmp_path / "out"
    code, _, err = run(capsys, "report", str(path), "--out", str(out))
    return code, err, sorted(p.name for p in out.iterdir()) if out.exists() else []


def test_truncated_counterexample(capsys, tmp_path):
    text = DECODE_STALL.read_text()
    code, err, written = _bad(capsys, tmp_path, "cut.json", text[: len(text) // 2])
    assert (code, written) == (2, [])
    assert err.startswith(f"batchcheck: error: {tmp_path / 'cut.json'}:")
    assert "(document)=<unparsable> (expected valid JSON: " in err


def test_a_file_of_the_wrong_kind(capsys, tmp_path):
    code, err, written = _bad(capsys, tmp_path, "policy.yaml", (POLICIES / "vllm_v1.yaml").read_text())
    assert (code, written) == (2, [])
    assert err == (f"batchcheck: error: {tmp_path / 'policy.yaml'}: format=None (expected 'batchcheck-counterexample' "
                   "(a counterexample written by batchcheck))\n")


def test_corrupted_fields_are_located(capsys, tmp_path):
    doc = json.loads(DECODE_STALL.read_text())
    doc["requests"][1]["prompt_tokens"] = "fourteen"
    code, err, written = _bad(capsys, tmp_path, "bad.json", json.dumps(doc, indent=1))
    assert (code, written) == (2, [])
    line = json.dumps(doc, indent=1).splitlines().index('   "prompt_tokens": "fourteen",') + 1
    assert err == (f"batchcheck: error: {tmp_path / 'bad.json'}:{line}: requests[1].prompt_tokens='fourteen' "
                   "(expected an integer)\n")

    doc = json.loads(DECODE_STALL.read_text())
    doc["policy"]["spec"]["batch"]["max_num_seqs"] = 0
    code, err, written = _bad(capsys, tmp_path, "bad2.json", json.dumps(doc, indent=1))
    assert (code, written) == (2, [])
    assert err.startswith(f"batchcheck: error: {tmp_path / 'bad2.json'}:")
    assert err.endswith(": policy.spec.batch.max_num_seqs=0 (expected a number >= 1)\n")

    doc = json.loads(DECODE_STALL.read_text())
    del doc["violation"]["iteration"]
    code, err, written = _bad(capsys, tmp_path, "bad3.json", json.dumps(doc, indent=1))
    assert (code, written) == (2, [])
    assert err.endswith(": violation.iteration=<missing> (expected the iteration at which the invariant fails)\n")


def test_unwritable_out_writes_nothing(capsys, tmp_path):
    blocker = tmp_path / "taken"
    blocker.write_text("a file, not a directory")
    code, _, err = run(capsys, "report", str(DECODE_STALL), "--out", str(blocker))
    assert code == 2
    assert err == f"batchcheck: error: --out={str(blocker)!r} (expected a directory, not a file)\n"
    code, _, err = run(capsys, "report", str(DECODE_STALL), "--out", str(blocker / "sub"))
    assert code == 2
    assert err == f"batchcheck: error: --out={str(blocker / 'sub')!r} (expected a writable directory (Not a directory))\n"
    assert [p.name for p in tmp_path.iterdir()] == ["taken"]


def test_simulate_plot_writes_the_run_timeline(capsys, tmp_path):
    plot = tmp_path / "run.png"
    code, out, err = run(capsys, "simulate", str(POLICIES / "vllm_v1.yaml"), "--workload",
                         str(WORKLOADS / "chat_mixed.yaml"), "--limit", "12", "--plot", str(plot))
    assert code == 0, err
    assert out.startswith("policy vllm_v1  |  requests from ")
    width, height = _png_size(plot.read_bytes())
    assert width == 1300 and 700 < height < 1600
    code, _, err = run(capsys, "simulate", str(POLICIES / "vllm_v1.yaml"), "--workload",
                       str(WORKLOADS / "chat_mixed.yaml"), "--limit", "3", "--plot", str(tmp_path))
    assert code == 2
    assert err == f"batchcheck: error: --plot={str(tmp_path)!r} (expected a file path for the PNG, not a directory)\n"
