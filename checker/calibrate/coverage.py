"""Where a policy asks a calibrated profile for batches beyond the shapes it was fitted on.

Policies declare no model shape, so the check that a profile belongs to the policy's model cannot be
made; what can be checked is the policy's limits against the profile's measured range: the token
budget per step against the largest measured batch, the sequence cap against the largest measured
decode batch, and max_model_len against the longest measured context. Times beyond them are
extrapolated by the fitted lines; each such limit gives one note.
"""

from __future__ import annotations

from checker.policy import Policy
from checker.profile import Profile


def extrapolation_notes(policy: Policy, profile: Profile) -> list[str]:
    """One line per policy limit beyond the profile's measured range (none for unmeasured profiles)."""
    if profile.calibration is None:
        return []
    r = profile.calibration.measured_range
    checks = (("batch.max_num_batched_tokens", policy.batch.max_num_batched_tokens, r.max_batched_tokens,
               "scheduled tokens per step"),
              ("batch.max_num_seqs", policy.batch.max_num_seqs, r.max_decode_seqs, "decode sequences per step"),
              ("max_model_len", policy.max_model_len, r.max_context, "context tokens"))
    name = policy.name or "policy"
    return [f"extrapolation: {name}: {field}={value} is beyond profile {profile.name}'s measured range "
            f"({what} up to {measured}); step times past it are extrapolated"
            for field, value, measured, what in checks if value > measured]
