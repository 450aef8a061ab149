"""The ci config: TOML key lines, validation, and the plan built from it (globs, filters, dedup)."""

from __future__ import annotations

import pytest

from checker.ci.config import load_config
from checker.ci.plan import FUZZ, LIVENESS, VERIFY, build_plan
from checker.ci.tomllines import toml_lines
from checker.errors import InputError
from tests.helpers import ROOT
from tests.unit.ci_sample import make_project


def test_toml_lines_place_tables_keys_and_array_items():
    text = ('policies = ["a", "b"]  # two\n'
            "[defaults]\n"
            "depth = 3\n"
            "[[verify]]\n"
            'invariants = ["x"]\n'
            "[[verify]]\n"
            "invariants = [\n"
            '  "y",  # first\n'
            '  "z",\n'
            "]\n"
            "gate.inconclusive = 'warning'\n")
    lines = toml_lines(text)
    assert lines[("policies",)] == 1 and lines[("policies", 1)] == 1
    assert lines[("defaults", "depth")] == 3
    assert lines[("verify", 0)] == 4 and lines[("verify", 0, "invariants", 0)] == 5
    assert lines[("verify", 1)] == 6
    assert lines[("verify", 1, "invariants", 0)] == 8 and lines[("verify", 1, "invariants", 1)] == 9
    assert lines[("verify", 1, "gate", "inconclusive")] == 11


def test_the_shipped_config_covers_every_shipped_policy():
    config, lines = load_config(ROOT / "batchcheck.toml")
    plan = build_plan(config, lines, str(ROOT / "batchcheck.toml"))
    shipped = {f"spec/policies/{p.name}" for p in (ROOT / "spec" / "policies").glob("*.yaml")}
    verified = {c.policy.shown for c in plan.checks if c.kind == VERIFY}
    assert verified == shipped
    safety = {"kv_never_overcommitted", "token_budget", "seq_cap", "request_conservation"}
    for policy in shipped:
        assert {c.rule for c in plan.checks if c.policy.shown == policy and c.level == "error"} >= safety
    assert any(c.kind == FUZZ for c in plan.checks)


def test_duplicate_checks_run_once_and_the_policy_filter_keeps_only_named_files(tmp_path):
    config = make_project(tmp_path, 'policies = ["spec/policies/*.yaml"]\n'
                                    '[[verify]]\ninvariants = ["seq_cap", "token_budget"]\n'
                                    '[[verify]]\npolicies = ["spec/policies/vllm_v1.yaml"]\n'
                                    'invariants = ["seq_cap", "token_budget"]\nlevel = "warning"\n'
                                    '[[verify]]\npolicies = ["spec/policies/vllm_v1.yaml"]\n'
                                    'invariants = ["kv_never_overcommitted", "kv_never_overcommitted:headroom=0"]\n'
                                    'level = "warning"\n')
    cfg, lines = load_config(config)
    plan = build_plan(cfg, lines, str(config))
    assert len(plan.checks) == 3 * 2 + 1
    assert [(c.label, c.level) for c in plan.checks if c.policy.shown == "spec/policies/vllm_v1.yaml"] == [
        ("seq_cap", "error"), ("token_budget", "error"), ("kv_never_overcommitted(headroom=0)", "warning")]
    only = build_plan(cfg, lines, str(config), [str(tmp_path / "spec" / "policies" / "tgi_router.yaml"),
                                                str(tmp_path / "spec" / "workloads" / "chat_mixed.yaml")])
    assert sorted(c.label for c in only.checks) == ["seq_cap", "token_budget"]
    assert {c.policy.shown for c in only.checks} == {"spec/policies/tgi_router.yaml"}
    assert only.not_configured == [str(tmp_path / "spec" / "workloads" / "chat_mixed.yaml")]


def test_a_fuzz_property_not_in_the_slo_file_is_located(tmp_path):
    config = make_project(tmp_path, 'policies = ["spec/policies/vllm_v1.yaml"]\n'
                                    '[[fuzz]]\nworkload = "spec/workloads/chat_mixed.yaml"\n'
                                    'properties = ["interactive_ttft_p99", "ttft_p42"]\n')
    cfg, lines = load_config(config)
    with pytest.raises(InputError) as err:
        build_plan(cfg, lines, str(config))
    assert str(err.value) == (
        f"{config}:4: fuzz[0].properties[1]='ttft_p42' (expected a property of spec/workloads/chat_mixed.slo.yaml: "
        "interactive_ttft_p99, interactive_max_tbt, interactive_tpot_p99, tenant_queue_fairness, "
        "background_degrades_first)")


def test_every_invariant_and_slo_kind_points_at_policy_fields_and_docs_list_them():
    from typing import get_args

    from checker.ci.locations import INVARIANT_FIELDS, LIVENESS_FIELDS, SLO_FIELDS
    from checker.fuzz.slo import SLOFile
    from checker.policy import Policy
    from invariants.catalogue import CATALOGUE

    assert set(INVARIANT_FIELDS) == set(CATALOGUE), "map every invariant to the policy fields it judges in " \
        "checker/ci/locations.py (and list it in docs/ci.md)"
    kinds = {m.model_fields["kind"].annotation.__args__[0]
             for m in get_args(get_args(SLOFile.model_fields["properties"].annotation)[0])[0].__args__}
    assert kinds <= {key.split(":")[0] for key in SLO_FIELDS}
    docs = (ROOT / "docs" / "ci.md").read_text()
    for name, fields in [*INVARIANT_FIELDS.items(), *SLO_FIELDS.items(), *LIVENESS_FIELDS.items()]:
        assert f"| `{name}` | " + ", ".join(f"`{f}`" for f in fields) + " |" in docs
        for path in fields:  # every field exists in the policy model
            section, _, key = path.partition(".")
            model = Policy.model_fields[section].annotation
            model = next(a for a in (get_args(model) or (model,)) if hasattr(a, "model_fields"))
            assert key in model.model_fields, path


@pytest.fixture
def catalogue():
    """Leave the invariant catalogue as it was (user invariants register into it)."""
    from invariants.catalogue import CATALOGUE

    saved = dict(CATALOGUE)
    yield CATALOGUE
    CATALOGUE.clear()
    CATALOGUE.update(saved)


def test_user_invariant_modules_load_once_and_run(tmp_path, catalogue):
    from checker.api import run_ci

    config = make_project(tmp_path, 'invariant_modules = ["my_invariants.py"]\n'
                                    '[[verify]]\npolicies = ["spec/policies/unchecked_growth.yaml"]\n'
                                    'invariants = ["ci_at_most_one_running"]\nrequests = 2\ndepth = 2\n')
    (tmp_path / "my_invariants.py").write_text('''
from invariants import invariant
from checker.semantics.state import Status


def ci_at_most_one_running(o, ctx, t):
    """At most one request runs at a time."""
    return sum(o.b2i(s["status"] == int(Status.RUNNING)) for s in ctx.frames[t].slots) <= 1


def two_arrived(o, ctx, t):
    return sum(o.b2i(s["status"] != int(Status.PENDING)) for s in ctx.frames[t].slots) >= 2


INVARIANTS = [invariant(ci_at_most_one_running, two_arrived)]
''')
    outcome = run_ci(config, jobs=1)  # in this process: the module is loaded by the plan and not again
    [finding] = outcome.findings
    assert (finding.check.label, finding.result.verdict, finding.field) == ("ci_at_most_one_running", "VIOLATED", "")
    assert finding.line == 1 + next(i for i, text in enumerate(
        (tmp_path / "spec" / "policies" / "unchecked_growth.yaml").read_text().splitlines()) if text.startswith("name:"))


def test_liveness_entries_default_as_the_liveness_command_and_share_one_exploration_per_instance(tmp_path):
    import typing

    from checker.ci.config import LivenessEntry, LivenessProperty
    from checker.ci.execute import units
    from checker.ci.results import INCONCLUSIVE, PASSED, Result
    from checker.liveness.explore import DEFAULT_MAX_STATES
    from checker.liveness.lasso import ALL_PROPERTIES

    assert typing.get_args(LivenessProperty) == ALL_PROPERTIES
    from checker.bugreport.rules import implicated_rules
    from checker.ci.locations import LIVENESS_FIELDS

    for name in ALL_PROPERTIES:  # CI annotates the rules the bug report quotes (one table)
        assert implicated_rules("liveness", name) == LIVENESS_FIELDS[name]
    entry = LivenessEntry()
    assert (entry.requests, entry.outputs, entry.tenants, entry.step_ms, entry.max_states, entry.timeout_s) == \
        (2, [1, 2], 1, 10.0, DEFAULT_MAX_STATES, 60.0)
    config = make_project(tmp_path, 'policies = ["spec/policies/vllm_v1.yaml", "spec/policies/tgi_router.yaml"]\n'
                                    '[defaults]\nlevel = "warning"\n'
                                    '[[liveness]]\n'
                                    '[[liveness]]\npolicies = ["spec/policies/vllm_v1.yaml"]\nrequests = 1\n'
                                    'properties = ["no_deadlock"]\nlevel = "error"\n'
                                    '[[liveness]]\npolicies = ["spec/policies/vllm_v1.yaml"]\n'
                                    'properties = ["no_deadlock", "no_livelock"]\n')
    cfg, lines = load_config(config)
    plan = build_plan(cfg, lines, str(config))
    assert all(c.kind == LIVENESS for c in plan.checks)
    assert [(c.policy_name, c.label, c.level) for c in plan.checks] == [
        ("vllm_v1", "eventually_served(requests=2)", "warning"), ("vllm_v1", "no_livelock(requests=2)", "warning"),
        ("vllm_v1", "no_deadlock(requests=2)", "warning"),
        ("tgi_router", "eventually_served(requests=2)", "warning"), ("tgi_router", "no_livelock(requests=2)", "warning"),
        ("tgi_router", "no_deadlock(requests=2)", "warning"),
        ("vllm_v1", "no_deadlock(requests=1)", "error")]  # the third entry repeats the first's checks: run once
    assert sorted(units(plan.checks)) == [[0, 1, 2], [3, 4, 5], [6]]
    liveness = Result("NO_COUNTEREXAMPLE", "", {}, 0.0, kind=LIVENESS)
    fuzz = Result("NO_COUNTEREXAMPLE", "", {}, 0.0, kind=FUZZ)
    assert (liveness.outcome, fuzz.outcome) == (INCONCLUSIVE, PASSED)  # a cut graph; a finished search budget
