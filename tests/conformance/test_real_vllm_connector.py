"""The engine against fresh logs of the real vLLM 0.33 scheduler with a KV connector (tests/vllm_connector_driver.py),
on generated traces with KV pressure, preemptions, aborts during loads, lost loads and pinned sends: every step and
every free-block count agrees. Needs the vLLM venv (BATCHCHECK_VLLM_VENV, default ~/.cache/vllm-scheduler/venv);
skipped without it (the recorded fact logs are compared in test_connector_conformance.py either way). The full
matrix is bench/vllm_connector_matrix.py (docs/check-log.md)."""

from __future__ import annotations

import pytest

from tests.connector_logs import compare
from tests.vllm_connector_harness import absent_reason, flags, loads_with_latencies, pressure_with_loads, run_jobs

pytestmark = pytest.mark.skipif(absent_reason() is not None, reason=absent_reason() or "")


def _jobs() -> dict:
    rows, _ = pressure_with_loads(n=60, num_blocks=60, seed=11)
    # a third of the loads aborted a step after they arrive (their load 4 steps long, or lost), other aborts anywhere
    aborts = [{**r, "abort_step": r["arrival_step"] + 1, "load_steps": None if i % 2 else 4}
              if "external_tokens" in r and i % 3 == 0 else
              {**r, **({"abort_step": r["arrival_step"] + i % 5} if i % 4 == 0 else {})} for i, r in enumerate(rows)]
    sends = [{**r, "send_steps": [0, 2, None][i % 3]} for i, r in enumerate(rows)]
    return {"latencies": loads_with_latencies(n=40, seed=5),
            "pressure": pressure_with_loads(n=60, num_blocks=60, seed=12),
            "aborts_and_lost_loads": (aborts, flags(num_blocks=60, max_num_seqs=6, max_num_batched_tokens=192)),
            "both_roles": (sends, flags("--max-steps", "600", num_blocks=160, max_num_seqs=6,
                                        max_num_batched_tokens=192, role="both"))}


def test_fresh_connector_logs_agree_with_the_engine_on_every_step(tmp_path):
    jobs = _jobs()
    logs = run_jobs(jobs, keep=tmp_path)
    assert any(line["preempted"] for line in logs["pressure"])  # the cases reach the pool's limits
    assert any(line.get("pinned_load") for line in logs["aborts_and_lost_loads"])
    assert any(line.get("pinned") for line in logs["both_roles"])
    for name, (rows, fl) in jobs.items():
        result = compare(rows, fl, tmp_path / f"{name}.log.jsonl", name, tmp_path)
        assert result.first_divergence is None, f"{name}: {result.detail}"
        assert result.free_blocks_agreeing == result.steps, name
