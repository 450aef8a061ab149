"""A planted blocked-waiting bug and its fix (tests/data/blocked/): a waiting scan that stops at a request whose
structured-output grammar is not ready (queue.blocked_waiting: stop) keeps plain requests waiting behind it; fuzz
with the blocked_grammars stress finds it within a fixed budget and shrinks it to 3 requests (the kept counterexample
counterexamples/vllm_v1_blocked_stop__chat_queue_max__e1e8142f.json replays VIOLATED); vLLM 0.33's rule (skip) shows
nothing in the same search, and the kept counterexample holds under it."""

from __future__ import annotations

from checker.api import run_fuzz, run_replay
from tests.helpers import ROOT

DATA = ROOT / "tests" / "data" / "blocked"
WORKLOAD, SLO = DATA / "structured_chat.yaml", DATA / "structured_chat.slo.yaml"
KEPT = ROOT / "counterexamples" / "vllm_v1_blocked_stop__chat_queue_max__e1e8142f.json"


def _fuzz(policy: str, examples: int, out):
    (result,) = run_fuzz(DATA / f"{policy}.yaml", WORKLOAD, SLO, ["chat_queue_max"], examples, time_budget_s=300,
                         seed=1, out_dir=out, database_dir=None, stresses=["blocked_grammars"])
    return result


def test_a_scan_that_stops_at_a_blocked_request_is_found_and_shrunk(tmp_path):
    result = _fuzz("vllm_v1_blocked_stop", 300, tmp_path)
    assert result.violated, result.line()
    assert len(result.trace) <= 3 and any(d.grammar_steps for d in result.trace), result.trace
    assert result.counterexample is not None and result.counterexample.exists()


def test_skipping_it_shows_nothing_and_fixes_the_kept_counterexample(tmp_path):
    result = _fuzz("vllm_v1_blocked_skip", 150, tmp_path)
    assert not result.violated and result.examples >= 150, result.line()
    assert run_replay(KEPT)[1]  # VIOLATED under its own policy (stop)
    text, violated = run_replay(KEPT, DATA / "vllm_v1_blocked_skip.yaml")
    assert not violated and "the policy no longer fails it" in text
