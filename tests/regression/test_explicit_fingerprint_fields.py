"""The explicit-state search's fingerprint (checker/verify/explicit.py) reads the scheduler state's fields by name
(fast_fingerprint) and falls back to a generic one when the semantics gains a field it does not name. Twice a new
state section (async scheduling's, then the blocked waiting states') silently sent every search to the generic
fingerprint, which raised on a value it could not freeze (a frozenset): every VIOLATED find of the cache and SGLang
searches became an internal error. Every state shape a policy can make must take the fast path, and the generic
one must still freeze every value the state holds."""

from __future__ import annotations

import pytest

from checker.inputfiles import apply_overrides, load_policy
from checker.semantics.state import SchedulerState
from checker.verify.explicit import _FAST, _FAST_STATE, _STATE_SKIP, _freeze, fast_fingerprint
from tests.helpers import POLICIES

SHAPES = [
    (POLICIES / "vllm_v1.yaml", []),
    (POLICIES / "prefix_caching" / "vllm_v1.yaml", []),
    (POLICIES / "sglang" / "sglang_v05.yaml", []),
    (POLICIES / "broken" / "eagle_unreserved_lookahead.yaml", []),
    (POLICIES / "vllm_v1.yaml", ["pipeline.in_flight=1"]),
    (POLICIES / "vllm_v1.yaml", ["queue.blocked_waiting=skip"]),
    (POLICIES / "connector" / "vllm_v1_decode_node.yaml", []),
]


@pytest.mark.parametrize("path, overrides", SHAPES, ids=lambda v: getattr(v, "stem", None) or ",".join(v) or "-")
def test_every_state_shape_takes_the_fast_fingerprint(path, overrides):
    policy = apply_overrides(load_policy(path), overrides) if overrides else load_policy(path)
    state = SchedulerState(policy, [])
    assert _FAST and set(vars(state)) - _STATE_SKIP == set(_FAST_STATE), \
        sorted(set(vars(state)) - _STATE_SKIP ^ set(_FAST_STATE))
    hash(fast_fingerprint(state))


def test_the_generic_fingerprint_freezes_sets():
    assert _freeze(frozenset({1, 2})) == _freeze({2, 1}) and hash(_freeze(frozenset({(1, 2)})))
