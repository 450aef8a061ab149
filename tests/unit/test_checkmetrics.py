"""check-metrics on real Prometheus scrapes of the vLLM 0.33 scheduler (tests/data/vllm_metrics, made with
tests/vllm_metrics.py), their query_range form, SGLang's metric names, restarts, and bad input."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from checker.checklog import load_arrivals
from checker.checkmetrics import check_metrics, load_scrapes, parse_text
from checker.cli import main
from checker.engine import simulate
from checker.errors import InputError
from checker.inputfiles import apply_overrides, load_policy
from checker.profile import load_profile
from checker.traces import RequestSet
from tests.helpers import ROOT

DATA = ROOT / "tests" / "data" / "vllm_metrics"
HARNESS = ROOT.parent / "shared" / "tools" / "vllm-scheduler" / "drive_vllm_scheduler.py"
VENV = Path(os.environ.get("BATCHCHECK_VLLM_VENV", Path.home() / ".cache" / "vllm-scheduler" / "venv"))


def scrapes(tmp_path, name: str) -> Path:
    path = tmp_path / f"{name}.prom"
    path.write_bytes(gzip.decompress((DATA / f"{name}.prom.gz").read_bytes()))
    return path


def verdicts(result) -> dict[str, str]:
    return {f.check: f.verdict for f in result.findings}


def test_real_vllm_scrapes_under_their_own_policy_hold(tmp_path):
    result = check_metrics(load_policy(DATA / "pressure.yaml"), load_scrapes(scrapes(tmp_path, "pressure")))
    assert result.scrapes.count == 23 and result.scrapes.server == "vllm"
    assert verdicts(result) == {"seq_cap": "HOLDS", "kv_never_overcommitted": "HOLDS", "queue_bound": "VACUOUS",
                                "no_deadlock": "HOLDS", "prefix_caching_matches_policy": "HOLDS"}
    assert result.findings[0].detail == "on 23 scrapes (running requests at most 12, batch.max_num_seqs 12)"


def test_a_policy_with_fewer_sequences_or_no_cache_is_not_the_server(tmp_path):
    policy = apply_overrides(load_policy(DATA / "pressure.yaml"),
                             ["batch.max_num_seqs=8", "kv.prefix_caching.enabled=false"])
    result = check_metrics(policy, load_scrapes(scrapes(tmp_path, "pressure")))
    found = {f.check: f for f in result.findings}
    assert found["seq_cap"].verdict == "VIOLATED" and found["seq_cap"].detail.endswith("> batch.max_num_seqs 8")
    assert found["prefix_caching_matches_policy"].verdict == "VIOLATED"
    assert "the policy checked is not the scheduler that runs" in found["prefix_caching_matches_policy"].detail


def test_the_never_fitting_head_is_a_deadlock_in_the_scrapes_and_in_the_engine(tmp_path):
    policy = load_policy(DATA / "stuck.yaml")
    result = check_metrics(policy, load_scrapes(scrapes(tmp_path, "stuck")))
    stall = next(f for f in result.findings if f.check == "no_deadlock")
    assert stall.verdict == "VIOLATED" and stall.scrape == 0
    assert stall.detail == ("1 to 7 requests waiting and none running from scrape 1 to scrape 3 (3 scrapes in a "
                            "row), no token produced")
    # batchcheck's engine, on the trace that drove the real scheduler, gets stuck the same way
    arrivals = load_arrivals(DATA / "stuck.trace.json")
    run = simulate(policy, RequestSet(arrivals.specs, ["default"], ["default"], "stuck"), load_profile(None))
    assert run.stuck and len(run.stuck) == 7


def test_the_query_range_form_gives_the_same_findings(tmp_path):
    text = scrapes(tmp_path, "stuck")
    raw, _ = parse_text(text.read_text(), str(text))
    series: dict[tuple, list] = {}
    for k, scrape in enumerate(raw):
        for (name, engine), value in scrape.items():
            series.setdefault((name, engine), []).append([1000 + 5 * k, str(value)])
    answer = {"status": "success", "data": {"resultType": "matrix", "result": [
        {"metric": {"__name__": name, **dict(engine), "model_name": "m", "instance": "h:8000", "job": "vllm"},
         "values": values} for (name, engine), values in series.items()]}}
    path = tmp_path / "range.json"
    path.write_text(json.dumps(answer))
    policy = load_policy(DATA / "stuck.yaml")
    from_text = check_metrics(policy, load_scrapes(text))
    from_range = check_metrics(policy, load_scrapes(path))
    assert verdicts(from_range) == verdicts(from_text)
    stall = next(f for f in from_range.findings if f.check == "no_deadlock")
    assert "from scrape 1 (t=1000 s) to scrape 3 (t=1010 s)" in stall.detail


SGLANG = """\
# HELP sglang:num_running_reqs The number of running requests
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{{model_name="meta-llama/Llama-3.1-8B-Instruct"}} {running}
# HELP sglang:num_queue_reqs The number of requests in the waiting queue
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{{model_name="meta-llama/Llama-3.1-8B-Instruct"}} {waiting}
# HELP sglang:token_usage The token usage
# TYPE sglang:token_usage gauge
sglang:token_usage{{model_name="meta-llama/Llama-3.1-8B-Instruct"}} {usage}
# HELP sglang:generation_tokens_total Number of generation tokens processed.
# TYPE sglang:generation_tokens_total counter
sglang:generation_tokens_total{{model_name="meta-llama/Llama-3.1-8B-Instruct"}} {tokens}
"""


def test_sglang_names_and_a_restart(tmp_path):
    rows = [(162, 2826, 0.28, 7.5e6), (130, 10, 0.31, 7.6e6), (0, 4, 0.0, 10.0), (0, 4, 0.0, 10.0), (0, 4, 0.0, 10.0)]
    path = tmp_path / "sglang.prom"
    path.write_text("".join(SGLANG.format(running=r, waiting=w, usage=u, tokens=t) for r, w, u, t in rows))
    sc = load_scrapes(path)
    assert sc.server == "sglang" and sc.count == 5
    policy = load_policy(ROOT / "spec" / "policies" / "vllm_v1.yaml")  # 256 sequences
    found = {f.check: f for f in check_metrics(policy, sc).findings}
    assert found["seq_cap"].verdict == "HOLDS" and found["kv_never_overcommitted"].verdict == "HOLDS"
    assert found["no_deadlock"].verdict == "VIOLATED"  # after the restart (tokens 7.6e6 -> 10): 3 stalled scrapes
    assert found["no_deadlock"].scrape == 2
    found = {f.check: f for f in check_metrics(apply_overrides(policy, ["batch.max_num_seqs=128"]), sc).findings}
    assert found["seq_cap"].detail == "running requests 162 at scrape 1 > batch.max_num_seqs 128"


@pytest.mark.parametrize("text, message", [
    ("vllm:num_requests_running{engine=\"0\"} nope\n", "vllm:num_requests_running='nope' (expected a number)"),
    ("vllm:num_requests_running{engine=\"0\"} NaN\n", "(expected a finite number)"),
    ("vllm:num_requests_running{engine=0} 1\n", "labels="),
    ("just words here\n", "(expected a Prometheus sample"),
    ("other_metric 1\n", "(expected scrapes with vLLM"),
    ('{"data": {"resultType": "vector", "result": []}}', "data.resultType='vector' (expected matrix"),
    ("[" * 100_000 + "]" * 100_000, "(expected nesting at most 64 levels deep"),  # a RecursionError before
])
def test_bad_scrapes_are_located_errors(tmp_path, capsys, text, message):
    path = tmp_path / "bad.prom"
    path.write_text(text)
    with pytest.raises(InputError):
        load_scrapes(path)
    assert main(["check-metrics", str(DATA / "stuck.yaml"), str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"batchcheck: error: {path}") and message in err


def test_cli_exit_codes_and_json(tmp_path, capsys):
    path = scrapes(tmp_path, "stuck")
    assert main(["check-metrics", str(DATA / "stuck.yaml"), str(path)]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"{path}: 16 scrapes of vllm metrics, 1 engine(s); policy stuck"
    assert lines[4].startswith("VIOLATED   no_deadlock")
    assert main(["check-metrics", str(DATA / "stuck.yaml"), str(path), "--check", "seq_cap", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["findings"] == [{"check": "seq_cap", "verdict": "HOLDS", "engine": {"engine": "0"}, "scrape": None,
                                "detail": "on 16 scrapes (running requests at most 0, batch.max_num_seqs 8)"}]
    assert main(["check-metrics", str(DATA / "stuck.yaml"), str(path), "--check", "queue_bound"]) == 3


@pytest.mark.skipif(not (VENV / "bin" / "python").exists(), reason=f"the real-scheduler venv is not at {VENV} "
                    "(../shared/tools/vllm-scheduler/setup.sh; or set BATCHCHECK_VLLM_VENV)")
@pytest.mark.skipif(not HARNESS.exists(), reason=f"the real-scheduler harness is not at {HARNESS} (../shared/tools)")
def test_fresh_scrapes_of_the_real_scheduler_match_the_kept_ones(tmp_path):
    out = tmp_path / "stuck.prom"
    subprocess.run([str(VENV / "bin" / "python"), str(ROOT / "tests" / "vllm_metrics.py"), str(DATA / "stuck.trace.json"),
                    "--out", str(out), "--scrape-every", "10", "--num-blocks", "101", "--max-num-seqs", "8",
                    "--max-num-batched-tokens", "512", "--max-model-len", "4096", "--max-steps", "150"],
                   check=True, capture_output=True, env={**os.environ, "VLLM_TARGET_DEVICE": "cpu"}, timeout=600)
    policy = load_policy(DATA / "stuck.yaml")
    fresh = check_metrics(policy, load_scrapes(out))
    kept = check_metrics(policy, load_scrapes(scrapes(tmp_path, "stuck")))
    assert [(f.check, f.verdict, f.detail) for f in fresh.findings] == [(f.check, f.verdict, f.detail) for f in kept.findings]
