"""A stateful Hypothesis test of the engine: environment events (arrive, cancel, step) as rules, and the
invariant catalogue checked after every iteration.

Use it in a test module::

    from checker.fuzz.stateful import machine_for
    TestVllm = machine_for(load_policy("spec/policies/vllm_v1.yaml")).TestCase
"""

from __future__ import annotations

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from checker.frames import TraceContext, frame_from_engine, params_from_engine
from checker.policy import Policy
from checker.semantics.state import TERMINAL, SchedulerState
from checker.requests import RequestSpec
from checker.semantics.step import step
from checker.smt.ops import IntOps
from invariants import CATALOGUE

STEP_US = 10_000
MAX_REQUESTS = 12
ALWAYS = ("request_conservation", "token_budget", "seq_cap")


def machine_for(policy: Policy, invariants: tuple[str, ...] = ALWAYS) -> type[RuleBasedStateMachine]:
    checked = list(invariants) + (["kv_never_overcommitted"] if policy.kv.check_allocation else [])
    max_prompt = policy.max_model_len + 8  # a few too long, to exercise rejection

    class EngineMachine(RuleBasedStateMachine):
        def __init__(self):
            super().__init__()
            self.specs: list[RequestSpec] = []
            self.state = SchedulerState(policy, [], num_tenants=2)
            self.pending_arrivals: list = []
            self.pending_cancels: list = []
            self.frames = []
            self.now = 0
            self.iterations = 0

        @precondition(lambda self: len(self.specs) < MAX_REQUESTS)
        @rule(prompt=st.integers(1, max_prompt), output=st.integers(1, 64), priority=st.integers(0, 2),
              tenant=st.integers(0, 1))
        def arrive(self, prompt, output, priority, tenant):
            spec = RequestSpec(len(self.specs), self.now, prompt, output, output, priority, tenant)
            self.specs.append(spec)
            self.state = _extend(self.state, spec)
            self.pending_arrivals.append(self.state.requests[-1])

        @precondition(lambda self: any(r.status not in TERMINAL for r in self.state.requests))
        @rule(data=st.data())
        def cancel(self, data):
            live = [r for r in self.state.requests if r.status not in TERMINAL and r not in self.pending_arrivals]
            if live:
                self.pending_cancels.append(data.draw(st.sampled_from(live)))

        @rule()
        def iterate(self):
            d = step(self.state, self.pending_arrivals, self.pending_cancels, self.now)
            self.pending_arrivals, self.pending_cancels = [], []
            self.frames = [frame_from_engine(self.state, d)]  # state invariants read the latest frame only
            self.now += STEP_US
            self.iterations += 1

        @invariant()
        def catalogue_holds(self):
            if not self.frames or len(self.frames[-1].slots) != len(self.state.requests):
                return  # checked after each iteration (arrivals since then are not in the frame yet)
            ctx = TraceContext(policy, params_from_engine(self.state), self.frames)
            for name in checked:
                assert CATALOGUE[name].holds(IntOps, ctx, 0), f"{name} broken at iteration {self.iterations - 1}"

    EngineMachine.__name__ = f"EngineMachine_{policy.name}"
    return EngineMachine


def _extend(s: SchedulerState, spec: RequestSpec) -> SchedulerState:
    """Add a request to a running engine state (requests may arrive while it runs)."""
    from checker.semantics.state import Request

    s.requests.append(Request(spec))
    if spec.tenant >= len(s.tenant_counters):
        s.tenant_counters.extend([0] * (spec.tenant + 1 - len(s.tenant_counters)))
    return s
