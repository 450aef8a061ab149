"""The report's timeline, read from step decisions, agrees with the engine's own state at every step;
the PNG has one row per request, and a whole run's plot caps its rows and says so."""

from __future__ import annotations

from hypothesis import given, settings

from checker.bugreport.build import run_timeline
from checker.bugreport.plot import draw, render_png
from checker.bugreport.timeline import Event, Phase, build_timeline, shown_requests
from checker.engine import simulate
from checker.profile import load_profile
from checker.semantics.state import Status
from checker.strategies import small_scenarios
from checker.traces import RequestSet
from tests.helpers import drive

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _expected_phase(before: dict, after: dict, scheduled: int, prompt: int) -> Phase | None:
    """The phase a request's state says it was in during the step (before: its fields at the start)."""
    if scheduled:
        decoding = before["num_generated"] >= 1 and before["num_computed"] + 1 == prompt + before["num_generated"]
        return Phase.DECODE if decoding else Phase.PREFILL
    status = Status(after["status"])
    if status is Status.RUNNING:
        return Phase.STALLED
    if status in (Status.WAITING, Status.SWAPPED):
        return Phase.REQUEUED if after["num_preemptions"] else Phase.WAITING
    if status is Status.CANCELLED and after["blocks"]:
        return Phase.HELD
    return None


@settings(max_examples=150, deadline=None)
@given(sc=small_scenarios(max_requests=5))
def test_phases_and_events_match_the_engine_state_at_every_step(sc):
    fields = ("status", "num_computed", "num_generated", "blocks", "num_preemptions")
    decisions, states = [], []  # drive() yields the live state: snapshot it after each step
    for _, s, d in drive(sc):
        decisions.append(d)
        states.append([{f: int(getattr(r, f)) for f in fields} for r in s.requests])
    t = build_timeline(sc.policy, sc.specs, decisions, list(range(len(decisions) + 1)), title="t", x_label="i",
                       iteration_axis=True)
    assert [row.rid for row in t.rows] == [s.rid for s in sc.specs]
    initial = {"status": int(Status.PENDING), "num_computed": 0, "num_generated": 0, "blocks": 0, "num_preemptions": 0}
    for row, spec in zip(t.rows, sc.specs):
        phase_at = {k: seg.phase for seg in row.segments for k in range(seg.start, seg.end)}
        for k, d in enumerate(decisions):
            before = states[k - 1][spec.rid] if k else initial
            expected = _expected_phase(before, states[k][spec.rid], dict(d.scheduled).get(spec.rid, 0), spec.prompt_len)
            assert phase_at.get(k) is expected, (spec.rid, k, row.segments)
        marks = {(m.step, m.event) for m in row.marks}
        assert marks == ({(k, Event.PREEMPTED) for k, d in enumerate(decisions) if spec.rid in d.preempted}
                         | {(k, Event.FINISHED) for k, d in enumerate(decisions) if spec.rid in d.finished}
                         | {(k, Event.CANCELLED) for k, d in enumerate(decisions) if spec.rid in d.cancelled}
                         | {(k, Event.REJECTED) for k, d in enumerate(decisions) if spec.rid in dict(d.rejected)})
    assert t.kv_used == [d.kv_blocks_used for d in decisions]


def test_rows_are_spread_evenly_when_capped():
    from checker.bugreport.build import _ordinal

    assert [_ordinal(n) for n in (1, 2, 3, 4, 11, 12, 13, 21, 22, 485)] == [
        "1st", "2nd", "3rd", "4th", "11th", "12th", "13th", "21st", "22nd", "485th"]
    assert shown_requests(5, 40) == [0, 1, 2, 3, 4]
    assert shown_requests(323, 40) == list(range(0, 323, 9))
    assert len(shown_requests(19_366, 40)) <= 40


def _chat_run():
    from checker.api import load_policy
    from tests.helpers import POLICIES, WORKLOADS
    from checker.traces import load_requests

    requests = load_requests(workload=WORKLOADS / "chat_mixed.yaml")
    return simulate(load_policy(POLICIES / "vllm_v1.yaml"), requests, load_profile(None), record=True)


def test_a_whole_run_caps_its_rows_says_so_and_draws_a_readable_png():
    result = _chat_run()
    t = run_timeline(result)
    assert t.title == ("vllm_v1 on chat_mixed.yaml: 323 requests, 13,279 iterations, 122.6 s simulated\n"
                       "rows: every 9th request in arrival order (36 of 323 shown)")
    fig = draw(t)
    assert len(fig.axes[0].get_yticklabels()) == 36
    # requests, running/waiting (binned), tokens, KV, TTFT and queue delay by class
    assert [ax.get_ylabel() for ax in fig.axes][-2:] == ["TTFT (ms)\nby arrival", "queue delay (ms)\nby arrival"]
    assert len(fig.axes) == 6
    assert [(c.name, len(c.arrival)) for c in t.latency] == [("interactive", 281), ("background", 42)]
    assert t.rows[0].label == "req 0 interactive (342 in, 310 out, prio 0)"  # priorities differ in this workload
    png = render_png(t)
    assert png.startswith(PNG_SIGNATURE)
    width, height = int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")
    assert width == 1300 and 1200 < height < 2800
    assert 50_000 < len(png) < 2_000_000


def test_a_short_run_draws_one_row_per_request():
    from checker.api import load_policy
    from checker.requests import RequestSpec
    from tests.helpers import POLICIES

    specs = [RequestSpec(rid=i, arrival_us=i * 5000, prompt_len=300 + 100 * i, output_len=3, max_output=3)
             for i in range(3)]
    result = simulate(load_policy(POLICIES / "sarathi_serve.yaml"), RequestSet(specs, ["default"], ["default"], "x"),
                      load_profile(None), record=True)
    t = run_timeline(result)
    assert not t.rows_capped and [row.label for row in t.rows] == [
        "req 0 (300 in, 3 out)", "req 1 (400 in, 3 out)", "req 2 (500 in, 3 out)"]
    assert [label.get_text() for label in draw(t).axes[0].get_yticklabels()] == [row.label for row in t.rows]
