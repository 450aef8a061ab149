"""Clients: which client sends each class, the backoff before a retry (jitter drawn from a seeded stream) and
the retry budgets (one per client, one shared by all)."""

from __future__ import annotations

import random

from checker.fleet.spec import Backoff, Client, Jitter, RetryBudget


def client_of_class(clients: list[Client], class_names: list[str]) -> list[int]:
    """For each class (by index), the index of the client that sends it (the catch-all client for classes no
    client names; a class no client takes is sent by a client that never retries, index -1)."""
    catch_all = next((i for i, c in enumerate(clients) if c.classes is None), -1)
    named = {cls: i for i, c in enumerate(clients) for cls in c.classes or []}
    return [named.get(name, catch_all) for name in class_names]


NO_RETRY_CLIENT = Client(name="(no client)")


def backoff_us(b: Backoff, request: int, retry: int) -> int:
    """The wait before retry number ``retry`` (1, 2, ...) of request ``request``: the same for the same seed,
    request and retry, whatever else happens in the run."""
    delay = min(b.max_ms, b.initial_ms * b.multiplier ** (retry - 1))
    if b.jitter is not Jitter.NONE and delay > 0:
        u = random.Random(f"{b.seed}:{request}:{retry}").random()
        delay = delay * u if b.jitter is Jitter.FULL else delay / 2 + delay / 2 * u
    return round(delay * 1000)


class Budget:
    """A retry budget: a retry is allowed when the retries so far, this one included, are at most
    min_retries + ratio * first attempts so far (so retries never pass that, and retry amplification stays at
    most 1 + ratio + min_retries / requests)."""

    __slots__ = ("spec", "sent", "retries")

    def __init__(self, spec: RetryBudget | None):
        self.spec = spec
        self.sent = 0
        self.retries = 0

    def allows(self) -> bool:
        return self.spec is None or self.retries + 1 <= self.spec.min_retries + self.spec.ratio * self.sent
