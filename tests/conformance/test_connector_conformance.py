"""The engine under a KV connector policy agrees with the real vLLM 0.33 scheduler step by step: every fact case of
tests/vllm_connector_harness.py (loads, holders, reservations, aborts in every state, hung loads, pinned sends),
compared on its recorded real log (tests/data/vllm_connector/, so no venv is needed) under the policy `batchcheck
import vllm` makes from the driver's flags."""

from __future__ import annotations

import pytest

from tests.connector_logs import assert_agrees, compare
from tests.vllm_connector_harness import FACT_CASES, FIXTURES

# The connector answers only a request's first query (--external-query first): the model's connector asks until a
# load starts, as NixlConnector does (docs/connector-harness.md); the two differ once a load is refused.
OTHER_CONNECTOR_RULE = {name for name, (_, flags) in FACT_CASES.items() if "first" in flags}
CASES = sorted(name for name in FACT_CASES if name not in OTHER_CONNECTOR_RULE)


@pytest.mark.parametrize("name", CASES)
def test_every_step_and_free_block_count_agrees_with_the_real_scheduler(name, tmp_path):
    rows, flags = FACT_CASES[name]
    assert_agrees(rows, flags, FIXTURES / f"{name}.log.jsonl", name, tmp_path)


def test_the_other_connector_rule_diverges_where_the_refused_load_is_asked_again(tmp_path):
    """The one case the model's connector is not (a connector that answers once): the divergence is found, at the
    step the refused load would be asked again."""
    assert OTHER_CONNECTOR_RULE == {"reserved_first_query"}
    rows, flags = FACT_CASES["reserved_first_query"]
    result = compare(rows, flags, FIXTURES / "reserved_first_query.log.jsonl", "reserved_first_query", tmp_path)
    assert result.first_divergence == 2
