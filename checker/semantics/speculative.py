"""Speculative decoding (policy.speculative), the step's only speculative code besides its hooks in step.py and
kv.py (docs/speculative.md; vLLM 0.33's scheduler is the reference).

- A running request holds drafts (``SpecState.drafts``) once it was scheduled in a step that left it decoding
  (not a prefill chunk): the drafter proposes ``num_tokens`` of them after every such step. A request gets none
  before its first step, scheduling it consumes them, and preempting it drops them.
- Its next decode schedules its one token plus its drafts (``wanted``), capped by the budget and by
  max_model_len (``cap_len``); the step's token budget counts every one of them, plus the method's extra budget
  slots per scheduled request (``Budget.slot``), and KV is allocated for the scheduled tokens plus the drafter's
  lookahead slots (kv.target_blocks).
- In phase 6 the environment accepts a = 0..d of the d drafts scheduled (``accepted``: from a check-log line,
  else the request's ``accepted`` list): the rejected ones are rolled back (the computed tokens go back by d - a)
  and the request gains 1 + a output tokens, fewer when it reaches its output length or max_model_len (``verify``).
- A waiting request one token short of its sequence that is admitted beside scheduled running requests (no
  running prefill scheduled) is padded to a uniform decode of 1 + num_tokens tokens, its num_tokens placeholder
  drafts always rejected (vLLM's pad_spec_decode; ``pad``).

The blocks a request holds are never given back on rejection (vLLM keeps them for its next decode).
"""

from __future__ import annotations

from checker.policy import Policy
from checker.semantics.state import Request, SchedulerState, Status

RUNNING = Status.RUNNING


class SpecState:
    """What speculative decoding keeps between steps: each running request's drafts, and how many of its steps
    have verified drafts (the index into its ``accepted`` list)."""

    __slots__ = ("k", "lookahead", "needed", "slot", "drafts", "verified", "fed", "padded", "drafted",
                 "accepted_total", "steps_verified", "lookahead_peak")

    def __init__(self, policy: Policy):
        spec = policy.speculative
        self.k = spec.num_tokens
        self.lookahead = spec.reserved_slots  # allocated with the scheduled tokens
        self.needed = spec.lookahead_slots  # what the drafter writes (more than the above: a planted bug)
        self.slot = spec.budget_slots
        self.drafts: dict[int, int] = {}  # rid -> draft tokens it holds (proposed, not yet scheduled)
        self.verified: dict[int, int] = {}  # rid -> how many of its steps verified drafts so far
        # rid -> accepted counts of its verifying steps as a log gives them (check-log feeds them as it reads the
        # log); they take the place of the request's own ``accepted`` list
        self.fed: dict[int, list[int]] = {}
        self.padded: set[int] = set()  # rids padded to a uniform decode in this step (placeholder drafts)
        self.drafted = 0  # totals, for the metrics: drafts verified and accepted, rows that verified drafts
        self.accepted_total = 0
        self.steps_verified = 0
        # the most blocks in use counting the lookahead slots not reserved (lookahead_fits's count), where any are not
        self.lookahead_peak = 0

    def copy(self) -> SpecState:
        c = SpecState.__new__(SpecState)
        c.k, c.lookahead, c.needed, c.slot = self.k, self.lookahead, self.needed, self.slot
        c.drafts, c.verified, c.fed, c.padded = (dict(self.drafts), dict(self.verified),
                                              {rid: list(v) for rid, v in self.fed.items()}, set(self.padded))
        c.drafted, c.accepted_total, c.steps_verified = self.drafted, self.accepted_total, self.steps_verified
        c.lookahead_peak = self.lookahead_peak
        return c

    def snapshot(self) -> tuple:
        return (tuple(sorted(self.drafts.items())), tuple(sorted(self.verified.items())))


def wanted(s: SchedulerState, r: Request, gap: int) -> int:
    """Tokens a request asks for: its gap plus the drafts it holds (vLLM num_tokens_with_spec - computed)."""
    return gap + s.spec.drafts.get(r.rid, 0)


def cap_len(s: SchedulerState, r: Request, n: int) -> int:
    """The scheduled tokens' positions stay within max_model_len, a sampled token after them (vLLM's running pass:
    max_model_len - num_computed_tokens - 1)."""
    return min(n, s.policy.max_model_len - r.num_computed - 1)


def lookahead_tokens(s: SchedulerState, r: Request, tokens: int) -> int:
    """KV positions a request needs for ``tokens`` of context plus the drafter's lookahead slots (capped by
    max_model_len, as vLLM's allocate_slots caps num_tokens_need_slot)."""
    return min(tokens + s.spec.lookahead, s.policy.max_model_len)


def pad(s: SchedulerState, r: Request, n: int, tokens_left: int, scheduled: dict[int, int],
        admitted: list[int]) -> int:
    """A waiting request's first chunk under vLLM's uniform-decode padding: n unchanged, 1 + k when it is padded,
    or -1 when it would be padded but the budget cannot hold 1 + k (vLLM then ends the waiting pass)."""
    if r.prompt_len + r.num_generated - r.num_computed != 1:
        return n
    running = s.requests
    ran = [rid for rid in scheduled if rid not in admitted]  # scheduled in the running pass
    if any(running[rid].in_prefill for rid in ran):
        return n  # vLLM's prefill_scheduled: a running prefill chunk in the batch
    if not ran and not r.num_computed:
        return n
    k = s.spec.k
    if r.num_computed + k + 2 > s.policy.max_model_len:
        return n
    if 1 + k > tokens_left:
        return -1
    s.spec.padded.add(r.rid)
    return 1 + k


def feed(s: SchedulerState, accepted: dict[int, int]) -> None:
    """A log line's accepted counts, appended to what each request's verifying steps read (check-log)."""
    fed = s.spec.fed
    for rid, a in accepted.items():
        fed.setdefault(rid, []).append(a)


def drop(s: SchedulerState, r: Request) -> None:
    """The request's drafts are gone (it was preempted or left)."""
    s.spec.drafts.pop(r.rid, None)


def accepted(s: SchedulerState, r: Request, d: int) -> int:
    """How many of the d drafts scheduled for r the verifier accepts (the environment's choice): 0 for padded
    placeholders; else the n-th entry of the request's ``accepted`` list (or of what a log fed for it) at its n-th
    verifying step, none past the end."""
    spec = s.spec
    rid = r.rid
    if rid in spec.padded:
        return 0
    n = spec.verified.get(rid, 0)
    spec.verified[rid] = n + 1
    given = spec.fed[rid] if rid in spec.fed else r.spec.accepted
    return max(0, min(given[n], d)) if n < len(given) else 0


def choose(s: SchedulerState, r: Request, d: int) -> int:
    """The verifier's choice for the d drafts scheduled for r (``accepted``), counted in the totals."""
    a = accepted(s, r, d)
    spec = s.spec
    if r.rid not in spec.padded:
        spec.drafted += d
        spec.accepted_total += a
        spec.steps_verified += 1
    return a


def verify(s: SchedulerState, r: Request, d: int) -> tuple[int, bool]:
    """Phase 6 for a request that was scheduled one token and d >= 1 drafts: the accepted drafts are kept, the
    rejected rolled back; returns (output tokens produced, whether it finished)."""
    a = choose(s, r, d)
    total = r.prompt_len + r.num_generated
    m = min(1 + a, r.output_len - r.num_generated, s.policy.max_model_len - total)
    r.num_computed += m  # computed + 1 + d scheduled, d - a rolled back, the tokens trimmed at a stop too
    r.num_generated += m
    return m, r.num_generated >= r.output_len or total + m >= s.policy.max_model_len


def propose(s: SchedulerState, scheduled: dict[int, int], produced: list[int]) -> None:
    """After the step: the drafter proposes k drafts for every request of the batch that still runs and sampled a
    token in it (vLLM's update_draft_token_ids drops those of a request whose step was a prefill chunk, one that
    left even a single token of its prompt or recompute uncomputed)."""
    spec = s.spec
    spec.padded.clear()
    if spec.needed > spec.lookahead:
        _count_unreserved(s, scheduled)
    k, drafts, by_rid = spec.k, spec.drafts, s.requests
    for rid in scheduled:  # scheduling consumed the drafts each held (vLLM clears spec_token_ids)
        drafts.pop(rid, None)
    for rid in produced:
        if by_rid[rid].status is RUNNING:
            drafts[rid] = k


def _count_unreserved(s: SchedulerState, scheduled: dict[int, int]) -> None:
    """The blocks in use after the step counting, for every request it scheduled that still runs, the blocks its
    computed tokens and the drafter's lookahead slots need beyond those it holds (the catalogue's lookahead_fits reads
    the same count from the step's frame); the peak is kept for the metrics (fuzz's lookahead_within_pool)."""
    size, cap, look, by_rid = s.policy.kv.block_size, s.policy.max_model_len, s.spec.needed, s.requests
    lacking = 0
    for rid in scheduled:
        r = by_rid[rid]
        if r.status is RUNNING:
            lacking += max(0, -(-min(r.num_computed + look, cap) // size) - r.blocks)
    s.spec.lookahead_peak = max(s.spec.lookahead_peak, s.kv_used + lacking)
