"""Real traces: Mooncake JSONL, time windows, load scaling, class rules; the whole Azure trace by class."""

from __future__ import annotations

import csv
import json

import pytest

from checker.api import run_simulation
from checker.cli import main
from checker.requests import shared_prefix_tokens
from checker.traces import TraceOptions, load_requests
from tests.helpers import AZURE_CSV, POLICIES

needs_shared = pytest.mark.skipif(not AZURE_CSV.exists(), reason=f"needs the shared data folder ({AZURE_CSV})")


def mooncake(tmp_path, rows):
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_mooncake_jsonl(tmp_path):
    path = mooncake(tmp_path, [
        {"timestamp": 1000, "input_length": 600, "output_length": 20, "hash_ids": [1, 2], "service": "chat"},
        {"timestamp": 1500, "input_length": 9000, "output_length": 5, "hash_ids": [1, *range(3, 20)],
         "service": "doc"}])
    rs = load_requests(trace=path, options=TraceOptions(class_column="service"))
    assert [(s.arrival_us, s.prompt_len, s.output_len) for s in rs.specs] == [(0, 600, 20), (500_000, 9000, 5)]
    assert [rs.class_names[s.cls] for s in rs.specs] == ["chat", "doc"]
    # hash_ids are kept: the two prompts share their first 512-token block, and nothing after it
    assert shared_prefix_tokens(rs.specs[0].content, rs.specs[1].content) == 512


def test_mooncake_hash_ids_must_cover_the_prompt(tmp_path, capsys):
    path = mooncake(tmp_path, [{"timestamp": 0, "input_length": 1025, "output_length": 2, "hash_ids": [4, 5]}])
    assert main(["simulate", str(POLICIES / "vllm_v1.yaml"), "--trace", str(path)]) == 2
    assert capsys.readouterr().err == (f"batchcheck: error: {path}:1: hash_ids='2 ids' (expected 3 ids: ceil(prompt "
                                       "1025 / hash_block_tokens 512), so that the ids cover the prompt)\n")


def test_mooncake_bad_line(tmp_path, capsys):
    path = mooncake(tmp_path, [{"timestamp": 0, "input_length": 10, "output_length": 2}, {"timestamp": 5, "input_length": 3}])
    code = main(["simulate", str(POLICIES / "vllm_v1.yaml"), "--trace", str(path)])
    assert code == 2
    assert capsys.readouterr().err == (f"batchcheck: error: {path}:2: output_length=<missing> "
                                       "(expected timestamp (ms), input_length and output_length)\n")


def test_window_scale_and_prompt_buckets(tmp_path):
    rows = [{"timestamp": 1000 * i, "input_length": 100 * (i + 1), "output_length": 4} for i in range(10)]
    rs = load_requests(trace=mooncake(tmp_path, rows),
                       options=TraceOptions(window_s=(2, 6), rate_scale=2, class_by_prompt=(400, 600)))
    assert [s.arrival_us for s in rs.specs] == [2_000_000, 2_500_000, 3_000_000, 3_500_000]
    assert rs.class_names == ["prompt<400", "400<=prompt<600", "prompt>=600"]
    assert [s.cls for s in rs.specs] == [0, 1, 1, 2]
    assert [s.rid for s in rs.specs] == [0, 1, 2, 3]


def test_bad_options_are_input_errors(tmp_path, capsys):
    path = mooncake(tmp_path, [{"timestamp": 0, "input_length": 10, "output_length": 2}])
    code = main(["simulate", str(POLICIES / "vllm_v1.yaml"), "--trace", str(path), "--class-by-prompt", "600,400"])
    assert code == 2
    assert capsys.readouterr().err == ("batchcheck: error: --class-by-prompt='600,400' (expected increasing token "
                                       "bounds >= 1, e.g. 512,4096)\n")


@needs_shared
def test_whole_azure_trace_replays_with_the_trace_s_own_per_class_statistics():
    bounds = (512, 4096)
    expected = {name: [0, 0, 0] for name in ("prompt<512", "512<=prompt<4096", "prompt>=4096")}
    with open(AZURE_CSV) as handle:
        for row in csv.DictReader(handle):
            prompt, output = int(row["num_prefill_tokens"]), int(row["num_decode_tokens"])
            name = "prompt<512" if prompt < 512 else "512<=prompt<4096" if prompt < 4096 else "prompt>=4096"
            expected[name][0] += 1
            expected[name][1] += prompt
            expected[name][2] += output
    result = run_simulation(POLICIES / "vllm_v1.yaml", trace=AZURE_CSV, options=TraceOptions(class_by_prompt=bounds))
    by_class = result.summary()["by_class"]
    got = {name: [g["requests"], g["prompt_tokens"], g["output_tokens"]] for name, g in by_class.items()}
    assert got == expected
    assert sum(g["finished"] for g in by_class.values()) == 19_366
