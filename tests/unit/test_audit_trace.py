"""audit --trace: the derived audit's classes and rates from a real trace (docs/audit.md, "Class rates from
a real trace")."""

from __future__ import annotations

import csv
import json
import math

import pytest

from checker.api import run_derived_audit
from checker.traces import TraceOptions
from tests.helpers import AZURE_CSV, POLICIES

VLLM = POLICIES / "vllm_v1.yaml"  # max_model_len 32768, FCFS (priorities ignored)


def _classes(result) -> list[dict]:
    return result.as_json()["derived"]["workload_record"]["classes"]


@pytest.mark.skipif(not AZURE_CSV.exists(), reason=f"needs the shared Azure trace at {AZURE_CSV} (absent here)")
def test_whole_azure_trace_rates_match_its_own_statistics():
    with AZURE_CSV.open() as f:
        rows = [(float(t), int(p), int(o)) for t, p, o in list(csv.reader(f))[1:]]
    assert len(rows) == 19_366  # ../shared/data/README.md
    span_us = round(rows[-1][0] * 1e6) - round(rows[0][0] * 1e6) + 1
    result = run_derived_audit(VLLM, trace=AZURE_CSV)
    (cls,) = _classes(result)
    assert cls["arrivals_per_min"] == math.ceil(19_366 * 60e6 / span_us) == 332  # 5.53 requests/s over 58.4 min
    assert cls["prompt_tokens"] == math.ceil(sum(p for _, p, _ in rows) / len(rows)) == 1_155
    assert cls["output_tokens"] == math.ceil(sum(o for *_, o in rows) / len(rows)) == 212  # mean 211.4
    assert (cls["max_prompt_tokens"], cls["tenant"], cls["priority"]) == (14_050, "default", 0)
    derived = result.as_json()["derived"]
    assert (derived["requests"], derived["trace_span_us"]) == (19_366, span_us)

    scaled = _classes(run_derived_audit(VLLM, trace=AZURE_CSV, trace_options=TraceOptions(rate_scale=2)))[0]
    assert abs(scaled["arrivals_per_min"] - 2 * 332) <= 1  # twice the load: half the span


def test_prompt_buckets_window_and_tenants_become_classes(tmp_path):
    doc = {"format": "batchcheck-trace", "requests": [
        {"arrival_ms": 0, "prompt_tokens": 100, "output_tokens": 10, "tenant": "a", "priority": 1},
        {"arrival_ms": 1000, "prompt_tokens": 300, "output_tokens": 30, "tenant": "a", "priority": 1},
        {"arrival_ms": 2000, "prompt_tokens": 5000, "output_tokens": 50, "tenant": "b", "priority": 2,
         "cancel_after_ms": 10},
        {"arrival_ms": 3000, "prompt_tokens": 200, "output_tokens": 20, "tenant": "b", "priority": 2},
        {"arrival_ms": 60000, "prompt_tokens": 200, "output_tokens": 20, "tenant": "b", "priority": 2}]}
    path = tmp_path / "t.json"
    path.write_text(json.dumps(doc))
    opt = TraceOptions(window_s=(0, 10), class_by_prompt=(1000,))  # the last request is outside the window
    classes = _classes(run_derived_audit(VLLM, trace=path, trace_options=opt))
    span_ms = 3000.001  # first to last arrival in the window, plus 1 us
    # prompt<1000 holds requests of two tenants: one audit class each, named CLASS:TENANT:pPRIORITY; the
    # record's priority is 0, as vllm_v1 serves FCFS (the workload form's rule)
    assert [(c["name"], c["tenant"], c["priority"], c["arrivals_per_min"], c["prompt_tokens"], c["output_tokens"],
             c["cancel_permille"]) for c in classes] == [
        ("prompt_1000:a:p1", "a", 0, math.ceil(2 * 60_000 / span_ms), 200, 20, 0),
        ("prompt_1000:b:p2", "b", 0, math.ceil(60_000 / span_ms), 200, 20, 0),
        ("prompt__1000", "b", 0, math.ceil(60_000 / span_ms), 5000, 50, 1000)]
