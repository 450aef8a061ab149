"""`simulate` exits 1 when the run ends stuck (a deadlock) or in a suspected livelock (issue: it exited 0)."""

from __future__ import annotations

import json

from checker.cli import main
from tests.helpers import POLICIES


def test_a_stuck_run_exits_1_and_a_finished_one_0(tmp_path, capsys):
    # 32 blocks of 16 tokens: a 600-token prompt never fits and vLLM never rejects it (it blocks the queue)
    trace = tmp_path / "t.json"
    trace.write_text(json.dumps({"format": "batchcheck-trace", "requests": [
        {"arrival_ms": 0, "prompt_tokens": 600, "output_tokens": 2},
        {"arrival_ms": 1, "prompt_tokens": 10, "output_tokens": 2}]}))
    assert main(["simulate", str(POLICIES / "broken" / "vllm_v1_small_pool.yaml"), "--trace", str(trace)]) == 1
    assert "STUCK: 2 requests never finished" in capsys.readouterr().out
    trace.write_text(json.dumps({"format": "batchcheck-trace", "requests": [
        {"arrival_ms": 0, "prompt_tokens": 60, "output_tokens": 2}]}))
    assert main(["simulate", str(POLICIES / "broken" / "vllm_v1_small_pool.yaml"), "--trace", str(trace)]) == 0
