"""Arrivals during a quiet decode stretch (checker.fastforward.arrivals_may_join, engine.join_arrivals) equal
plain stepping: requests arriving behind the head of a blocked strict queue join it (or are rejected) at the
step they are due, and the stretch goes on; one that would go ahead of the head ends the stretch."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import checker.engine as engine
from checker.policy import Policy
from checker.requests import RequestSpec, content_from_prefix_group
from checker.strategies import small_policies
from checker.traces import RequestSet
from tests.conformance.test_fastforward import _caching, _same, _same_with_pool


@st.composite
def blocked_queues(draw):
    """A strict queue in a static order behind a batch that fills a small pool, and requests arriving while
    it decodes (in bursts and alone, some with a higher priority than the head, some rejected by admission
    control), with and without prefix caching."""
    data = draw(small_policies()).model_dump(mode="json")
    order = draw(st.sampled_from(["fcfs", "priority", "shortest_prompt_first"]))
    data["queue"].update(order=order, head_of_line="strict", aging_interval_ms=None, vtc=None)
    if order != "priority":
        data["preemption"]["triggers"] = [t for t in data["preemption"]["triggers"] if t != "priority_inversion"]
    data["timeouts"]["queue_timeout_ms"] = None
    budget = data["batch"]["max_num_batched_tokens"]
    data["batch"]["max_num_seqs"] = draw(st.integers(1, min(16, budget)))  # room in the batch: KV blocks the head
    policy = Policy.model_validate(data)
    if draw(st.booleans()):
        policy = _caching(policy)
    specs, t = [], 0
    shaped = draw(st.booleans())  # a batch decoding, a long prompt blocked at the head, short prompts arriving
    for rid in range(draw(st.integers(2, 24))):
        t += draw(st.sampled_from([0, 0, 2_000, 20_000, 60_000]))
        output = draw(st.integers(1, 200))
        prompt = draw(st.integers(1, policy.max_model_len))
        if shaped and rid == 2:
            prompt = policy.max_model_len - 1
        elif shaped and rid > 2:
            prompt = draw(st.integers(1, 4))
        content = content_from_prefix_group(1, prompt) if draw(st.booleans()) else None
        specs.append(RequestSpec(rid=rid, arrival_us=t, prompt_len=prompt, output_len=output,
                                 max_output=output + draw(st.integers(0, 3)), priority=draw(st.integers(0, 3)),
                                 cancel_us=t + draw(st.integers(0, 300_000)) if draw(st.integers(0, 5)) == 0 else None,
                                 content=content))
    return policy, RequestSet(specs, ["c"], ["a"], "generated")


def _times(result):
    t = result.times
    return (t.first_scheduled, t.first_token, t.last_token, t.done, t.max_gap, t.tokens_scheduled, t.first_hit,
            t.hit_tokens)


def test_arrivals_join_stretches_as_plain_stepping_does(monkeypatch):
    joined = []
    join = engine.join_arrivals

    def counting(s, clock, now, durations):
        before = clock.ai
        rejected = join(s, clock, now, durations)
        joined.append((clock.ai - before, len(rejected)))
        return rejected

    monkeypatch.setattr(engine, "join_arrivals", counting)

    @settings(max_examples=500, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow])
    @given(case=blocked_queues())
    def run(case):
        policy, rs = case
        fast, plain = (_same_with_pool if policy.kv.prefix_caching.enabled else _same)(policy, rs)
        assert _times(fast) == _times(plain)  # every request's times (a rejected one's too)
        assert fast.steps == plain.steps

    run()
    assert sum(n for n, _ in joined) > 100, "the generated cases should let many arrivals join stretches"
    assert sum(r for _, r in joined) > 0, "and some of them should be rejected by admission control"
