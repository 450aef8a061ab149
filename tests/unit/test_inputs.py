"""Workloads, traces and profiles: generation, parsing, round trips."""

from __future__ import annotations

import json

import pytest

from checker.loading import load_model
from checker.profile import load_profile
from checker.traces import dump_json_trace, load_azure_csv, load_json_trace, load_requests
from checker.workload import Workload, generate
from tests.helpers import AZURE_CSV, WORKLOADS

needs_shared = pytest.mark.skipif(not AZURE_CSV.exists(), reason=f"needs the shared data folder ({AZURE_CSV})")


def test_workload_generation_is_deterministic_for_a_seed():
    w = load_model(Workload, WORKLOADS / "chat_mixed.yaml")
    a, b = generate(w), generate(w)
    assert a == b and len(a) > 100
    other = generate(w.model_copy(update={"seed": w.seed + 1}))
    assert other != a


def test_generated_requests_follow_their_class():
    w = load_model(Workload, WORKLOADS / "chat_mixed.yaml")
    specs = generate(w)
    assert [s.rid for s in specs] == list(range(len(specs)))
    assert all(a.arrival_us <= b.arrival_us for a, b in zip(specs, specs[1:]))
    background = [s for s in specs if s.cls == 1]
    assert all(2000 <= s.prompt_len <= 8000 and s.priority == 5 for s in background)
    assert all(s.output_len <= s.max_output for s in specs)
    rate = len(background) / w.duration_s
    assert 0.25 < rate < 0.6  # declared 0.4/s


def test_bursts_and_fixed_interval_arrivals(tmp_path):
    path = tmp_path / "w.yaml"
    path.write_text("duration_s: 10\nclasses:\n"
                    "  - {name: burst, arrival: {process: bursts, size: 5, every_ms: 4000, spacing_ms: 10},"
                    " prompt_tokens: {dist: fixed, value: 8}, output_tokens: {dist: fixed, value: 2}}\n"
                    "  - {name: tick, arrival: {process: fixed, interval_ms: 2500}, start_ms: 1000,"
                    " prompt_tokens: {dist: choice, values: [4, 6]}, output_tokens: {dist: fixed, value: 1}}\n")
    rs = load_requests(workload=path)
    bursts = [s.arrival_us for s in rs.specs if s.cls == 0]
    ticks = [s.arrival_us for s in rs.specs if s.cls == 1]
    assert bursts == [0, 10_000, 20_000, 30_000, 40_000, 4_000_000, 4_010_000, 4_020_000, 4_030_000, 4_040_000,
                      8_000_000, 8_010_000, 8_020_000, 8_030_000, 8_040_000]
    assert ticks == [1_000_000, 3_500_000, 6_000_000, 8_500_000]


def test_json_trace_round_trip(tmp_path):
    rs = load_requests(workload=WORKLOADS / "chat_mixed.yaml")
    path = tmp_path / "t.json"
    path.write_text(json.dumps(dump_json_trace(rs)))
    back = load_json_trace(path)
    assert [(s.arrival_us, s.prompt_len, s.output_len, s.max_output, s.priority, s.cancel_us) for s in back.specs] == \
           [(s.arrival_us, s.prompt_len, s.output_len, s.max_output, s.priority, s.cancel_us) for s in rs.specs]
    assert [back.class_names[s.cls] for s in back.specs] == [rs.class_names[s.cls] for s in rs.specs]


def test_azure_original_format(tmp_path):
    path = tmp_path / "azure.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                    "2023-11-16 18:15:46.6805900,374,44\n2023-11-16 18:15:50.9951690,396,109\n")
    rs = load_azure_csv(path)
    assert [(s.arrival_us, s.prompt_len, s.output_len) for s in rs.specs] == [(0, 374, 44), (4_314_579, 396, 109)]


def test_default_profile_times_a_step():
    p = load_profile(None)
    assert p.measured is False
    idle = p.iteration_us(0, 0, 0, 0)
    assert idle == 6000
    assert p.iteration_us(1000, 0, 0, 0) > p.iteration_us(0, 0, 10, 10_000) > idle
    assert p.model.kv_bytes_per_token == 131072  # Llama-3-8B: 2 x 32 layers x 8 KV heads x 128 x 2 bytes


@needs_shared
def test_whole_azure_conv_trace_loads_with_its_published_statistics():
    rs = load_azure_csv(AZURE_CSV)
    specs = rs.specs
    assert len(specs) == 19_366
    mean_prompt = sum(s.prompt_len for s in specs) / len(specs)
    mean_output = sum(s.output_len for s in specs) / len(specs)
    assert 1100 < mean_prompt < 1200  # README: mean 1,155
    assert 200 < mean_output < 220  # README: mean 211
    assert max(s.prompt_len for s in specs) == 14_050
    assert max(s.output_len for s in specs) == 1000
    hours = specs[-1].arrival_us / 3.6e9
    assert 0.95 < hours < 1.0 and 5.0 < len(specs) / (hours * 3600) < 6.0  # one hour, ~5.5 req/s
