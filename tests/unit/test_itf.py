"""Counterexample files are ITF traces (Apalache ADR-015, the Informal Trace Format), so TLA+ trace tools and
the ITF trace viewer read them: every shipped counterexample and a fresh one of each kind (bounded
verification, an SLO search, a liveness lasso) is checked against the format's structure and value grammar."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from checker.cli import main
from tests.helpers import POLICIES, ROOT

SAFE = 2 ** 53 - 1  # larger integers are {"#bigint": "..."} in ITF


def itf_problems(doc: dict) -> list[str]:
    """What keeps a trace object from being ITF (empty when it is one)."""
    problems = []
    if not isinstance(doc.get("#meta", {}), dict):
        problems.append("#meta is not an object")
    if doc.get("#meta", {}).get("format") != "ITF":
        problems.append("#meta.format is not ITF")
    variables = doc.get("vars")
    if not (isinstance(variables, list) and all(isinstance(v, str) for v in variables)):
        return problems + ["vars is not a list of names"]
    if not isinstance(doc.get("params", []), list):
        problems.append("params is not a list")
    states = doc.get("states")
    if not isinstance(states, list) or not states:
        return problems + ["states is not a non-empty list"]
    for i, state in enumerate(states):
        keys = set(state) - {"#meta"}
        if keys != set(variables):
            problems.append(f"states[{i}] sets {sorted(keys)}, vars are {sorted(variables)}")
        problems += [p for k in keys for p in value_problems(state[k], f"states[{i}].{k}")]
    loop = doc.get("loop")
    if loop is not None and not (isinstance(loop, int) and 0 <= loop < len(states)):
        problems.append(f"loop={loop} is not a state index")
    return problems


def value_problems(value, where: str) -> list[str]:
    if isinstance(value, bool) or isinstance(value, str):
        return []
    if isinstance(value, int):
        return [] if abs(value) <= SAFE else [f"{where}: integer {value} beyond 2^53 (use #bigint)"]
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in value_problems(v, f"{where}[{i}]")]
    if isinstance(value, dict):
        if set(value) == {"#bigint"}:
            return [] if isinstance(value["#bigint"], str) else [f"{where}: #bigint is not a string"]
        if set(value) & {"#set", "#tup", "#map"}:
            return [p for v in value.values() for p in value_problems(v, where)]
        bad = [k for k in value if k.startswith("#")]
        return [f"{where}: record field {bad[0]!r} starts with #"] if bad else \
            [p for k, v in value.items() for p in value_problems(v, f"{where}.{k}")]
    return [f"{where}: {type(value).__name__} {value!r} is no ITF value (strings, integers, booleans, lists, "
            "records, #set, #tup, #map, #bigint)"]


SHIPPED = sorted((ROOT / "counterexamples").glob("*.json"))


@pytest.mark.parametrize("path", SHIPPED, ids=[p.name for p in SHIPPED])
def test_every_shipped_counterexample_is_an_itf_trace(path):
    assert itf_problems(json.loads(path.read_text())) == []


def test_the_validator_rejects_what_itf_does_not_allow():
    good = {"#meta": {"format": "ITF"}, "vars": ["x"], "states": [{"x": 1}]}
    assert itf_problems(good) == []
    assert itf_problems({**good, "states": [{"x": 1, "y": 2}]}) == ["states[0] sets ['x', 'y'], vars are ['x']"]
    assert itf_problems({**good, "states": [{"x": 0.5}]})[0].startswith("states[0].x: float 0.5 is no ITF value")
    assert itf_problems({**good, "states": [{"x": None}]})[0].startswith("states[0].x: NoneType None")
    assert itf_problems({**good, "states": [{"x": 2 ** 60}]}) == [f"states[0].x: integer {2 ** 60} beyond 2^53 "
                                                                 "(use #bigint)"]
    assert itf_problems({**good, "loop": 1}) == ["loop=1 is not a state index"]


def test_fresh_counterexamples_of_each_kind_are_itf_traces(tmp_path, capsys):
    out = tmp_path / "cex"
    assert main(["verify", str(POLICIES / "broken" / "unchecked_growth.yaml"), "--invariant",
                 "kv_never_overcommitted", "--requests", "2", "--depth", "2", "--out", str(out)]) == 1
    assert main(["fuzz", str(POLICIES / "vllm_v1.yaml"), "--workload", str(ROOT / "spec" / "workloads" / "chat_mixed.yaml"),
                 "--property", "interactive_tpot_p99", "--max-examples", "5", "--time-budget", "30", "--database",
                 "none", "--out", str(out)]) == 1
    assert main(["liveness", str(POLICIES / "strict_priority.yaml"), "--set", "batch.max_num_seqs=1",
                 "--out", str(out)]) == 1
    capsys.readouterr()
    files = sorted(Path(out).glob("*.json"))
    kinds = {json.loads(f.read_text())["property"]["kind"] for f in files}
    assert {"slo", "liveness"} <= kinds and len(kinds) == 3, kinds
    for f in files:
        doc = json.loads(f.read_text())
        assert itf_problems(doc) == [], f.name
        if doc["property"]["kind"] == "liveness":  # a lasso: the second turn is ITF's loop
            lasso = doc["lasso"]
            assert len(doc["states"]) == lasso["prefix_iterations"] + 2 * lasso["cycle_iterations"]
            assert doc["loop"] == lasso["prefix_iterations"] + lasso["cycle_iterations"]
