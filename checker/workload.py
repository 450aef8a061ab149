"""Workload spec: request classes with arrival processes and length distributions, and a seed.

``generate`` turns a workload into a deterministic list of RequestSpec (same seed, same requests).
"""

from __future__ import annotations

import itertools
import math
import random
from typing import Annotated, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

from checker.policy import MAX_TOKENS
from checker.requests import PromptContent, RequestSpec

MAX_REQUESTS = 5_000_000
MAX_ARRIVALS = 5_000_000  # arrivals a workload may draw (expected, over its duration; before max_requests applies)
MAX_DURATION_S = 7 * 86_400


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


def _fail(field: str, value: object, expected: str) -> PydanticCustomError:
    return PydanticCustomError("consistency", "", {"field": field, "value": value, "expected": expected})


# ----------------------------------------------------------------------------------------- lengths
Tokens = Annotated[int, Field(ge=1, le=MAX_TOKENS)]


class Fixed(_Strict):
    dist: Literal["fixed"]
    value: Tokens

    def sample(self, rng: random.Random) -> int:
        return self.value

    @property
    def upper(self) -> int:
        return self.value


class Uniform(_Strict):
    dist: Literal["uniform"]
    low: Tokens
    high: Tokens

    @model_validator(mode="after")
    def _ordered(self) -> Uniform:
        if self.high < self.low:
            raise _fail("high", self.high, f">= low={self.low}")
        return self

    def sample(self, rng: random.Random) -> int:
        return rng.randint(self.low, self.high)

    @property
    def upper(self) -> int:
        return self.high


class LogNormal(_Strict):
    """Log-normal with the given median and sigma (of the log), clipped to [min, max]."""

    dist: Literal["lognormal"]
    median: Annotated[float, Field(gt=0, le=MAX_TOKENS)]
    sigma: Annotated[float, Field(ge=0, le=10)]
    min: Tokens = 1
    max: Tokens

    @model_validator(mode="after")
    def _ordered(self) -> LogNormal:
        if self.max < self.min:
            raise _fail("max", self.max, f">= min={self.min}")
        return self

    def sample(self, rng: random.Random) -> int:
        value = round(rng.lognormvariate(math.log(self.median), self.sigma))
        return min(self.max, max(self.min, value))

    @property
    def upper(self) -> int:
        return self.max


class Choice(_Strict):
    dist: Literal["choice"]
    values: Annotated[list[Tokens], Field(min_length=1)]
    weights: list[Annotated[float, Field(ge=0)]] | None = None

    @model_validator(mode="after")
    def _weights(self) -> Choice:
        if self.weights is not None and (len(self.weights) != len(self.values) or sum(self.weights) <= 0):
            raise _fail("weights", self.weights, f"{len(self.values)} non-negative weights, not all zero")
        return self

    def sample(self, rng: random.Random) -> int:
        return rng.choices(self.values, weights=self.weights)[0]

    @property
    def upper(self) -> int:
        return max(self.values)


Length = Annotated[Union[Fixed, Uniform, LogNormal, Choice], Field(discriminator="dist")]


# ----------------------------------------------------------------------------------------- arrivals
class Poisson(_Strict):
    process: Literal["poisson"]
    rate_per_s: Annotated[float, Field(gt=0, le=1e6)]

    def expected(self, span_ms: float) -> float:
        return self.rate_per_s * span_ms / 1000.0

    def times_ms(self, rng: random.Random, start: float, stop: float) -> list[float]:
        out, t = [], start
        while True:
            t += rng.expovariate(self.rate_per_s) * 1000.0
            if t >= stop:
                return out
            out.append(t)


class FixedInterval(_Strict):
    process: Literal["fixed"]
    interval_ms: Annotated[float, Field(gt=0, le=1e9)]

    def expected(self, span_ms: float) -> float:
        return math.ceil(span_ms / self.interval_ms)

    def times_ms(self, rng: random.Random, start: float, stop: float) -> list[float]:
        n = int(math.ceil((stop - start) / self.interval_ms))
        return [start + i * self.interval_ms for i in range(n) if start + i * self.interval_ms < stop]


class Bursts(_Strict):
    """``size`` requests every ``every_ms``, ``spacing_ms`` apart inside a burst."""

    process: Literal["bursts"]
    size: Annotated[int, Field(ge=1, le=1_000_000)]
    every_ms: Annotated[float, Field(gt=0, le=1e9)]
    spacing_ms: Annotated[float, Field(ge=0, le=1e9)] = 0.0

    def expected(self, span_ms: float) -> float:
        return self.size * math.ceil(span_ms / self.every_ms)

    def times_ms(self, rng: random.Random, start: float, stop: float) -> list[float]:
        out, t = [], start
        while t < stop:
            out.extend(t + i * self.spacing_ms for i in range(self.size) if t + i * self.spacing_ms < stop)
            t += self.every_ms
        return out


Arrival = Annotated[Union[Poisson, FixedInterval, Bursts], Field(discriminator="process")]


class Cancel(_Strict):
    probability: Annotated[float, Field(ge=0, le=1)]
    after_ms: Annotated[float, Field(ge=0, le=1e9)]
    """Delay from arrival to the cancel (ms)."""


class SharedPrefix(_Strict):
    """Each request starts with one of ``system_prompts`` distinct system prompts of ``tokens`` tokens (drawn
    uniformly), followed by its own ``prompt_tokens``: requests with the same system prompt share it."""

    system_prompts: Annotated[int, Field(ge=1, le=1_000_000)]
    tokens: Tokens


class Sessions(_Strict):
    """Multi-turn conversations: each arrival of the class opens a session of ``turns`` requests, turn k + 1
    arriving ``think_time_ms`` after turn k (open loop). Turn k + 1's prompt is turn k's prompt, then turn
    k's output, then a new message of ``prompt_tokens``: it extends the previous prompt, whose blocks a
    prefix cache can reuse (the previous output and the new message are the turn's own tokens)."""

    turns: Annotated[int, Field(ge=1, le=10_000)]
    think_time_ms: Annotated[float, Field(ge=0, le=1e9)]


class ExternalKV(_Strict):
    """With a KV connector (policy.connector): requests of the class whose prompt an external tier (a CPU
    offload, a prefill node) holds, and how their transfers go. Draws come from a stream of their own, so the
    class's other draws are the same with or without this section."""

    fraction: Annotated[float, Field(ge=0, le=1)]
    """Share of the class's requests with an external hit."""
    prefix_share: Annotated[float, Field(gt=0, le=1)] = 1.0
    """How much of the prompt the tier holds (rounded down to a token, at least one)."""
    load_steps: Length = Field(default_factory=lambda: Fixed(dist="fixed", value=1))
    """Steps a load takes (a load started in step t is reported in the output of step t + load_steps - 1)."""
    lost: Annotated[float, Field(ge=0, le=1)] = 0.0
    """Probability that a load (or, on a prefill node, a send) is never reported."""
    send_steps: Annotated[int, Field(ge=0, le=MAX_TOKENS)] = 0
    """On a prefill node: steps after a finish (plus one) until the decode side confirms the transfer."""

    def draw(self, rng: random.Random, prompt: int) -> dict:
        """RequestSpec connector fields for one request (nothing for a request without an external hit)."""
        lost = rng.random() < self.lost
        fields: dict = {"send_steps": None if lost else self.send_steps} if self.send_steps or lost else {}
        if rng.random() < self.fraction:
            steps = self.load_steps.sample(rng)
            fields.update(external_tokens=max(1, int(prompt * self.prefix_share)), load_steps=None if lost else steps)
        return fields


class StructuredOutput(_Strict):
    """With blocked waiting states (policy.queue.blocked_waiting): requests of the class that ask for structured
    output, whose grammar compiles for ``grammar_steps`` steps after arrival (they wait blocked meanwhile). Draws come
    from a stream of their own, so the class's other draws are the same with or without this section."""

    fraction: Annotated[float, Field(ge=0, le=1)]
    """Share of the class's requests with a structured output."""
    grammar_steps: Length = Field(default_factory=lambda: Fixed(dist="fixed", value=1))
    """Steps the grammar compiles (a request arriving in step a is blocked in the scans of steps a .. a + steps - 1)."""

    def draw(self, rng: random.Random) -> dict:
        return {"grammar_steps": self.grammar_steps.sample(rng)} if rng.random() < self.fraction else {}


class Acceptance(_Strict):
    """With speculative decoding (policy.speculative): how the verifier treats the class's drafts. Each of a
    request's verifying steps accepts the drafts up to the first rejected one, each draft accepted with
    probability ``rate`` (independently; the engine clamps the count to the drafts scheduled). Draws come from a
    stream of their own, so the class's other draws are the same with or without this section."""

    rate: Annotated[float, Field(ge=0, le=1)]
    """Probability that a draft is accepted (given the ones before it were)."""
    max_drafts: Annotated[int, Field(ge=1, le=64)] = 64
    """Most drafts a step can accept (draws stop here; set it to the policy's speculative.num_tokens or more)."""

    def draw(self, rng: random.Random, output: int) -> dict:
        """The request's ``accepted`` list: one count per possible verifying step (at most its output length)."""
        counts = []
        for _ in range(output):
            a = 0
            while a < self.max_drafts and rng.random() < self.rate:
                a += 1
            counts.append(a)
        return {"accepted": tuple(counts)}


class RequestClass(_Strict):
    name: Annotated[str, Field(min_length=1)]
    priority: Annotated[int, Field(ge=-1_000_000, le=1_000_000)] = 0
    tenant: Annotated[str, Field(min_length=1)] = "default"
    arrival: Arrival
    prompt_tokens: Length
    output_tokens: Length
    max_output_tokens: Tokens | None = None
    """Declared max_tokens (what full reservation reserves); default: the output distribution's upper end."""
    start_ms: Annotated[float, Field(ge=0, le=MAX_DURATION_S * 1000)] = 0.0
    stop_ms: Annotated[float | None, Field(ge=0, le=MAX_DURATION_S * 1000)] = None
    cancel: Cancel | None = None
    shared_prefix: SharedPrefix | None = None
    """Requests start with one of a few system prompts (prefix caching can share them)."""
    sessions: Sessions | None = None
    """Requests are the turns of multi-turn conversations, each prompt extending the previous one."""
    external_kv: ExternalKV | None = None
    """With a KV connector: an external-hit fraction and the transfers' latency (ignored without one)."""
    speculative_acceptance: Acceptance | None = None
    """With speculative decoding: the verifier's acceptance of the class's drafts (ignored without it; absent: none
    accepted)."""
    structured_output: StructuredOutput | None = None
    """With blocked waiting states: a share of structured-output requests and their grammars' compile steps (ignored
    when queue.blocked_waiting is off)."""

    @model_validator(mode="after")
    def _consistent(self) -> RequestClass:
        if self.max_output_tokens is not None and self.max_output_tokens < self.output_tokens.upper:
            raise _fail("max_output_tokens", self.max_output_tokens,
                        f">= the output distribution's upper end ({self.output_tokens.upper})")
        if self.stop_ms is not None and self.stop_ms <= self.start_ms:
            raise _fail("stop_ms", self.stop_ms, f"> start_ms={self.start_ms}")
        return self

    @property
    def max_output(self) -> int:
        return self.max_output_tokens or self.output_tokens.upper


class NamedClasses(BaseModel):
    """Shared by every record with request classes: names are unique; tenants are derived from them."""

    @model_validator(mode="after")
    def _unique_names(self):
        names = [c.name for c in self.classes]  # type: ignore[attr-defined]
        for i, name in enumerate(names):
            if names.index(name) != i:
                raise _fail(f"classes.{i}.name", name, "a class name used once")
        return self

    @property
    def tenants(self) -> list[str]:
        return sorted({c.tenant for c in self.classes})  # type: ignore[attr-defined]


class Workload(_Strict, NamedClasses):
    """Request classes with arrival processes and length distributions, and a seed."""

    name: str | None = None
    seed: Annotated[int, Field(ge=0)] = 0
    duration_s: Annotated[float, Field(gt=0, le=MAX_DURATION_S)]
    max_requests: Annotated[int | None, Field(ge=1, le=MAX_REQUESTS)] = None
    classes: Annotated[list[RequestClass], Field(min_length=1)]

    @model_validator(mode="after")
    def _arrivals_bounded(self) -> Workload:
        """Every arrival of every class is drawn (the draws of a class come from one stream: its lengths follow
        its arrival times), so the arrivals are bounded before any is drawn, max_requests or not."""
        total = 0.0
        for i, c in enumerate(self.classes):
            stop = min(self.duration_s * 1000.0, c.stop_ms) if c.stop_ms is not None else self.duration_s * 1000.0
            total += c.arrival.expected(max(0.0, stop - c.start_ms)) * (c.sessions.turns if c.sessions else 1)
            if total > MAX_ARRIVALS:
                raise _fail(f"classes.{i}.arrival", c.arrival.model_dump(exclude_defaults=True),
                            f"at most {MAX_ARRIVALS:,} arrivals in all over duration_s={self.duration_s:g} (every "
                            f"one is drawn before max_requests applies; this class brings the expected count "
                            f"to {total:,.0f})")
        return self


def generate(w: Workload, limit: int | None = None) -> list[RequestSpec]:
    """Deterministic requests for a workload: each class draws from its own seeded stream, then the
    requests are merged by arrival time (ties by class order) and numbered. ``limit`` (``--limit``) and
    ``max_requests``: only the first that many, built no further than needed: the same requests as building
    them all and keeping the first (a class draws all its arrival times first, then its requests in arrival
    order; a class without sessions or shared prefixes, whose requests name no token runs, stops at the
    limit)."""
    keep = min((n for n in (w.max_requests, limit) if n is not None), default=None)
    tenants = {t: i for i, t in enumerate(w.tenants)}
    stop_all = w.duration_s * 1000.0
    rows = []
    names = TokenNames()
    for ci, c in enumerate(w.classes):
        rng = random.Random(f"{w.seed}/{ci}/{c.name}")
        external = None if c.external_kv is None else (c.external_kv, random.Random(f"{w.seed}/{ci}/{c.name}/external"))
        accept = (None if c.speculative_acceptance is None
                  else (c.speculative_acceptance, random.Random(f"{w.seed}/{ci}/{c.name}/accept")))
        grammar = (None if c.structured_output is None
                   else (c.structured_output, random.Random(f"{w.seed}/{ci}/{c.name}/grammar")))
        stop = min(stop_all, c.stop_ms) if c.stop_ms is not None else stop_all
        times = c.arrival.times_ms(rng, c.start_ms, stop)
        if keep is not None and c.sessions is None and c.shared_prefix is None and len(times) > keep and \
                all(a <= b for a, b in zip(times, itertools.islice(times, 1, None))):
            times = times[:keep]  # its first `keep` (in order) are the only ones the merge can keep
        for t in times:
            if c.sessions is None and c.shared_prefix is None:  # the request's own tokens (no content needed)
                prompt = c.prompt_tokens.sample(rng)
                output = c.output_tokens.sample(rng)
                rows.append((t, ci, prompt, output, c.max_output, c.priority, tenants[c.tenant],
                             _cancel(c, rng, t), None, _transfer(external, prompt, accept, output, grammar)))
                continue
            content: PromptContent = ()
            if c.shared_prefix is not None:
                g = rng.randrange(c.shared_prefix.system_prompts)
                content = (names.run(("system", ci, g), c.shared_prefix.tokens),)
            previous_output = 0
            for k in range(c.sessions.turns if c.sessions is not None else 1):
                arrival = t + k * (c.sessions.think_time_ms if c.sessions is not None else 0.0)
                own = previous_output + c.prompt_tokens.sample(rng)
                content = content + (names.run(("own", len(names)), own),)
                output = c.output_tokens.sample(rng)
                prompt = sum(n for _, n in content)
                if arrival < stop:
                    rows.append((arrival, ci, prompt, output, c.max_output, c.priority, tenants[c.tenant],
                                 _cancel(c, rng, arrival), content,
                                 _transfer(external, prompt, accept, output, grammar)))
                previous_output = output
    rows.sort(key=lambda row: (row[0], row[1]))
    if keep is not None:
        rows = rows[:keep]
    return [
        RequestSpec(rid=i, arrival_us=round(t * 1000), prompt_len=prompt, output_len=output,
                    max_output=max_out, priority=prio, tenant=tenant, cls=ci,
                    cancel_us=None if cancel is None else round(cancel * 1000), content=content, **transfer)
        for i, (t, ci, prompt, output, max_out, prio, tenant, cancel, content, transfer) in enumerate(rows)
    ]


def _transfer(external: tuple[ExternalKV, random.Random] | None, prompt: int,
              accept: tuple[Acceptance, random.Random] | None = None, output: int = 0,
              grammar: tuple[StructuredOutput, random.Random] | None = None) -> dict:
    """A request's RequestSpec fields drawn by the class's connector, speculative and structured-output sections
    (none without them)."""
    fields = {} if external is None else external[0].draw(external[1], prompt)
    if accept is not None:
        fields.update(accept[0].draw(accept[1], output))
    if grammar is not None:
        fields.update(grammar[0].draw(grammar[1]))
    return fields


def _cancel(c: RequestClass, rng: random.Random, t: float) -> float | None:
    if c.cancel is not None and rng.random() < c.cancel.probability:
        return t + c.cancel.after_ms
    return None


class TokenNames:
    """Fresh token-id runs for generated prompts: one name (a system prompt, a turn's own tokens) per run of
    ids, negative so that they never meet the ids of traces (hash ids, prefix groups), which are positive."""

    SPAN = 10 * MAX_TOKENS  # wider than any prompt

    def __init__(self) -> None:
        self.bases: dict[tuple, int] = {}

    def __len__(self) -> int:
        return len(self.bases)

    def run(self, name: tuple, n: int) -> tuple[int, int]:
        base = self.bases.setdefault(name, -(len(self.bases) + 1) * self.SPAN)
        return (base, n)
