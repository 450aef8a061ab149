"""Where measurements come from: Vidur's operator profiles (shared data) and the PyTorch harness."""

from __future__ import annotations

import csv
import shutil

import pytest

from checker.calibrate.measurements import read_measurements
from checker.calibrate.vidur import CPU_PARTS, LAYER_OPERATORS, LLAMA_2_70B, Grid, import_vidur
from checker.errors import InputError
from tests.helpers import SHARED_DATA

VIDUR_A100 = SHARED_DATA / "gpu_profiles" / "a100_llama-2-70b_tp2"
needs_vidur = pytest.mark.skipif(not VIDUR_A100.is_dir(),
                                 reason=f"Vidur's A100 profiles are not at {VIDUR_A100} (../shared/data)")


def _rows(name: str) -> list[dict[str, str]]:
    with open(VIDUR_A100 / name, newline="") as handle:
        return list(csv.DictReader(handle))


@pytest.mark.shared_data
@needs_vidur
def test_a_decode_row_is_the_sum_of_its_profiled_operators():
    """Recompute one decode iteration by hand from the raw CSVs: batch 16, KV length 1024."""
    table = import_vidur(VIDUR_A100, grid=Grid(decode_stride=1, prefill_stride=1000, mixed_chunks=()))
    row = next(m for m in table.rows if m.kind == "decode" and m.decode_seqs == 16 and m.max_context == 1025)
    mlp = next(r for r in _rows("mlp.csv") if r["num_tensor_parallel_workers"] == "2" and float(r["num_tokens"]) == 16)
    attention = next(r for r in _rows("attention.csv") if r["is_prefill"] == "False" and r["batch_size"] == "16"
                     and r["kv_cache_size"] == "1024")
    cpu = next(r for r in _rows("cpu_overheads.csv") if r["model_name"] == LLAMA_2_70B.cpu_model_name
               and r["batch_size"] == "16")
    layer_ms = sum(float(mlp[f"time_stats.{op}.median"]) for op in LAYER_OPERATORS) + sum(
        float(attention[f"time_stats.{op}.median"]) for op in ("attn_decode", "attn_input_reshape", "attn_output_reshape"))
    expected_ms = 80 * layer_ms + float(mlp["time_stats.emb.median"]) + sum(float(cpu[c]) for c in CPU_PARTS)
    assert row.time_us == pytest.approx(1000 * expected_ms, rel=1e-9)
    assert (row.decode_kv_tokens, row.prefill_tokens) == (16 * 1025, 0)


@pytest.mark.shared_data
@needs_vidur
def test_missing_vidur_columns_are_named(tmp_path):
    for name in ("mlp.csv", "cpu_overheads.csv"):
        shutil.copy(VIDUR_A100 / name, tmp_path / name)
    lines = (VIDUR_A100 / "attention.csv").read_text().splitlines()
    header = lines[0].replace("time_stats.attn_decode.median", "time_stats.attn_decode.p50")
    (tmp_path / "attention.csv").write_text("\n".join([header] + lines[1:3]) + "\n")
    with pytest.raises(InputError) as error:
        import_vidur(tmp_path)
    assert str(error.value) == (f"{tmp_path / 'attention.csv'}:1: columns=<missing time_stats.attn_decode.median> "
                                "(expected Vidur's profile columns (docs/calibration.md))")


def test_measure_times_a_small_grid_and_the_table_round_trips(tmp_path):
    pytest.importorskip("torch", reason="the measurement harness needs the optional torch extra "
                                        "(pip install -e '.[calibrate]')")
    from checker.calibrate.measure import MODELS, MeasureGrid, measure

    grid = MeasureGrid(prefill_chunks=(8, 32), prefill_contexts=(0, 16), decode_batches=(1, 4), decode_contexts=(16,),
                       mixed_chunks=(8,), mixed_decode_batches=(2,), mixed_contexts=(16,))
    table, wall_s = measure(MODELS["tiny-llama"], grid, device="cpu", warmup=1, repeats=2, passes=1)
    assert wall_s > 0
    assert [(m.kind, m.prefill_tokens, m.prefill_attention, m.decode_seqs, m.decode_kv_tokens, m.max_context)
            for m in table.rows] == [
        ("prefill", 8, 64, 0, 0, 8), ("prefill", 8, 192, 0, 0, 24), ("prefill", 32, 1024, 0, 0, 32),
        ("prefill", 32, 1536, 0, 0, 48), ("decode", 0, 0, 1, 17, 17), ("decode", 0, 0, 4, 68, 17),
        ("mixed", 8, 192, 2, 34, 24)]
    assert all(m.time_us > 0 and m.spread_us >= 0 for m in table.rows)
    assert table.model.dtype_bytes == 4 and table.model.layers == 4 and table.device.startswith("cpu (1 thread")
    table.write(tmp_path / "m.csv")
    again = read_measurements(tmp_path / "m.csv")
    assert (again.model, again.device, len(again.rows)) == (table.model, table.device, len(table.rows))
    assert again.rows[0].time_us == pytest.approx(table.rows[0].time_us, abs=1e-3)
