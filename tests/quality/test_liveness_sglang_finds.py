"""The liveness explorer under SGLang's rules (scheduler: sglang) finds prefill-first decode starvation as a lasso, and
proves the instance free of it with mixed chunk or one running slot (docs/liveness.md, "SGLang's rules").

SGLang's normal loop runs a prefill batch whenever one forms and decodes only on steps where none does. On the shipped
SGLang policy (8 pages of 16 tokens, 2 running requests), a request whose prefill produced its first token waits for
its second, and a new one-token prompt arrives every iteration: each forms a prefill batch (and finishes in it), so the
running request never decodes and stays live forever. With --enable-mixed-chunk the running requests decode inside
each prefill batch; with one running slot (--max-running-requests 1) the batch is full and decode runs. Each case
explores a complete graph in a few seconds here; the test bounds each at 60 s. Every lasso is replayed on the engine
(prefix + two turns, whole keys with the SGLang state compared) and saved; the saved file replays to the same
violation.
"""

from __future__ import annotations

import time

import pytest

from checker.api import apply_overrides, load_policy
from checker.liveness.canon import FIELDS_PER_REQUEST, RUNNING
from checker.liveness.check import PROVED, VIOLATED, check_liveness
from checker.liveness.explore import LivenessEnv
from checker.verify.replay import replay_counterexample
from tests.helpers import POLICIES

SGLANG = POLICIES / "sglang" / "sglang_v05.yaml"
SMALL = ["kv.num_blocks=8", "batch.max_num_seqs=2"]  # prefill first, no mixed chunk (the shipped policy's)
PROPS = ["eventually_served", "no_livelock", "no_deadlock"]

FINDS = [  # overrides, env, the verdicts, the graph's states (measured; the exact count pins the key's reduction)
    (SMALL, LivenessEnv(2, (16,), (1, 2)), [VIOLATED], 3005, ["eventually_served"]),
    (SMALL, LivenessEnv(3, (16,), (1, 2)), [VIOLATED, PROVED, PROVED], 7813, PROPS),
    (SMALL + ["sglang.mixed_chunk=true"], LivenessEnv(3, (16,), (1, 2)), [PROVED] * 3, 6010, PROPS),
    (SMALL + ["batch.max_num_seqs=1"], LivenessEnv(2, (16,), (1, 2)), [PROVED] * 3, 4207, PROPS),
]
IDS = ["decode-starvation", "decode-starvation:3-in-flight", "fixed:mixed-chunk", "fixed:one-running-slot"]


def _policy(overrides):
    return apply_overrides(load_policy(SGLANG), overrides)


@pytest.mark.parametrize("overrides,env,verdicts,states,props", FINDS, ids=IDS)
def test_finds_and_fixes(overrides, env, verdicts, states, props, tmp_path):
    started = time.monotonic()
    report = check_liveness(_policy(overrides), str(SGLANG), env, props, out_dir=tmp_path, overrides=overrides)
    assert time.monotonic() - started < 60
    assert report.graph.complete and report.graph.states == states
    assert [r.verdict for r in report.results] == verdicts
    for r in report.results:
        if r.verdict == VIOLATED:  # the saved lasso replays to the same violation
            replayed = replay_counterexample(r.counterexample)
            assert replayed.violation == replayed.recorded_violation


def test_the_starved_request_is_running_and_waits_for_its_decode_while_every_turn_prefills_a_newcomer():
    report = check_liveness(_policy(SMALL), None, LivenessEnv(2, (16,), (1, 2)), ["eventually_served"])
    result = report.results[0]
    sg = report.graph
    cycle = result.lasso.cycle
    for i, (u, choice) in enumerate(cycle):
        key = sg.keys[u]
        oldest = key[1:1 + FIELDS_PER_REQUEST]
        # the oldest live request: running, its prompt computed, one output token of two, never decoded
        assert oldest[1] == RUNNING and oldest[2] == 16 and oldest[3] == 1
        assert choice[0]  # a newcomer arrives every turn
        v = cycle[(i + 1) % len(cycle)][0]
        label = next(lab for lab in sg.graph[u][v]["labels"] if lab.choice == choice)
        assert label.tokens == 16 and label.finished  # the newcomer's prefill, which finishes it
