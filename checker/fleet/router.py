"""The router: which replica an arriving request goes to, from its view of the replicas' load.

The view may be stale: each replica's load (outstanding requests, KV blocks in use) is seen as it was
``staleness_ms`` ago, and a replica whose view is lost (a view_lost fault) is seen as it was when the view
was lost. The router's own memory (the round-robin position, which prompts and sessions it sent where) is
never stale: it is the router's. Ties go to the lowest replica index, so every choice is deterministic.
"""

from __future__ import annotations

from bisect import bisect_right

from checker.fleet.spec import Router as RouterSpec
from checker.fleet.spec import Strategy
from checker.requests import PromptContent, shared_prefix_tokens

PREFIX_MEMORY = 64  # prompts remembered per replica for prefix_aware (the most recent ones)


class LoadView:
    """Samples of one replica's load over time: (time, outstanding, kv share); read as of a time."""

    __slots__ = ("times", "loads")

    def __init__(self) -> None:
        self.times: list[int] = [0]
        self.loads: list[tuple[int, float]] = [(0, 0.0)]

    def record(self, t: int, outstanding: int, kv_share: float) -> None:
        if self.loads[-1] == (outstanding, kv_share):
            return
        if self.times[-1] == t:
            self.loads[-1] = (outstanding, kv_share)
        else:
            self.times.append(t)
            self.loads.append((outstanding, kv_share))

    def at(self, t: int) -> tuple[int, float]:
        """The load as it was at time t (the last sample at or before t)."""
        return self.loads[max(0, bisect_right(self.times, t) - 1)]


def session_key(content: PromptContent | None) -> tuple[int, int] | None:
    """A conversation's key: its prompt's first run (every turn of a session extends the first turn's prompt;
    checker.workload's sessions), None for a prompt of the request's own tokens."""
    return content[0] if content else None


class Router:
    def __init__(self, spec: RouterSpec, num_replicas: int):
        self.spec = spec
        self.staleness_us = round(spec.staleness_ms * 1000)
        self.views = [LoadView() for _ in range(num_replicas)]
        self.frozen: dict[int, int] = {}  # replica -> the time its view was lost (a view_lost fault in force)
        self.next_rr = 0
        self.sessions: dict[tuple[int, int], int] = {}
        self.sent: list[list[PromptContent]] = [[] for _ in range(num_replicas)]

    def seen(self, replica: int, now: int) -> tuple[int, float]:
        t = self.frozen.get(replica, now - self.staleness_us)
        return self.views[replica].at(max(0, min(t, now - self.staleness_us)))

    def choose(self, content: PromptContent | None, candidates: list[int], now: int) -> int:
        """The replica (one of ``candidates``, in index order, not empty) the request goes to."""
        strategy = self.spec.strategy
        if strategy is Strategy.ROUND_ROBIN:
            n = len(self.views)
            for k in range(n):
                r = (self.next_rr + k) % n
                if r in candidates:
                    self.next_rr = (r + 1) % n
                    return r
        if strategy is Strategy.LEAST_KV_LOAD:
            return min(candidates, key=lambda r: (self.seen(r, now)[1], self.seen(r, now)[0], r))
        if strategy is Strategy.SESSION_AFFINITY:
            key = session_key(content)
            if key is not None and self.sessions.get(key) in candidates:
                return self.sessions[key]
            choice = self._least_outstanding(candidates, now)
            if key is not None:
                self.sessions[key] = choice
            return choice
        if strategy is Strategy.PREFIX_AWARE:
            return self._prefix(content, candidates, now)
        return self._least_outstanding(candidates, now)

    def _least_outstanding(self, candidates: list[int], now: int) -> int:
        return min(candidates, key=lambda r: (self.seen(r, now)[0], r))

    def _prefix(self, content: PromptContent | None, candidates: list[int], now: int) -> int:
        best, best_len = None, 0
        if content is not None:
            for r in candidates:
                n = max((shared_prefix_tokens(content, c) for c in self.sent[r]), default=0)
                if n > best_len:
                    best, best_len = r, n
        cap = self.spec.load_cap
        if best is None or (cap is not None and self.seen(best, now)[0] >= cap):
            best = self._least_outstanding(candidates, now)
        if content is not None:
            memory = self.sent[best]
            memory.append(content)
            if len(memory) > PREFIX_MEMORY:
                del memory[0]
        return best
