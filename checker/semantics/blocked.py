"""Blocked waiting states (policy.queue.blocked_waiting): a waiting request that the scan cannot admit yet for a
reason of its own, here a structured-output request whose grammar is still compiling (vLLM 0.33
WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR; request field ``grammar_steps``).

A request arriving in step ``a`` with ``grammar_steps = g > 0`` is blocked in the waiting scans of steps ``a`` ..
``a + g - 1``; the scan of step ``a + g`` finds its grammar ready and tries it like any waiting request. While it
is blocked:

- ``skip`` (vLLM 0.33): the scan passes over it (skip_request: popped onto the step's skipped list, which is
  prepended to the queue when the pass ends, in its order: the request keeps its place), and goes on;
- ``stop`` (a planted bug): it is treated as a request that does not fit: under strict head of line the pass
  stops there.

It holds nothing (no blocks, no seat), is counted as waiting, and may be cancelled or time out like any waiting
request. ``s.blocked`` maps the rid of each request still blocked to the step that finds it ready; it is None
when the policy's blocked_waiting is off (grammar_steps ignored: every rule exactly as without it).
"""

from __future__ import annotations

from checker.errors import InputError, Problem
from checker.loading import load_document
from checker.policy import BlockedWaiting, Policy
from checker.semantics.state import Request, SchedulerState, Status

WAITING = Status.WAITING


def arrive(s: SchedulerState, r: Request) -> None:
    """A request entered the waiting queue in this step: blocked until step ``s.step + grammar_steps``."""
    steps = r.spec.grammar_steps
    if steps:
        s.blocked[r.rid] = s.step + steps


def passes_over(s: SchedulerState, r: Request) -> bool | None:
    """What the scan does at r: None if r is not blocked (try it); True if it is blocked and the scan passes over
    it (skip); False if it is blocked and counts as not fitting (stop). A request found ready leaves the map."""
    ready = s.blocked.get(r.rid)
    if ready is None:
        return None
    if ready <= s.step:
        del s.blocked[r.rid]
        return None
    return s.policy.queue.blocked_waiting is BlockedWaiting.SKIP


def pending(s: SchedulerState) -> bool:
    """Some waiting request is still blocked: a grammar becomes ready in a later step without any event (the
    engine keeps stepping; a fast-forward stretch may not cross it). Entries of requests that left the queue
    (cancelled, timed out) are dropped."""
    blocked = s.blocked
    if not blocked:
        return False
    requests = s.requests
    for rid in [rid for rid in blocked if requests[rid].status is not WAITING]:
        del blocked[rid]
    return bool(blocked)


def refuse(policy: Policy, tool: str, source: str | None = None, encoded: bool = False) -> None:
    """Refuse (exit 2, by field; at its line of ``source``, the policy file, when given) a policy using blocked
    waiting states or loads that may fail in a tool that does not model them (the z3 encoding, any-N, the liveness
    explorer): its environment would never choose a grammar delay or a failed load, so a verdict would be about a
    different system. (connector.load_failure alone is accepted: with loads_may_fail false no load fails there, and
    the rule is never used.) ``encoded``: the tool models blocked waiting states (the liveness explorer; the z3
    encoding for verify's bounded search, checker/smt/encode.py); only failed loads are refused there."""
    if policy.queue.blocked_waiting is not BlockedWaiting.OFF and not encoded:
        field, value = ("queue", "blocked_waiting"), policy.queue.blocked_waiting.value
        why = f"off for {tool}: blocked waiting states (grammar_steps) are not encoded there yet"
    elif policy.connector.loads_may_fail:
        field, value = ("connector", "loads_may_fail"), True
        why = f"false for {tool}: failed loads (load_fails) are not encoded there yet"
    else:
        return
    line = load_document(source)[1]().get(field) if source is not None else None
    raise InputError(Problem(".".join(field), value, why + "; simulate, fuzz and check-log run the engine with them",
                             line), source)
