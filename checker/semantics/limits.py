"""Policy limits that N request slots cannot reach.

``batch.max_num_seqs`` is read by the step semantics (checker/semantics/step.py, sglang.py), its z3 encoding
(checker/smt/encode.py), the engine and the invariants only as a bound compared with a count of requests (running,
in the batch), never in arithmetic, with one exception: under SGLang's rules a step's token bound is
``max(max_num_batched_tokens, max_num_seqs)`` (Policy.step_token_bound). A count of N slots' requests lies in
0..N, and every comparison of such a count with a bound gives the same answer for every bound >= N + 1; so with N
slots a policy behaves, step for step and invariant for invariant, exactly as the same policy with its bound
lowered to N + 1 (tests/unit/test_limits.py pins the places that read the field, so that a new reader is
looked at)."""

from __future__ import annotations

from checker.policy import Policy, Scheduler


def as_seen_by(policy: Policy, slots: int) -> Policy:
    """``policy`` with every limit that ``slots`` requests cannot reach lowered to the first value they could: the
    same runs, verdicts and counterexamples for any number of iterations with at most ``slots`` requests."""
    b = policy.batch
    cap = slots + 1
    if b.max_num_seqs <= cap:
        return policy
    if policy.scheduler is Scheduler.SGLANG and b.max_num_seqs > b.max_num_batched_tokens:
        return policy  # the step's token bound is max_num_seqs itself: a value, not a count bound
    return policy.model_copy(update={"batch": b.model_copy(update={"max_num_seqs": cap})})
