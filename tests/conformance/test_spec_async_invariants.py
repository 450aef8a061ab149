"""Issue 17's invariants (lookahead_fits, preemption_frees_capacity, bounded_preemptions_per_step) on the real vLLM
0.33 scheduler's kept speculative and async logs (tests/data/vllm_spec, tests/data/vllm_async): check-log's streaming
path gives the reference path's verdict (the reference reconstructs drafts, lookahead slots and the async rollback as
the streaming one does), the invariants hold on every log, and the real scheduler preempts at most one request per
step on these logs (bounded_preemptions_per_step:p=0 fails exactly on the logs with a preemption)."""

from __future__ import annotations

import json

import pytest

from checker import checklog as cl
from checker.inputfiles import load_policy
from checker.verify.run import parse_invariant
from tests.helpers import ROOT

LOGS = sorted((d.name, y.stem) for d in (ROOT / "tests" / "data" / "vllm_spec", ROOT / "tests" / "data" / "vllm_async")
              for y in d.glob("*.yaml"))
NEW = ["lookahead_fits", "preemption_frees_capacity", "bounded_preemptions_per_step", "bounded_preemptions_per_step:p=0"]
# beside them, the invariants whose frames the speculative and async rules change (drafts, rollback, lookahead blocks)
OLD = ["request_conservation", "prompt_fully_computed", "decode_progress", "kv_never_overcommitted", "seq_cap",
       "scheduled_requests_run"]


def _case(folder: str, name: str):
    d = ROOT / "tests" / "data" / folder
    arrivals = cl.load_arrivals(d / f"{name}.trace.json")
    lines = [json.loads(x) for x in (d / f"{name}.log.jsonl").read_text().splitlines()]
    return load_policy(d / f"{name}.yaml"), arrivals, cl.load_log(d / f"{name}.log.jsonl", arrivals), lines


@pytest.mark.parametrize("folder,name", LOGS, ids=[f"{f}/{n}" for f, n in LOGS])
def test_streaming_is_the_reference_and_the_new_invariants_hold(folder, name):
    policy, arrivals, steps, lines = _case(folder, name)
    for spec in NEW + ([] if "cache" in name else OLD):  # the caching logs fail request_conservation on both paths
        chosen = [parse_invariant(spec)]
        violation, _ = cl.check_log(policy, arrivals, steps, chosen)
        assert cl.check_stream(policy, arrivals, iter(steps), chosen).violation == violation, spec
        preempting = next((line["step"] for line in lines if line["preempted"]), None)
        if spec == "bounded_preemptions_per_step:p=0" and preempting is not None:
            assert violation is not None and violation.step == preempting, spec
        else:
            assert violation is None, (spec, violation)
