"""calibrate import-vidur for any model (issue 22 item 7): the layer count from a Hugging Face config.json or
--layers, real profiles of other models (phi-2's MLP profile has no post-attention norm), empty cells, no CPU
overheads, and a clear message for an MLP-only folder."""

from __future__ import annotations

import csv
import gzip
import json
import shutil

import pytest

from checker.calibrate.vidur import LAYER_OPERATORS, Grid, _LayerOps, import_vidur, model_from_hf_config
from checker.cli import main
from checker.errors import InputError
from tests.helpers import ROOT, SHARED_DATA

VIDUR_A100 = SHARED_DATA / "gpu_profiles" / "a100_llama-2-70b_tp2"
PHI2 = ROOT / "tests" / "data" / "vidur" / "a100_phi-2_mlp.csv.gz"
needs_vidur = pytest.mark.skipif(not VIDUR_A100.is_dir(),
                                 reason=f"Vidur's A100 profiles are not at {VIDUR_A100} (../shared/data)")


def test_a_real_phi2_profile_is_read_without_the_norm_it_does_not_have(tmp_path):
    path = tmp_path / "mlp.csv"
    path.write_bytes(gzip.decompress(PHI2.read_bytes()))
    notes: list[str] = []
    ops = _LayerOps(path, 1, notes)
    assert ops.shape == (2560, 32, 32)  # phi-2: hidden 2560, 32 heads
    assert notes == ["mlp.csv: no post_attention_layernorm columns: not in this model, counted 0"]
    with open(path, newline="") as handle:
        row = next(r for r in csv.DictReader(handle) if r["num_tensor_parallel_workers"] == "1"
                   and float(r["num_tokens"]) == float(ops.tokens[0]))
    layer_ms = sum(float(row[f"time_stats.{op}.median"]) for op in LAYER_OPERATORS if op != "post_attention_layernorm")
    assert ops(int(ops.tokens[0]), 32) == pytest.approx(1000 * (32 * layer_ms + float(row["time_stats.emb.median"])))


def test_an_mlp_only_folder_says_there_is_no_attention_profile(tmp_path, capsys):
    (tmp_path / "mlp.csv").write_bytes(gzip.decompress(PHI2.read_bytes()))
    code = main(["calibrate", "import-vidur", str(tmp_path), "--out", str(tmp_path / "m.csv"), "--layers", "32"])
    assert code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"batchcheck: error: {tmp_path / 'attention.csv'}: attention.csv=<missing> (expected "
                          f"Vidur's attention profile: no attention profile in {tmp_path} (")


def test_the_shipped_mlp_only_h100_folder_gets_the_same_message(capsys, tmp_path):
    folder = SHARED_DATA / "gpu_profiles" / "h100_llama-2-7b"
    if not folder.is_dir():
        pytest.skip(f"{folder} is absent (../shared/data)")
    assert main(["calibrate", "import-vidur", str(folder), "--out", str(tmp_path / "m.csv"), "--layers", "32"]) == 2
    assert "no attention profile in" in capsys.readouterr().err


def test_the_layer_count_comes_from_a_hugging_face_config(tmp_path):
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"_name_or_path": "microsoft/phi-2", "num_hidden_layers": 32, "hidden_size": 2560}))
    model = model_from_hf_config(config)
    assert (model.name, model.layers, model.cpu_model_name) == ("phi-2", 32, "microsoft/phi-2")
    config.write_text("[" * 100_000 + "]" * 100_000)  # deeper than the parser goes: an input error, not a crash
    with pytest.raises(InputError):
        model_from_hf_config(config)
    config.write_text(json.dumps({"hidden_size": 2560}))
    with pytest.raises(InputError) as error:
        model_from_hf_config(config)
    assert str(error.value) == (f"{config}: num_hidden_layers=None (expected the model's layer count, 1..1024 (a "
                                "Hugging Face config.json))")


@pytest.mark.shared_data
@needs_vidur
def test_missing_operators_empty_cells_and_no_cpu_overheads_are_handled_and_named(tmp_path, capsys):
    """The 70B profile as another model's would look: no post-attention norm columns, a few empty cells, no
    cpu_overheads.csv; 80 layers from a config.json. Each difference is a note, and the times drop exactly the
    operators and the CPU time that are absent."""
    with open(VIDUR_A100 / "mlp.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    keep = [c for c in rows[0] if "post_attention_layernorm" not in c]
    rows[3]["time_stats.mlp_act.median"] = ""
    with open(tmp_path / "mlp.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, keep, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    lines = (VIDUR_A100 / "attention.csv").read_text().splitlines()
    header = lines[0].split(",")
    decode_row = next(i for i, line in enumerate(lines[1:], 1) if line.split(",")[header.index("is_prefill")] == "False")
    cells = lines[decode_row].split(",")
    cells[header.index("time_stats.attn_decode.median")] = ""
    lines[decode_row] = ",".join(cells)
    (tmp_path / "attention.csv").write_text("\n".join(lines) + "\n")
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"_name_or_path": "meta-llama/Llama-2-70b-hf", "num_hidden_layers": 80}))
    out = tmp_path / "m.csv"
    assert main(["calibrate", "import-vidur", str(tmp_path), "--out", str(out), "--model-config", str(config)]) == 0
    text = capsys.readouterr().out.splitlines()
    assert text[-1].startswith(f"{out}: ") and text[:-1] == ["note: attention.csv: 1 row(s) with empty cells left out",
                        "note: mlp.csv: no post_attention_layernorm columns: not in this model, counted 0",
                        "note: mlp.csv: 1 row(s) with empty cells left out",
                        "note: no cpu_overheads.csv: the engine's CPU time per step is not included (0)"]
    grid = Grid(decode_stride=1, prefill_stride=1000, mixed_chunks=())
    full = {(m.kind, m.decode_seqs, m.max_context): m.time_us for m in import_vidur(VIDUR_A100, grid=grid).rows}
    shutil.copy(VIDUR_A100 / "cpu_overheads.csv", tmp_path / "cpu_overheads.csv")
    partial = import_vidur(tmp_path, model_from_hf_config(config), grid)
    shared = [(m, full[(m.kind, m.decode_seqs, m.max_context)]) for m in partial.rows if m.kind == "decode"]
    assert shared and all(m.time_us < t for m, t in shared)  # the norm's time is gone from every layer
