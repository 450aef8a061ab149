"""fuzz --seed-trace: a real trace cut into its busiest windows, mapped onto the workload's classes,
run first as explicit examples; a failing seed is shrunk."""

from __future__ import annotations

import json

import pytest

from checker.api import load_policy, trace_requests
from checker.engine import simulate
from checker.errors import InputError
from checker.fuzz.run import run_property
from checker.fuzz.seeds import seed_corpus, shrink
from checker.fuzz.slo import evaluate
from checker.fuzz.strategies import Draw, ranges, to_requests
from checker.loading import load_model
from checker.profile import load_profile
from checker.traces import TraceOptions
from checker.workload import Workload
from tests.helpers import AZURE_CSV, POLICIES, WORKLOADS

CHAT = WORKLOADS / "chat_mixed.yaml"  # interactive: prompt 16..6000, output 4..1000; background: 2000..8000, 100..600


def _csv(tmp_path, rows) -> str:
    path = tmp_path / "t.csv"
    path.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n" + "".join(f"{t},{p},{o}\n" for t, p, o in rows))
    return str(path)


def test_windows_busiest_first_mapped_by_prompt_length_and_clamped(tmp_path):
    # 3 windows of 2: a slow one, a busy one (two requests 10 ms apart), a medium one
    trace = _csv(tmp_path, [(0, 100, 50), (5, 100, 50), (10, 3000, 2000), (10.01, 9000, 200),
                            (20, 10, 2), (20.5, 500, 100)])
    wl = load_model(Workload, CHAT)
    corpus = seed_corpus(trace_requests(trace), wl, 2, 10, trace)
    assert corpus.total_windows == 3 and corpus.requests == 6
    busiest, medium, slow = corpus.windows
    # 3000 tokens fall in both ranges: the first listed (interactive); 9000 is nearest background's 8000
    assert busiest == [Draw(0, 0, 3000, 1000, None), Draw(10, 1, 8000, 200, None)]
    assert medium == [Draw(0, 0, 16, 4, None), Draw(500, 0, 500, 100, None)]
    assert slow == [Draw(0, 0, 100, 50, None), Draw(5000, 0, 100, 50, None)]
    assert corpus.clamped == 3 and corpus.mapping == {"default": "by prompt length"}
    assert corpus.notes(trace)[2] == ("seed lengths: 3 of 6 seed requests had a prompt or output outside their "
                                      "workload class's range and were clamped into it")
    assert len(seed_corpus(trace_requests(trace), wl, 2, 1, trace).windows) == 1


def test_rate_scale_and_window_apply_before_cutting(tmp_path):
    trace = _csv(tmp_path, [(0, 100, 50), (1, 100, 50), (2, 100, 50), (3, 100, 50)])
    wl = load_model(Workload, CHAT)
    rs = trace_requests(trace, TraceOptions(window_s=(1, 3), rate_scale=2))
    (window,) = seed_corpus(rs, wl, 20, 5, trace).windows
    assert [d.gap_ms for d in window] == [0, 500]


def test_class_names_map_by_name_and_unknown_names_are_refused(tmp_path):
    wl = load_model(Workload, CHAT)
    doc = {"format": "batchcheck-trace", "requests": [
        {"arrival_ms": 0, "prompt_tokens": 3000, "output_tokens": 100, "class": "background"},
        {"arrival_ms": 5, "prompt_tokens": 100, "output_tokens": 10, "class": "interactive", "cancel_after_ms": 40}]}
    path = tmp_path / "t.json"
    path.write_text(json.dumps(doc))
    (window,) = seed_corpus(trace_requests(path), wl, 20, 5, str(path)).windows
    assert window == [Draw(0, 1, 3000, 100, None), Draw(5, 0, 100, 10, 40)]
    doc["requests"][0]["class"] = "vip"
    path.write_text(json.dumps(doc))
    with pytest.raises(InputError) as err:
        seed_corpus(trace_requests(path), wl, 20, 5, str(path))
    assert err.value.render() == (f"{path}: class='vip' (expected a class of the workload (interactive, background), "
                                  "or a trace without class names, whose requests map by prompt length)")


def test_shrink_removes_requests_and_lowers_fields_to_the_floors():
    wl = load_model(Workload, CHAT)
    r = ranges(wl)
    trace = [Draw(30, 0, 200, 50), Draw(7, 1, 5000, 300, 90), Draw(12, 0, 4000, 900), Draw(3, 0, 100, 20)]

    def fails(t):  # fails while some request has a prompt of at least 1500 tokens
        worst = max(d.prompt for d in t)
        return worst >= 1500, worst
    smaller, verdict, calls = shrink(trace, fails, r)
    assert smaller in ([Draw(0, 0, 1500, 4)], [Draw(0, 1, 2000, 100)])
    assert fails(smaller)[0] and verdict == max(d.prompt for d in smaller) and 0 < calls < 200


@pytest.mark.skipif(not AZURE_CSV.exists(), reason=f"needs the shared Azure trace at {AZURE_CSV} (absent here)")
def test_azure_seed_window_failure_found_at_example_1_and_shrunk():
    policy, profile = load_policy(POLICIES / "vllm_v1.yaml"), load_profile(None)
    wl = load_model(Workload, CHAT)
    from checker.api import load_slo

    _, _, (prop,) = load_slo(CHAT, None, ["interactive_tpot_p99"])
    corpus = seed_corpus(trace_requests(AZURE_CSV), wl, 20, 20, str(AZURE_CSV))
    assert corpus.total_windows == 969 and len(corpus.windows) == 20  # 19,366 requests / 20
    busiest = corpus.windows[0]
    assert not evaluate(prop, simulate(policy, to_requests(busiest, wl), profile).summary()).holds  # the planted failure

    result = run_property(policy, wl, profile, prop, 5, 60, 0, None, 20, corpus=corpus)
    assert result.violated and result.seed_found == 1 and result.examples == 1 and result.seeds_run == 1
    assert len(result.trace) < len(busiest)
    assert not evaluate(prop, simulate(policy, to_requests(result.trace, wl), profile).summary()).holds
