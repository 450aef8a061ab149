"""`batchcheck calibrate`: errors word for word, the fit verb end to end, the shipped profiles."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from checker.cli import main
from checker.profile import load_profile
from tests.helpers import ROOT, SHARED_DATA

VIDUR_A100 = SHARED_DATA / "gpu_profiles" / "a100_llama-2-70b_tp2"
PROFILES = ROOT / "spec" / "profiles"
HEADER = ("kind,prefill_tokens,prefill_attention,decode_seqs,decode_kv_tokens,max_context,time_us,spread_us,"
          "device,model,layers,hidden,heads,kv_heads,dtype_bytes,tensor_parallel")
SHAPE = "cpu,toy,2,64,4,2,4,1"


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def table(rows: list[str], header: str = HEADER) -> str:
    return "\n".join([header] + rows) + "\n"


def good_rows() -> list[str]:
    rows = []
    for c in (16, 32, 64, 128, 256):
        for k in (0, 200, 600):
            rows.append(f"prefill,{c},{c * (k + c)},0,0,{k + c},{1000 + 8 * c + 0.002 * c * (k + c):.3f},1.0,{SHAPE}")
    for b in (1, 2, 4, 8, 16, 32):
        for k in (50, 400):
            rows.append(f"decode,0,0,{b},{b * (k + 1)},{k + 1},{1000 + 25 * b + 0.1 * b * (k + 1):.3f},1.0,{SHAPE}")
    return rows


def write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_fit_writes_profile_and_plot_and_reports_held_out_error(capsys, tmp_path):
    csv_path = write(tmp_path, "m.csv", table(good_rows()))
    out_path = str(tmp_path / "toy.json")
    code, out, err = run(capsys, "calibrate", "fit", csv_path, "--out", out_path)
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[0] == f"{out_path}: 1 piece; terms overhead, prefill_token, prefill_attention, decode_seq, decode_kv_token"
    assert lines[1].startswith("  training: 20 shapes, relative error median 0.0 %")
    assert lines[2].startswith("  held out: 7 shapes, relative error median 0.0 %")
    assert lines[3] == "  targets on held-out shapes (median <= 5 %, p95 <= 10 %): met"
    assert lines[4] == ("  measured range: scheduled tokens up to 256, decode sequences up to 32, context up to 856; "
                        "beyond it times are extrapolated")
    assert lines[5] == f"  residual plot: {tmp_path / 'toy.residuals.png'}"
    piece = load_profile(out_path).pieces[0]
    assert (piece.overhead_us, piece.per_prefill_token_us, piece.per_decode_seq_us) == pytest.approx((1000, 8, 25), rel=1e-3)


def test_fit_exits_1_when_the_held_out_error_misses_the_targets(capsys, tmp_path):
    noisy = [",".join(parts[:6] + [f"{float(parts[6]) * (1.6 if i % 2 else 1.0):.3f}"] + parts[7:])
             for i, parts in enumerate(r.split(",") for r in good_rows())]  # every other time 60 % too long
    code, out, _ = run(capsys, "calibrate", "fit", write(tmp_path, "m.csv", table(noisy)), "--out",
                       str(tmp_path / "p.json"), "--no-plot")
    assert code == 1
    assert "  targets on held-out shapes (median <= 5 %, p95 <= 10 %): MISSED" in out.splitlines()
    assert (tmp_path / "p.json").exists() and not (tmp_path / "p.residuals.png").exists()


def test_fit_flags_policy_limits_beyond_the_measured_range(capsys, tmp_path):
    code, out, _ = run(capsys, "calibrate", "fit", write(tmp_path, "m.csv", table(good_rows())), "--out",
                       str(tmp_path / "toy.json"), "--no-plot", "--policy", str(ROOT / "spec/policies/vllm_v1.yaml"))
    assert code == 0
    assert [line for line in out.splitlines() if line.startswith("extrapolation:")] == [
        "extrapolation: vllm_v1: batch.max_num_batched_tokens=8192 is beyond profile toy's measured range "
        "(scheduled tokens per step up to 256); step times past it are extrapolated",
        "extrapolation: vllm_v1: batch.max_num_seqs=256 is beyond profile toy's measured range "
        "(decode sequences per step up to 32); step times past it are extrapolated",
        "extrapolation: vllm_v1: max_model_len=16384 is beyond profile toy's measured range "
        "(context tokens up to 856); step times past it are extrapolated"]


@pytest.mark.parametrize(("rows", "header", "message"), [
    (["decode,0,0,1,51,51,1000.0,1.0,cpu,toy,2,64,4,2,4,1"], HEADER.replace(",spread_us", "").replace(",max_context", ""),
     "{f}:1: columns=<missing max_context, spread_us> (expected the measurement columns kind,prefill_tokens,"
     "prefill_attention,decode_seqs,decode_kv_tokens,max_context,time_us,spread_us,device,model,layers,hidden,heads,"
     "kv_heads,dtype_bytes,tensor_parallel)"),
    ([f"decode,0,0,1,51,51,nan,1.0,{SHAPE}", f"decode,0,0,2,102,51,-3.5,1.0,{SHAPE}"], HEADER,
     "{f}:2: time_us=nan (expected a finite number of microseconds > 0)\n"
     "{f}:3: time_us=-3.5 (expected a finite number of microseconds > 0)"),
    ([f"decode,0,0,1,51,51,1000,x,{SHAPE}", f"warmup,0,0,-1,51,51,1000,1,{SHAPE}"], HEADER,
     "{f}:2: spread_us='x' (expected a finite number of microseconds >= 0)\n"
     "{f}:3: kind='warmup' (expected prefill or decode or mixed)\n"
     "{f}:3: decode_seqs=-1 (expected an integer >= 0)"),
    ([f"decode,0,0,0,0,1,1000,1,{SHAPE}"], HEADER,
     "{f}:2: prefill_tokens=0 (expected a batch with at least one prefill token or decode sequence (decode_seqs is 0 too))"),
    ([f"decode,0,0,1,51,51,1000,1,{SHAPE}", "decode,0,0,2,102,51,1100,1,cpu,toy,4,64,4,2,4,1"], HEADER,
     "{f}:3: layers=4 (expected 2, as on line 2: one device and one model shape per measurement file)"),
    ([], HEADER, "{f}: rows=0 (expected at least one measurement row)"),
])
def test_bad_measurement_tables_exit_2_with_located_messages(capsys, tmp_path, rows, header, message):
    path = write(tmp_path, "m.csv", table(rows, header))
    code, out, err = run(capsys, "calibrate", "fit", path, "--out", str(tmp_path / "p.json"))
    assert (code, out) == (2, "")
    assert err == "batchcheck: error: " + message.format(f=path) + "\n"
    assert not (tmp_path / "p.json").exists()


def test_bad_fit_options_exit_2(capsys, tmp_path):
    path = write(tmp_path, "m.csv", table(good_rows()))
    code, _, err = run(capsys, "calibrate", "fit", path, "--out", str(tmp_path / "p.json"), "--terms", "decode_seq,typo")
    assert code == 2
    assert err == ("batchcheck: error: --terms decode_seq,typo: expected names among overhead, prefill_token, "
                   "prefill_attention, decode_seq, decode_kv_token, overhead included\n")
    with pytest.raises(SystemExit) as exit_info:
        main(["calibrate", "fit", path, "--out", "p.json", "--held-out", "1.5"])
    assert exit_info.value.code == 2
    assert "argument --held-out: '1.5' (expected a share >= 0 and < 1, like 0.25)" in capsys.readouterr().err


def test_measure_without_torch_exits_2_and_says_how_to_install_it(capsys, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # what `import torch` sees when torch is not installed
    code, out, err = run(capsys, "calibrate", "measure", "--out", str(tmp_path / "m.csv"))
    assert (code, out) == (2, "")
    assert err == ("batchcheck: error: calibrate measure needs PyTorch: pip install -e '.[calibrate]' (or pip install "
                   "torch==2.13.0); the fit and import-vidur verbs work without it\n")


def test_import_vidur_of_a_missing_directory_exits_2(capsys, tmp_path):
    code, _, err = run(capsys, "calibrate", "import-vidur", str(tmp_path / "nope"), "--out", str(tmp_path / "m.csv"))
    assert code == 2
    assert err == (f"batchcheck: error: {tmp_path / 'nope'}: (document)='{tmp_path / 'nope'}' (expected a directory "
                   "with Vidur's mlp.csv, attention.csv and cpu_overheads.csv)\n")


@pytest.mark.parametrize(("name", "meets_targets"), [("a100-llama-2-70b-tp2", True), ("cpu-small-llama", True)])
def test_shipped_profiles_refit_from_their_tables_with_the_recorded_error(capsys, tmp_path, name, meets_targets):
    shipped = load_profile(PROFILES / f"{name}.json")
    assert shipped.measured
    assert (shipped.fit_error["held_out_median"] <= 0.05 and shipped.fit_error["held_out_p95"] <= 0.10) == meets_targets
    table_path = (PROFILES / shipped.calibration.measurements).resolve()
    refit = tmp_path / f"{name}.json"
    code, _, _ = run(capsys, "calibrate", "fit", str(table_path), "--out", str(refit), "--no-plot", "--name", name)
    assert code == (0 if meets_targets else 1)
    again = load_profile(refit)
    assert (again.pieces, again.fit_error) == (shipped.pieces, shipped.fit_error)
    assert (PROFILES / f"{name}.residuals.png").exists()


def test_simulate_takes_the_calibrated_profile(capsys):
    code, out, err = run(capsys, "simulate", str(ROOT / "spec/policies/vllm_v1.yaml"), "--workload",
                         str(ROOT / "spec/workloads/chat_mixed.yaml"), "--profile",
                         str(PROFILES / "a100-llama-2-70b-tp2.json"), "--json")
    assert code == 0
    summary = json.loads(out)
    assert summary["profile"] == "a100-llama-2-70b-tp2"
    # vllm_v1's limits lie beyond the A100 data: said on stderr, one line each, never silently
    assert [line.split(" is beyond")[0] for line in err.splitlines()] == [
        "batchcheck: extrapolation: vllm_v1: batch.max_num_batched_tokens=8192",
        "batchcheck: extrapolation: vllm_v1: batch.max_num_seqs=256",
        "batchcheck: extrapolation: vllm_v1: max_model_len=16384"]


@pytest.mark.shared_data
@pytest.mark.skipif(not VIDUR_A100.is_dir(), reason=f"Vidur's A100 profiles are not at {VIDUR_A100} (../shared/data)")
def test_import_vidur_reproduces_the_shipped_measurements(capsys, tmp_path):
    out = tmp_path / "a100.csv"
    shipped = PROFILES / "measurements" / "a100-llama-2-70b-tp2.csv"
    code, text, _ = run(capsys, "calibrate", "import-vidur", str(VIDUR_A100), "--out", str(out),
                        "--device", "A100 (Vidur operator profiles)")
    assert code == 0
    assert text == f"{out}: 2616 batch shapes of llama-2-70b from {VIDUR_A100} (1052 prefill, 1264 decode, 300 mixed)\n"
    assert out.read_text() == shipped.read_text()


def test_calibration_doc_quotes_the_shipped_errors():
    text = (ROOT / "docs" / "calibration.md").read_text()
    for name in ("a100-llama-2-70b-tp2", "cpu-small-llama"):
        e = load_profile(PROFILES / f"{name}.json").fit_error
        row = next(line for line in text.splitlines() if line.startswith(f"| `{name}.json` |"))
        assert (f"| {100 * e['held_out_median']:.1f} % | {100 * e['held_out_p95']:.1f} % "
                f"| {100 * e['held_out_max']:.1f} % |") in row, name
