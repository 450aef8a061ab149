"""The markdown bug report: its key lines word for word, for an invariant counterexample (z3) and an
SLO counterexample (fuzz); the policy excerpt from the file, or from the embedded spec when the file is
gone or changed; writing is all or nothing."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from checker.bugreport.build import write_report, write_together
from checker.bugreport.rules import implicated_rules
from checker.errors import InputError
from invariants.catalogue import CATALOGUE
from tests.helpers import POLICIES, ROOT

DECODE_STALL = ROOT / "counterexamples" / "vllm_v0_no_chunking__decode_progress__ec9280ee.json"
LAZY_RELEASE = ROOT / "counterexamples" / "tgi_router__cancellation_releases__a607b70b.json"


@pytest.fixture(scope="module")
def decode_stall_report(tmp_path_factory) -> str:
    out = tmp_path_factory.mktemp("report")
    files = write_report(DECODE_STALL, out)
    assert files.still_violated and files.png.read_bytes().startswith(b"\x89PNG")
    return files.markdown.read_text()


def test_invariant_report_key_lines(decode_stall_report):
    lines = decode_stall_report.splitlines()
    assert lines[0] == "# vllm_v0_no_chunking violates decode_progress(gap=1)"
    for line in [
        "| verdict | **VIOLATED at iteration 1 (found by z3 bounded model checking; minimal: fewest requests, then "
        "fewest iterations)** |",
        "| replayed on the engine | decode_progress(gap=1) VIOLATED at iteration 1 (recorded: iteration 1) |",
        "**`decode_progress(gap=1)`** (invariant): A running request past its prefill produces a token at least every "
        "`gap` iterations, unless it is preempted, cancelled or finished.",
        "- 2 request slots, 4 iterations of 10 ms each; a slot arrives at any iteration (or never), slots in arrival order",
        "- clock: iteration k starts at k x 10 ms (the verifier's fixed clock)",
        "| 1 | 10 | 14 | 1 | 1 | 1 | 0 | - | - |",
        "- req 0 (1 in, 2 out): admitted, no tokens",
        "- req 1 (14 in, 1 out): prefill chunk (14 tokens), finished",
        "| 0 | 0 | 0 | 0 | 0:1 | - | - | - | 1/2500 | 1 | 0 | holds |",
        "| 1 | 10 | 1 | 1 | 1:14 | - | 1 | - | 1/2500 | 1 | 0 | **VIOLATED** |",
        "![timeline: one row per request, tokens and KV blocks per iteration]"
        "(vllm_v0_no_chunking__decode_progress__ec9280ee.png)",
        f"batchcheck replay {DECODE_STALL}",
    ]:
        assert line in lines, line
    excerpt = decode_stall_report.split("```text\n")[1].split("```")[0]
    assert excerpt == "15  batch:\n18    phase_mode: prefill_first\n"


def test_excerpt_comes_from_the_embedded_spec_when_the_file_is_gone_or_changed(tmp_path):
    doc = json.loads(LAZY_RELEASE.read_text())
    doc["policy"]["file"] = str(tmp_path / "gone.yaml")
    moved = tmp_path / "moved.json"
    moved.write_text(json.dumps(doc))
    text = write_report(moved, tmp_path / "a").markdown.read_text()
    assert (f"Rules that decide this property: `cancellation.release_lag_steps`. From the spec embedded in the "
            f"counterexample ({tmp_path / 'gone.yaml'} not found):") in text
    assert "```yaml\ncancellation:\n  release_lag_steps: 1\n```" in text

    changed = tmp_path / "gone.yaml"
    changed.write_text((POLICIES / "tgi_router.yaml").read_text().replace("release_lag_steps: 1", "release_lag_steps: 2"))
    text = write_report(moved, tmp_path / "b").markdown.read_text()
    assert f"({changed} has changed since the counterexample was found (its policy hash differs)):" in text
    assert "- req 0 (5 in, 2 out): cancelled, holding KV after cancel" in text.splitlines()


def test_every_invariant_names_rules_that_exist_in_the_policy_model():
    from checker.policy import Policy

    spec = Policy.model_validate({"max_model_len": 8, "kv": {"num_blocks": 4, "block_size": 1}}).model_dump()
    for name in CATALOGUE:
        for rule in implicated_rules("invariant", name):
            here = spec
            for part in rule.split("."):
                assert part in here, (name, rule)
                here = here[part]
    assert implicated_rules("slo", "x", {"kind": "latency", "metric": "max_tbt_ms"}) == (
        "batch.phase_mode", "chunking.long_prefill_token_threshold")
    assert implicated_rules("invariant", "my_own") == ("batch", "queue", "kv", "preemption")


@pytest.fixture(scope="module")
def slo_counterexample(tmp_path_factory) -> Path:
    """An SLO counterexample built the way `fuzz` builds one, on the trace the fuzzer shrinks to: two long
    prompts at once under prefill-first steps stall the first request's decode for a whole prefill."""
    from checker.api import load_policy
    from checker.engine import simulate
    from checker.fuzz import counterexample as fuzz_cex
    from checker.fuzz.slo import LatencyBound, evaluate
    from checker.profile import load_profile
    from checker.requests import RequestSpec
    from checker.traces import RequestSet
    from checker.verify.counterexample import save

    policy, profile = load_policy(POLICIES / "vllm_v0_no_chunking.yaml"), load_profile(None)
    specs = [RequestSpec(rid=i, arrival_us=0, prompt_len=p, output_len=4, max_output=1000) for i, p in
             enumerate((4006, 4203))]
    requests = RequestSet(specs, ["interactive"], ["app"], "fuzz")
    prop = LatencyBound(kind="latency", name="interactive_max_tbt", **{"class": "interactive"}, metric="max_tbt_ms",
                        stat="max", bound_ms=300)
    outcome = evaluate(prop, simulate(policy, requests, profile).summary())
    assert not outcome.holds
    search = {"seed": 0, "examples_run": 157, "stresses": ["plain"], "workload": "w.yaml", "slo": "w.slo.yaml"}
    doc = fuzz_cex.build(policy, "spec/policies/vllm_v0_no_chunking.yaml", profile, prop, outcome, requests, search)
    return save(doc, tmp_path_factory.mktemp("cex"))


def test_slo_report_key_lines(slo_counterexample, tmp_path):
    files = write_report(slo_counterexample, tmp_path)
    lines = files.markdown.read_text().splitlines()
    assert lines[0] == "# vllm_v0_no_chunking violates interactive_max_tbt"
    for line in [
        "| replayed on the engine | interactive_max_tbt VIOLATED: observed 300.001 > allowed 300.0 "
        "(interactive max_tbt_ms max) |",
        "**`interactive_max_tbt`** (SLO property, kind `latency`): A latency statistic of one class (or of all "
        "requests) stays within a bound.",
        "- recorded when found: observed 300.001 > allowed 300.0 (interactive max_tbt_ms max)",
        "- found by a Hypothesis search (seed 0, 157 examples run) on the workload `w.yaml` with the SLO file "
        "`w.slo.yaml`, then shrunk",
        "| 0 | 0 | 4006 | 4 | 1000 | 0 | app | interactive | - |",
        "| 0 | 0 | 0,1 | 0 | 0:4006 | - | - | - | 251/2500 | 1 | 1 |",
        "| 2-3 | 571.966-578.457 | - | - | 0:1 1:1 | - | - | - | 514/2500 | 2 | 0 |",
        "15  batch:",
        "    # chunking.long_prefill_token_threshold: 0  (not in the file: the default)",
    ]:
        assert line in lines, line


def test_a_failed_second_write_takes_the_first_back(tmp_path):
    first, second = tmp_path / "a.png", tmp_path / "a.md"
    second.mkdir()  # a directory where the markdown should go: its write fails
    with pytest.raises(InputError):
        write_together([(first, b"png"), (second, "md")], "--out")
    assert not first.exists()
    first.write_bytes(b"old")
    with pytest.raises(InputError):
        write_together([(first, b"new"), (second, "md")], "--out")
    assert first.read_bytes() == b"old"
    shutil.rmtree(second)


def test_the_example_in_the_docs_is_what_report_writes(tmp_path, monkeypatch):
    """docs/examples holds `batchcheck report counterexamples/vllm_v0_no_chunking__decode_progress__*.json
    --out docs/examples`, run from the repository root; regenerate it when the report changes."""
    monkeypatch.chdir(ROOT)
    files = write_report(DECODE_STALL.relative_to(ROOT), tmp_path)
    example = ROOT / "docs" / "examples" / files.markdown.name
    assert files.markdown.read_text() == example.read_text()
    assert (ROOT / "docs" / "examples" / files.png.name).read_bytes().startswith(b"\x89PNG")
    assert f"](examples/{files.markdown.name})" in (ROOT / "docs" / "report.md").read_text()
