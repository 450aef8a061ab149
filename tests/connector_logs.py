"""The real vLLM 0.33 scheduler with a KV connector as an oracle for the engine: the driver's flags as `batchcheck
import vllm` arguments, and the comparison of a connector log (tests/vllm_connector_driver.py) with the engine,
step by step, as `batchcheck check-log POLICY LOG --arrivals TRACE --conformance` does.

Used by tests/conformance/test_connector_conformance.py (on the recorded logs of tests/data/vllm_connector/, so it
runs without the venv) and bench/vllm_connector_matrix.py (fresh logs of generated traces, with the venv).
"""

from __future__ import annotations

import json
from pathlib import Path

from checker.checklog import Conformance, conformance, load_arrivals, load_log
from checker.importers import import_policy
from checker.policy import Policy

ROLES = {"consumer": "kv_consumer", "producer": "kv_producer", "both": "kv_both"}
SAME = ("--block-size", "--max-num-seqs", "--max-num-batched-tokens", "--max-model-len", "--watermark",
        "--long-prefill-token-threshold")


def import_args(flags: list[str]) -> list[str]:
    """The driver's flags as `batchcheck import vllm` arguments (the same configuration)."""
    out, caching, i = [], False, 0
    failure = flags[flags.index("--kv-load-failure-policy") + 1] if "--kv-load-failure-policy" in flags else None
    while i < len(flags):
        flag = flags[i]
        value = flags[i + 1] if i + 1 < len(flags) else None
        if flag in SAME:
            out += [flag, value]
        elif flag == "--num-blocks":
            out += ["--num-gpu-blocks-override", value]
        elif flag == "--policy":
            out += ["--scheduling-policy", value]
        elif flag == "--kv-role":
            config = {"kv_connector": "FakeKVConnector", "kv_role": ROLES[value]}
            out += ["--kv-transfer-config", json.dumps(config if failure is None else
                                                       {**config, "kv_load_failure_policy": failure})]
        elif flag == "--enable-prefix-caching":
            caching = True
            i += 1
            continue
        elif flag == "--no-reserve-full-isl":
            out.append("--no-scheduler-reserve-full-isl")
            i += 1
            continue
        elif flag in ("--max-steps", "--external-query", "--kv-load-failure-policy"):
            pass  # the run's length; the connector's answer rule (the model's is until-load, the default)
        else:
            raise ValueError(f"no import argument for the driver flag {flag}")
        i += 2
    # the drivers step the synchronous Scheduler (async_scheduling=False)
    return out + ["--enable-prefix-caching" if caching else "--no-enable-prefix-caching", "--no-async-scheduling"]


def policy_for(flags: list[str], name: str, rows: list[dict] = ()) -> Policy:
    """The imported policy; with structured-output requests in the trace (grammar_steps), queue.blocked_waiting
    skip, what vLLM 0.33 does with them (no vLLM flag turns it on or off: the importer leaves it off)."""
    policy = import_policy("vllm", import_args(flags), name=name).policy
    if any(row.get("grammar_steps") for row in rows):
        policy = Policy.model_validate({**policy.model_dump(mode="json"),
                                        "queue": {**policy.queue.model_dump(mode="json"), "blocked_waiting": "skip"}})
    return policy


def compare(rows: list[dict], flags: list[str], log: Path, name: str, folder: Path) -> Conformance:
    """The engine under the imported policy against the log, on the trace rows (written to folder)."""
    trace = folder / f"{name}.trace.json"
    trace.write_text(json.dumps(rows))
    arrivals = load_arrivals(trace)
    return conformance(policy_for(flags, name, rows), arrivals, load_log(log, arrivals))


def assert_agrees(rows: list[dict], flags: list[str], log: Path, name: str, folder: Path) -> None:
    """Every step and every free-block count of the log agrees with the engine (compare)."""
    result = compare(rows, flags, log, name, folder)
    assert result.first_divergence is None, result.detail
    assert (result.agreeing, result.free_blocks_agreeing) == (result.steps, result.steps)
