"""Shared test drivers: step a small scenario with a fixed clock, capturing each step."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from checker.engine import _Clock
from checker.semantics.decision import StepDecision
from checker.semantics.state import TERMINAL, SchedulerState
from checker.semantics.step import step
from checker.smt.conformance import Captured, capture
from checker.strategies import Scenario

ROOT = Path(__file__).resolve().parent.parent
POLICIES = ROOT / "spec" / "policies"
WORKLOADS = ROOT / "spec" / "workloads"
SHARED_DATA = ROOT.parent / "shared" / "data"
AZURE_CSV = SHARED_DATA / "traces" / "azure_conv_2023.csv"


def drive(sc: Scenario, max_steps: int = 40) -> Iterator[tuple[Captured, SchedulerState, StepDecision]]:
    """Step the scenario one iteration per step_us; yield (inputs, state after, decision)."""
    s = SchedulerState(sc.policy, sc.specs, num_tenants=sc.num_tenants)
    clock = _Clock(s.requests)
    for k in range(max_steps):
        now = k * sc.step_us
        arrived, cancelled = clock.due(now)
        before = capture(s, cancelled, now)
        d = step(s, arrived, cancelled, now)
        yield before, s, d
        if all(r.status in TERMINAL for r in s.requests) and not s.holding:
            return


def fixed_policy(path: Path, field: str, folder: Path) -> Path:
    """A broken policy (spec/policies/broken/) with its planted ``field: false`` knob back at vLLM's
    behaviour (true), written to ``folder`` under a name of its own."""
    out = folder / f"fixed_{path.name}"
    text = path.read_text().replace(f"{field}: false", f"{field}: true")
    out.write_text(text.replace("name: vllm_v1_cache_", "name: fixed_vllm_v1_cache_"))
    return out


def assert_section_off_builds_the_same_queries(section: str, off: dict, words: tuple[str, ...], settings) -> None:
    """Off means unchanged: with a policy section written out at its off value, the z3 step is the same terms, term
    for term, with the same comparison names, as a policy without it; no name contains any of ``words``."""
    from hypothesis import given

    from checker.policy import Policy
    from checker.smt.conformance import Z3Step
    from checker.strategies import small_scenarios

    @settings
    @given(sc=small_scenarios(max_requests=2))
    def one(sc):
        explicit = Policy.model_validate({**sc.policy.model_dump(mode="json"), section: off})
        a, b = Z3Step(sc.policy, len(sc.specs), 2), Z3Step(explicit, len(sc.specs), 2)
        assert a.names == b.names
        assert len(a.terms) == len(b.terms)  # z3 terms are hash-consed: eq() is structural equality, at once
        assert all(x.eq(y) if hasattr(x, "eq") else x == y for x, y in zip(a.terms, b.terms))
        assert not any(word in name for name in a.names for word in words)

    one()


def compare_steps(sc: Scenario, evaluate, max_steps: int, note=None) -> int:
    """Step the scenario on the engine; on every step the encoding (``evaluate``: captured inputs -> outputs) must
    give the engine's outputs (``note(sc, before, after, decision)`` sees each step). Returns the steps compared."""
    from checker.smt.conformance import differences, outputs_of_engine

    steps = 0
    for before, after, d in drive(sc, max_steps=max_steps):
        diff = differences(outputs_of_engine(after, d), evaluate(before))
        assert not diff, f"step {steps}: " + "; ".join(diff[:8])
        if note is not None:
            note(sc, before, after, d)
        steps += 1
    return steps


def assert_z3_steps_match(scenarios, compare, settings, max_steps: int, least: int) -> None:
    """Z3 evaluation of the step on generated scenarios (``compare(sc, evaluate, max_steps)`` with a Z3Step's
    evaluate): at least ``least`` steps compared in all."""
    from hypothesis import given

    from checker.smt.conformance import Z3Step

    checked: list[int] = []

    @settings
    @given(sc=scenarios)
    def one_scenario(sc):
        checked.append(compare(sc, Z3Step(sc.policy, len(sc.specs), sc.num_tenants).evaluate, max_steps))

    one_scenario()
    assert sum(checked) >= least, f"only {sum(checked)} steps checked against z3"
