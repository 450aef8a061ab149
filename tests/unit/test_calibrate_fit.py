"""The fit: non-negative least squares, pieces, held-out split, and the profile it writes."""

from __future__ import annotations

import json

import numpy as np
import pytest

from checker.calibrate.fit import FitOptions, fit, nnls, profile_json, split, write_fit
from checker.calibrate.measurements import Measurement, MeasurementTable, read_measurements
from checker.profile import ModelShape, Piece, Profile, load_profile

SHAPE = ModelShape(name="toy", layers=2, hidden=64, heads=4, kv_heads=2, dtype_bytes=4)


def grid_rows(time_of) -> tuple[Measurement, ...]:
    rows = [Measurement("prefill", c, c * (k + c), 0, 0, k + c, time_of(c, c * (k + c), 0, 0))
            for c in (16, 32, 48, 64, 96, 128, 192, 256, 384, 512) for k in (0, 100, 300, 700)]
    rows += [Measurement("decode", 0, 0, b, b * (k + 1), k + 1, time_of(0, 0, b, b * (k + 1)))
             for b in (1, 2, 4, 8, 16, 32, 64) for k in (50, 200, 800)]
    return tuple(rows)


def test_nnls_matches_least_squares_when_the_solution_is_positive_and_clips_otherwise():
    rng = np.random.default_rng(1)
    a = rng.random((40, 3))
    truth = np.array([2.0, 0.5, 3.0])
    assert np.allclose(nnls(a, a @ truth), truth)
    b = a @ np.array([1.0, -2.0, 1.0])
    x = nnls(a, b)
    assert (x >= 0).all() and x[1] == 0.0
    assert np.allclose(x[[0, 2]], np.linalg.lstsq(a[:, [0, 2]], b, rcond=None)[0])


def test_a_linear_curve_is_recovered_exactly_in_one_piece():
    truth = Piece(overhead_us=900.0, per_prefill_token_us=7.5, per_prefill_attention_us=0.004,
                  per_decode_seq_us=30.0, per_decode_kv_token_us=0.2)
    engine = Profile(name="truth", device="toy", pieces=[truth])
    table = MeasurementTable("toy", SHAPE, grid_rows(lambda *f: float(engine.iteration_us(*f))))
    result = fit(table, "m.csv", "p.json")
    assert len(result.profile.pieces) == 1
    piece = result.profile.pieces[0]
    for field in ("overhead_us", "per_prefill_token_us", "per_prefill_attention_us", "per_decode_seq_us",
                  "per_decode_kv_token_us"):
        assert getattr(piece, field) == pytest.approx(getattr(truth, field), rel=2e-3), field
    assert result.errors()["max"] < 1e-3


def test_a_bend_gets_its_own_piece_and_the_errors_come_from_the_engine_formula():
    def time_of(prefill, attention, seqs, kv):  # flat until 64 scheduled tokens, then linear
        tokens = prefill + seqs
        return 5000.0 + 0.001 * attention + (0.0 if tokens <= 64 else 60.0 * (tokens - 64))

    table = MeasurementTable("toy", SHAPE, grid_rows(time_of))
    one = fit(table, "m.csv", "p.json", opt=FitOptions(max_pieces=1))
    more = fit(table, "m.csv", "p.json")
    assert len(more.profile.pieces) > 1
    assert more.errors()["p95"] < one.errors()["p95"] / 3
    engine = np.array([more.profile.iteration_us(m.prefill_tokens, m.prefill_attention, m.decode_seqs,
                                                  m.decode_kv_tokens) for m in table.rows])
    assert (engine == more.predicted_us).all()


def test_held_out_split_is_seeded_and_takes_a_share_of_each_kind():
    table = MeasurementTable("toy", SHAPE, grid_rows(lambda *f: 1000.0 + sum(f)))
    held = split(table, FitOptions(held_out=0.25, seed=3))
    assert (held == split(table, FitOptions(held_out=0.25, seed=3))).all()
    assert not (held == split(table, FitOptions(held_out=0.25, seed=4))).all()
    kinds = table.kinds()
    assert held[kinds == "prefill"].sum() == 10 and held[kinds == "decode"].sum() == 5


def test_dropping_a_term_keeps_its_coefficient_zero():
    table = MeasurementTable("toy", SHAPE, grid_rows(lambda p, a, s, k: 1000.0 + 5 * p + 20 * s + 0.1 * k))
    result = fit(table, "m.csv", "p.json", opt=FitOptions(terms=("overhead", "prefill_token", "decode_seq")))
    assert all(p.per_prefill_attention_us == 0 and p.per_decode_kv_token_us == 0 for p in result.profile.pieces)
    assert result.profile.calibration.terms == ["overhead", "prefill_token", "decode_seq"]


def test_written_profile_loads_records_its_table_and_range_and_the_plot_is_a_png(tmp_path):
    table = MeasurementTable("toy", SHAPE, grid_rows(lambda p, a, s, k: 1000.0 + 5 * p + 20 * s + 0.1 * k))
    csv_path, profile_path = tmp_path / "data" / "m.csv", tmp_path / "p.json"
    table.write(csv_path)
    result = fit(read_measurements(csv_path), csv_path, profile_path)
    written = write_fit(result, profile_path)
    assert [p.name for p in written] == ["p.json", "p.residuals.png"]
    assert written[1].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    profile = load_profile(profile_path)
    assert profile.measured and profile.model == SHAPE
    assert profile.calibration.measurements == "data/m.csv"
    r = profile.calibration.measured_range
    assert (r.max_batched_tokens, r.max_prefill_tokens, r.max_decode_seqs, r.max_context) == (512, 512, 64, 1212)
    assert set(profile.fit_error) == {f"{s}_{k}" for s in ("held_out", "train") for k in ("median", "p95", "max")}
    assert json.loads(profile_json(profile)) == json.loads(profile_path.read_text())


def test_unmeasured_profiles_give_no_extrapolation_notes_and_a_policy_within_range_none_either():
    from checker.api import load_policy
    from checker.calibrate.coverage import extrapolation_notes
    from tests.helpers import POLICIES

    policy = load_policy(POLICIES / "vllm_v1.yaml")
    assert extrapolation_notes(policy, load_profile(None)) == []
    table = MeasurementTable("toy", SHAPE, grid_rows(lambda p, a, s, k: 1000.0 + 5 * p + 20 * s + 0.1 * k))
    profile = fit(table, "m.csv", "p.json").profile
    within = policy.model_copy(update={"max_model_len": 1212, "batch": policy.batch.model_copy(
        update={"max_num_batched_tokens": 512, "max_num_seqs": 64})})
    assert extrapolation_notes(within, profile) == []
    assert len(extrapolation_notes(policy, profile)) == 3


def test_single_sequence_decodes_get_a_piece_of_their_own():
    """A kernel switch between one and two decoding sequences (as on the CPU: matrix-vector for one row)
    is a piece that holds only one-sequence decodes: it fits the overhead and the KV-token cost alone, so
    it needs rows for those two terms, not for all five."""
    def time_of(prefill, attention, seqs, kv):
        jump = 0.0 if prefill + seqs <= 1 else 6000.0
        return 4000.0 + jump + 8.0 * prefill + 0.001 * attention + 800.0 * seqs + 2.0 * kv

    rows = grid_rows(time_of) + tuple(Measurement("decode", 0, 0, 1, k + 1, k + 1, time_of(0, 0, 1, k + 1))
                                      for k in (100, 400, 1200))
    result = fit(MeasurementTable("toy", SHAPE, rows), "m.csv", "p.json", opt=FitOptions(held_out=0.0))
    assert result.profile.pieces[0].max_batched_tokens == 1
    assert result.errors(held_out=False)["max"] < 0.01
