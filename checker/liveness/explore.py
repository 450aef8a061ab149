"""Enumerate the reachable states of a policy into a networkx DiGraph, driving the one step function.

The environment (stated with every verdict, ``LivenessEnv.describe``): at most ``requests`` requests are
in the system at once (a finished, rejected or cancelled request frees its place, so a stream of
arrivals can go on forever); before each iteration the environment chooses which requests arrive (a
sequence of request classes, one per free place, at most ``arrivals_per_step``) and, if cancellations
are on, which live requests the clients cancel. A class is a prompt length, an output length (the
declared max output equals it), a priority and a tenant from the declared sets. The clock is fixed:
iteration k starts at k * step_us. Every state has a successor (the environment can always keep
stepping with no arrivals). With speculative decoding the environment also chooses, for every request that verifies
drafts in the iteration, how many the verifier accepts (``LivenessEnv.accepted``; Transition.acceptance). With blocked
waiting states every class also arrives with a grammar, and before each iteration the environment chooses which
blocked requests' grammars are ready in its scan (``LivenessEnv.grammars``; Transition.readiness).

Nodes are canonical state ids (checker.liveness.canon); node 0 is the empty system. Each edge carries
``labels``: one Label per distinct way the environment's choices take the source to the target (what
the iteration did, and one choice that does it).
"""

from __future__ import annotations

import gc
import itertools
import os
import signal
import time
from dataclasses import dataclass, replace
from typing import NamedTuple

import networkx as nx

from checker.childproc import die_with_parent
from checker.errors import InputError, Problem
from checker.liveness.canon import (GRAMMAR, IDENTITY_TOKENS, LIVE, NO_TRANSFER, Canon, ObservedPool, RequestClass, holding_count,
                                    identity_token)
from checker.policy import BlockedWaiting, Policy, Scheduler
from checker.requests import Identity, RequestSpec, identity_name
from checker.semantics import blocked
from checker.semantics.decision import DecisionBuilder, StepDecision
from checker.semantics.state import Request, SchedulerState, Status
from checker.semantics.step import arrive_phase, leave_phase, release_phase, step, step_schedule

DEFAULT_STEP_US = 10_000
DEFAULT_MAX_STATES = 200_000
# The prompt identities of a caching policy's instance unless chosen: every prompt is prefix group 0's first tokens,
# so requests share their common prefix (equal prompts are equal) and the cache is exercised.
DEFAULT_IDENTITIES: tuple[Identity, ...] = ((0, 0),)
# The external hits of a loading connector's arrivals unless chosen (with the policy's block size between them): none
# and the whole prompt.
DEFAULT_EXTERNAL: tuple[int, ...] = (0, -1)

TERMINAL_STATUSES = frozenset({Status.FINISHED, Status.REJECTED, Status.CANCELLED})
LIVE_STATUSES = frozenset({Status.WAITING, Status.SWAPPED, Status.RUNNING, Status.LOADING})
# An external hit of the whole prompt (LivenessEnv.external); names of external hits as the liveness options write them
EXTERNAL_ALL = -1
EXTERNAL_BLOCK = -2  # the policy's block size: check.liveness_env resolves it (LivenessEnv holds token counts and ALL)
EXTERNAL_NAMES = {"none": 0, "block": EXTERNAL_BLOCK, "all": EXTERNAL_ALL}


def external_choice(token: str) -> int:
    """An external hit as the options write it: none, block (the first KV block), all (the whole prompt), or a
    token count; ValueError for anything else."""
    if token in EXTERNAL_NAMES:
        return EXTERNAL_NAMES[token]
    value = int(token)
    if value < 0:
        raise ValueError(token)
    return value


def external_name(value: int) -> str:
    return {0: "none", EXTERNAL_ALL: "all", EXTERNAL_BLOCK: "block"}.get(value, str(value))


@dataclass(frozen=True)
class LivenessEnv:
    requests: int  # requests in the system at once
    prompts: tuple[int, ...]
    outputs: tuple[int, ...]
    priorities: tuple[int, ...] = (0,)
    tenants: int = 1
    cancellations: bool = False
    arrivals_per_step: int | None = None  # None: up to the free places
    step_us: int = DEFAULT_STEP_US
    identities: tuple[Identity, ...] | None = None  # prompt identities (prefix caching); None: prompts have none
    # A KV connector (policy.connector; instance_env fills them in from the policy): the external hits an arrival may
    # have (tokens, EXTERNAL_ALL: its whole prompt; capped at the prompt), the latencies its load may take
    # (RequestSpec.load_steps; None: never reported) and, on a node that pins finished requests, its send
    # (RequestSpec.send_steps; None: never confirmed). None: the request fields' defaults (no connector choice).
    external: tuple[int, ...] | None = None
    load_steps: tuple[int | None, ...] | None = None
    send_steps: tuple[int | None, ...] | None = None
    # Speculative decoding (instance_env fills it in: 0..speculative.num_tokens): the numbers of drafts the verifier
    # may accept in a step, the environment's choice for each request that verifies drafts (capped at its drafts).
    accepted: tuple[int, ...] | None = None
    # Blocked waiting states (instance_env fills it in from policy.queue.blocked_waiting): every class also arrives
    # as a structured-output request, blocked until the environment chooses, before any iteration, that its grammar is
    # ready (Transition.readiness); it may never choose so.
    grammars: bool = False

    def __post_init__(self):
        for name in ("prompts", "outputs", "priorities"):  # sets: the same instance explores the same way
            object.__setattr__(self, name, tuple(sorted(set(getattr(self, name)))))
        if self.identities is not None:
            unknown = [i for i in self.identities if i not in IDENTITY_TOKENS.values()]
            if unknown or not self.identities:
                raise InputError(Problem("--identities", unknown[0] if unknown else "<empty>",
                                         "prompt identities among: " + ", ".join(IDENTITY_TOKENS)))
            object.__setattr__(self, "identities", tuple(i for i in IDENTITY_TOKENS.values() if i in self.identities))
        for flag, values in (("--prompts", self.prompts), ("--outputs", self.outputs)):
            if not values or min(values) < 1:
                raise InputError(Problem(flag, min(values) if values else "<empty>", "token counts >= 1"))
        if self.requests < 1:
            raise InputError(Problem("--requests", self.requests, ">= 1"))
        if not self.priorities:
            raise InputError(Problem("--priorities", "<empty>", "at least one priority"))
        if self.arrivals_per_step is not None and self.arrivals_per_step < 1:  # 0: nothing ever arrives
            raise InputError(Problem("--arrivals-per-step", self.arrivals_per_step, ">= 1 (with 0 nothing ever arrives, "
                                     "and every property would hold on an empty system)"))
        if self.step_us < 1:
            raise InputError(Problem("--step-ms", self.step_us / 1000, "> 0"))
        for flag, values, low in (("--external", self.external, EXTERNAL_ALL), ("load_steps", self.load_steps, 1),
                                  ("send_steps", self.send_steps, 0)):
            if values is None:
                continue
            if not values or any(v is not None and v < low for v in values):
                raise InputError(Problem(flag, ",".join(map(str, values)) or "<empty>",
                                         "none, block, all or token counts >= 0" if flag == "--external" else
                                         f"steps >= {low}, or None (never)"))
            object.__setattr__(self, flag.strip("-"), tuple(dict.fromkeys(values)))
        if self.accepted is not None:
            if not self.accepted or min(self.accepted) < 0:
                raise InputError(Problem("--accepted", ",".join(map(str, self.accepted)) or "<empty>",
                                         "draft counts >= 0, e.g. 0 (every draft rejected) or 0,1,2"))
            object.__setattr__(self, "accepted", tuple(sorted(set(self.accepted))))

    @property
    def transfers_chosen(self) -> bool:
        return self.external is not None or self.send_steps is not None

    def transfers(self, prompt: int) -> list[tuple[int, int | None, int | None]]:
        """The KV connector choices of an arrival with this prompt: (external_tokens, load_steps, send_steps)."""
        out = []
        for e in self.external or (0,):
            ext = prompt if e == EXTERNAL_ALL else min(e, prompt)
            for load in (self.load_steps or (1,)) if ext else (1,):
                for send in self.send_steps or (0,):
                    out.append((ext, load, send))
        return list(dict.fromkeys(out))

    def classes(self) -> list[RequestClass]:
        base = [(p, o, o, prio, t, ident) for p in self.prompts for o in self.outputs for prio in self.priorities
                for t in range(self.tenants) for ident in self.identities or (None,)]
        if self.transfers_chosen:
            base = [cls + (transfer,) for cls in base for transfer in self.transfers(cls[0])]
        if self.grammars:  # plain first (their ids are the ones a live request's key names), then with a grammar
            base = base + [cls + (NO_TRANSFER,) * (len(cls) == 6) + (GRAMMAR,) for cls in base]
        return base

    def describe(self) -> list[str]:
        per_step = "any number" if self.arrivals_per_step is None else f"at most {self.arrivals_per_step}"
        return [
            f"at most {self.requests} request(s) in the system at once; a finished, rejected or cancelled "
            f"request frees its place, so arrivals can go on forever; {per_step} arrive(s) per iteration",
            f"prompt tokens in {{{_join(self.prompts)}}}, output tokens in {{{_join(self.outputs)}}} "
            f"(declared max output = output), priorities in {{{_join(self.priorities)}}}, {self.tenants} tenant(s)"
            + ("" if self.identities is None else
               f", prompt identities {{{', '.join(map(identity_name, self.identities))}}}"),
            ("a client may cancel any live request before any iteration" if self.cancellations else "no cancellations")
            + f"; iteration k starts at k * {self.step_us / 1000:g} ms; the environment always keeps stepping",
        ] + ([self._describe_transfers()] if self.transfers_chosen else []) + (
            [] if self.accepted is None else
            [f"speculative decoding: before each iteration the verifier's choice, for every request verifying drafts, "
             f"of how many it accepts, in {{{_join(self.accepted)}}} (capped at the drafts scheduled)"]) + (
            [] if not self.grammars else
            ["blocked waiting states: every request class also arrives with a structured-output grammar, blocked in "
             "the scans until the environment chooses, before any iteration, that the grammar is ready (or never)"])

    def _describe_transfers(self) -> str:
        def steps(values) -> str:
            return ", ".join("never" if v is None else str(v) for v in values)
        parts = []
        if self.external is not None:
            parts.append(f"KV connector: an arrival's external hit in {{{', '.join(map(external_name, self.external))}}} "
                         f"token(s) (capped at its prompt), its load reported after {{{steps(self.load_steps or (1,))}}} "
                         "step(s)")
        if self.send_steps is not None:
            parts.append(f"a finished request's send confirmed {{{steps(self.send_steps)}}} step(s) after the step "
                         "following its finish")
        return "; ".join(parts)

    def as_dict(self) -> dict:
        return {"requests_in_flight": self.requests, "prompt_tokens": list(self.prompts),
                "output_tokens": list(self.outputs), "priorities": list(self.priorities), "tenants": self.tenants,
                "cancellations": self.cancellations, "arrivals_per_step": self.arrivals_per_step,
                "step_us": self.step_us,
                **({} if self.identities is None else {"prompt_identities": [identity_token(i) for i in self.identities]}),
                **({} if self.external is None else {"external_tokens": list(map(external_name, self.external))}),
                **{name: list(values) for name, values in (("load_steps", self.load_steps),
                                                           ("send_steps", self.send_steps)) if values is not None},
                **({} if self.accepted is None else {"accepted_drafts": list(self.accepted)}),
                **({"grammars": True} if self.grammars else {})}


def instance_env(policy: Policy, env: LivenessEnv) -> LivenessEnv:
    """The environment as explored: a caching policy's prompts get DEFAULT_IDENTITIES unless chosen; with a KV
    connector that loads, arrivals get external hits (default: none, the first block, the whole prompt) and load
    latencies 1..connector.max_load_steps (and never, with transfers_may_hang) unless chosen; on a node that pins
    finished requests, sends of 0..max_load_steps - 1 steps (and never) after the step following the finish."""
    if policy.kv.prefix_caching.enabled and env.identities is None:
        env = replace(env, identities=DEFAULT_IDENTITIES)
    con = policy.connector
    latencies = tuple(range(1, con.max_load_steps + 1)) + ((None,) if con.transfers_may_hang else ())
    if con.loads:
        if env.external is None:
            env = replace(env, external=DEFAULT_EXTERNAL[:1] + (policy.kv.block_size,) + DEFAULT_EXTERNAL[1:])
        if env.load_steps is None:
            env = replace(env, load_steps=latencies)
    if con.pins and env.send_steps is None:
        env = replace(env, send_steps=tuple(v - 1 if v is not None else None for v in latencies))
    if policy.speculative.enabled and env.accepted is None:
        env = replace(env, accepted=tuple(range(policy.speculative.num_tokens + 1)))
    if policy.queue.blocked_waiting is not BlockedWaiting.OFF and not env.grammars:
        env = replace(env, grammars=True)
    return env


def make_canon(policy: Policy, env: LivenessEnv) -> Canon:
    return Canon(policy, env.step_us, env.priorities, env.tenants, env.classes())


def _join(values) -> str:
    return ", ".join(map(str, values))


# A choice: the classes that arrive (in arrival order) and the positions (in arrival order among the live
# requests) of the requests the clients cancel; with speculative decoding also the verifier's choice: (position,
# drafts accepted) for each request that verifies drafts in the iteration (Transition.acceptance); with blocked
# waiting states also the positions of the blocked requests whose grammar is ready from this iteration on
# (Transition.readiness; acceptance () without speculative decoding).
Choice = tuple  # (arrivals, cancels), (arrivals, cancels, acceptance) or (arrivals, cancels, acceptance, ready)


def make_ready(s: SchedulerState, ready) -> None:
    """The environment's readiness choice: the grammars of the blocked requests at these live positions (the
    representative's rids) are ready in the coming step's scan (checker.semantics.blocked reads s.blocked)."""
    for i in ready:
        s.blocked[i] = s.step


def offer(s: SchedulerState, accepted: dict[int, int]) -> None:
    """The verifier accepts ``accepted[rid]`` of the drafts request rid verifies in the coming step: the entry of what
    checker.semantics.speculative.accepted reads at its next verifying step (a log's fed counts, as check-log feeds
    them)."""
    fed, verified = s.spec.fed, s.spec.verified
    for rid, a in accepted.items():
        fed[rid] = [0] * verified.get(rid, 0) + [a]


class Label(NamedTuple):  # immutable; a tuple, cheap to build and to send between processes
    tokens: int  # tokens scheduled in the iteration
    finished: bool  # a request finished
    cancelled: bool  # the environment cancelled a request
    gone: int  # bit i: the i-th live request of the source (arrival order) is finished/rejected/cancelled after it
    choice: Choice


@dataclass
class StateGraph:
    graph: nx.DiGraph
    canon: Canon
    env: LivenessEnv
    keys: list[tuple]  # canonical key per node id
    depth: list[int]  # BFS depth (iterations from the empty system)
    parent: list[tuple[int, Choice] | None]  # BFS tree: the node and choice that first reached each node
    complete: bool  # every reachable state was expanded
    seconds: float
    stop_reason: str = ""
    edges: int = 0
    choices_run: int = 0  # environment choices applied (one per state and choice)
    steps_run: int = 0  # schedules run (phases 5-6 of the step; the other choices' came from the memo)
    hit_choices: int = 0  # of the choices, those whose iteration adopted a prefix-cache hit
    found_choices: int = 0  # of the choices, those in whose iteration an admission lookup found a cached prefix

    @property
    def states(self) -> int:
        return len(self.keys)

    def summary(self) -> dict:
        """The graph's size, as reports and lasso files store it (with the cache: the iterations with a hit)."""
        cache = {"cache_found_transitions": self.found_choices, "cache_hit_transitions": self.hit_choices} \
            if self.canon.cache else {}
        return {"states": self.states, "edges": self.edges, "generated": self.choices_run,
                "seconds": round(self.seconds, 3), "complete": self.complete, **cache}

    def live_count(self, node: int) -> int:
        return self.keys[node][0]

    def path_to(self, node: int) -> list[tuple[int, Choice]]:
        """The BFS path from the empty system: (source node, choice) per iteration."""
        steps = []
        while (entry := self.parent[node]) is not None:
            steps.append(entry)
            node = entry[0]
        return steps[::-1]


class Cut(Exception):
    """successors() stopped at a limit ("time" or "states"): explore() ends the graph there, cut."""


class Transition:
    """Applies environment choices and one step to a decoded key: the single step function, on copies of a
    representative state.

    Phases 5-6 of the step (schedule, complete) are memoized by the canonical key of the state after phases
    1-4 (release, arrive, cancel, expire): equal keys have the same future, and phases 5-6 read only the
    state (checker.semantics.step.step_schedule), so many choices, from many states, share one schedule
    (``memo=False`` runs every step whole: tests/unit/test_liveness.py checks both give the same graph)."""

    def __init__(self, canon: Canon, env: LivenessEnv, memo: bool = True):
        self.canon = canon
        self.env = env
        self.class_ids = [canon.class_id(c) for c in env.classes()]
        self.choices_run = 0  # environment choices applied (phases 1-4 of a step each)
        self.steps_run = 0  # schedules run (phases 5-6; the others came from the memo)
        self.hit_choices = 0  # choices whose iteration adopted a prefix-cache hit
        self.found_choices = 0  # choices in whose iteration an admission lookup found a cached prefix
        self._specs: dict[tuple[int, int, int], RequestSpec] = {}  # (number, arrival, class) -> spec
        self._memo: dict[tuple, tuple] | None = {} if memo else None
        self._expires = canon.policy.timeouts.queue_timeout_ms is not None  # phase 4 may reject a waiting request
        # speculative decoding: the verifier's acceptance counts the environment chooses from (None: off)
        self.accepted = env.accepted if canon.policy.speculative.enabled else None
        self.deadline: float | None = None  # time.monotonic() past which successors() stops (explore's --timeout)
        self.max_states: int | None = None  # successors of one state past which successors() stops (--max-states)

    def _within_limits(self, found: int) -> None:
        """Raise Cut when the time limit has passed, or one state's successors alone pass the state limit (one
        state of a large instance has millions of choices: explore() checks its limits between states)."""
        if self.deadline is not None and time.monotonic() > self.deadline:
            raise Cut("time")
        if self.max_states is not None and found > self.max_states:
            raise Cut("states")

    def _spec(self, rid: int, now: int, cid: int) -> RequestSpec:
        spec = self._specs.get((rid, now, cid))
        if spec is None:
            spec = self._specs[rid, now, cid] = self.canon.spec(rid, now, cid, cid)
        return spec

    def _stepped(self, base: SchedulerState, now: int, choice: Choice) -> tuple[SchedulerState, StepDecision]:
        """A copy of ``base`` after the choice's arrivals and cancels and one step at ``now``."""
        s = base.copy()
        requests = s.requests
        arrivals = [Request(self._spec(len(requests) + k, now, cid)) for k, cid in enumerate(choice[0])]
        requests += arrivals
        if len(choice) > 2 and choice[2]:  # the verifier's choices (Transition.acceptance), by live position: the
            offer(s, dict(choice[2]))  # representative's rid
        if len(choice) > 3:  # the readiness choice (Transition.readiness)
            make_ready(s, choice[3])
        found = ObservedPool.found
        d = step(s, arrivals, [requests[i] for i in choice[1]], now)
        self.choices_run += 1
        self.steps_run += 1
        self.hit_choices += bool(d.cache_hits)
        self.found_choices += ObservedPool.found > found
        return s, d

    def apply(self, key: tuple, choice: Choice) -> tuple[SchedulerState, StepDecision, int]:
        s, now = self.canon.decode(key)
        s, d = self._stepped(s, now, choice)
        return s, d, now + self.canon.step_us

    def _limits(self, key: tuple) -> tuple[int, list[tuple[int, ...]]]:
        """The most requests that may arrive in a state, and the sets of live positions clients may cancel."""
        live = key[0]
        holding = holding_count(key, self.canon.timed)
        free = self.env.requests - live - holding
        limit = free if self.env.arrivals_per_step is None else min(free, self.env.arrivals_per_step)
        if self.env.cancellations and live:
            cancel_options = [c for n in range(live + 1) for c in itertools.combinations(range(live), n)]
        else:
            cancel_options = [()]
        return limit, cancel_options

    def choices(self, key: tuple) -> tuple[list[tuple[int, ...]], list[tuple[int, ...]]]:
        """The environment's options in a state: arrival sequences (shortest first, then in class order),
        and sets of live positions to cancel."""
        limit, cancel_options = self._limits(key)
        return [seq for n in range(limit + 1) for seq in itertools.product(self.class_ids, repeat=n)], cancel_options

    def successors(self, key: tuple) -> dict[tuple, dict[tuple, Label]]:
        """Successor key -> {(tokens > 0, finished, cancelled, gone): label}.

        The choices are stepped as a tree, in the order of choices(): phase 1 (release) once on the decoded
        state; the states after n arrivals are the states after n - 1 arrivals, copied, plus one arrival
        (phase 2 takes arrivals one at a time); phases 3-4 (cancel, expire) on a copy per cancel option,
        skipped when they cannot change anything (no cancels, no queue timeout); phases 5-6 from the memo."""
        if self._memo is None:
            return self._successors_whole(key)
        out: dict[tuple, dict[tuple, Label]] = {}
        base, now = self.canon.decode(key)
        for ready, ready_base in self.readiness(base):
            self._successors_memo(key, ready_base, now, ready, out)
        return out

    def readiness(self, base: SchedulerState) -> list[tuple[tuple[int, ...] | None, SchedulerState]]:
        """The environment's readiness choices in a decoded state (blocked waiting states): each set of its blocked
        requests' live positions whose grammar becomes ready now (the empty set first: they all stay blocked), with a
        copy of ``base`` where it is applied (make_ready); without blocked waiting states [(None, base)]."""
        if base.blocked is None:
            return [(None, base)]
        blocked_now = sorted(base.blocked)
        out = []
        for n in range(len(blocked_now) + 1):
            for ready in itertools.combinations(blocked_now, n):
                c = base.copy() if ready else base
                make_ready(c, ready)
                out.append((ready, c))
        return out

    def _successors_memo(self, key: tuple, base: SchedulerState, now: int, ready: tuple[int, ...] | None,
                         out: dict[tuple, dict[tuple, Label]]) -> None:
        """successors() for one readiness choice (``ready``, applied to ``base``), into ``out``."""
        live = key[0]
        everyone = (1 << live) - 1
        limit, cancel_options = self._limits(key)
        encode = self.canon.encode
        next_now = now + self.canon.step_us
        first_new = len(base.requests)
        memo = self._memo
        class_ids = self.class_ids
        events = DecisionBuilder()  # phases 1-2 write their events here; nothing reads them (the labels come from
        # the state and phases 5-6, which get a builder of their own)
        release_phase(base, events)
        plain = cancel_options == [()] and not self._expires  # phases 3-4 leave every state as it is
        # the spec of the n-th arrival of each class (spec.cls is the class id)
        table = [[self._spec(first_new + n, now, cid) for cid in class_ids] for n in range(limit)]
        self.choices_run += sum(len(class_ids) ** n for n in range(limit + 1)) * len(cancel_options)
        level: list[tuple[tuple[int, ...], SchedulerState]] = [((), base)]
        adopted_n = found_n = 0  # choices with a prefix-cache hit adopted, found
        accepting, extra = self.accepted is not None, 0
        for n in range(limit + 1):
            last = n == limit
            following: list[tuple[tuple[int, ...], SchedulerState]] = []
            for arrived, s in level:
                self._within_limits(len(out))
                for cancelled in cancel_options:
                    if plain:
                        t = s
                        left = False
                    else:
                        t = s.copy()
                        requests = t.requests
                        leave_phase(t, [requests[i] for i in cancelled], now, DecisionBuilder())
                        gone_before = [requests[i].status in TERMINAL_STATUSES for i in range(live)]
                        left = True in gone_before  # a live request of the source left in phases 3-4
                    mid = encode(t, now)
                    outcomes = memo.get(mid)
                    if outcomes is None:
                        if t is s and not last:
                            t = s.copy()  # s has arrivals to come
                        outcomes = memo[mid] = self._schedule(t, now, next_now)
                    if accepting:  # each acceptance choice is a choice of its own
                        extra += len(outcomes) - 1
                    if left:  # source positions -> positions after phases 1-4 (the requests that stayed, in order)
                        stayed = [i for i in range(live) if not gone_before[i]]
                    for acc, succ, tokens, finished, gone_mid, adopted, found_hit in outcomes:
                        adopted_n += adopted
                        found_n += found_hit
                        if left:
                            gone = 0
                            for i in range(live):
                                if gone_before[i]:
                                    gone |= 1 << i
                            for j, i in enumerate(stayed):
                                if gone_mid >> j & 1:
                                    gone |= 1 << i
                        else:  # the source's live requests are the first ones after phases 1-4
                            gone = gone_mid & everyone
                        core = (tokens > 0, finished, bool(cancelled), gone)
                        labels = out.get(succ)
                        if labels is None:
                            labels = out[succ] = {}
                        if core not in labels:
                            if acc is None:
                                choice = (arrived, cancelled)
                            else:  # mid positions -> source positions (a request holding drafts is no arrival)
                                choice = (arrived, cancelled,
                                          tuple((stayed[j] if left else j, a) for j, a in acc))
                            if ready is not None:
                                choice = choice + ((),) * (len(choice) == 2) + (ready,)
                            labels[core] = Label(tokens, finished, core[2], gone, choice)
                if not last:
                    for cid, spec in zip(class_ids, table[n]):
                        c = s.copy()
                        r = Request(spec)
                        c.requests.append(r)
                        arrive_phase(c, [r], events)
                        following.append((arrived + (cid,), c))
            level = following
        self.hit_choices += adopted_n
        self.found_choices += found_n
        self.choices_run += extra

    def _schedule(self, t: SchedulerState, now: int, next_now: int) -> tuple[tuple, ...]:
        """Phases 5-6 of the step on the state after phases 1-4 (``t``, stepped in place), once per acceptance
        choice (``acceptance``): the outcomes (acceptance as (position after phases 1-4, accepted) pairs, or None
        without speculative decoding; successor key, tokens scheduled, a finish, the requests of t gone (bits by
        position), a cache hit adopted, one found)."""
        if self.accepted is None:
            return (self._outcome(t, now, next_now, None),)
        return tuple(self._outcome(c, now, next_now, acc)
                     for acc, c in self.acceptance(t, lambda c: step_schedule(c, now, DecisionBuilder())))

    def _outcome(self, t: SchedulerState, now: int, next_now: int, acc) -> tuple:
        mid_live = [r for r in t.requests if r.status in LIVE_STATUSES]
        found = ObservedPool.found
        d = step_schedule(t, now, DecisionBuilder())
        self.steps_run += 1
        gone_mid = 0
        for j, r in enumerate(mid_live):
            if r.status in TERMINAL_STATUSES:
                gone_mid |= 1 << j
        return (acc, self.canon.encode(t, next_now), d.num_scheduled_tokens, bool(d.finished), gone_mid,
                bool(d.cache_hits), ObservedPool.found > found)

    def acceptance(self, t: SchedulerState, run) -> list[tuple[tuple[tuple[int, int], ...], SchedulerState]]:
        """The environment's acceptance choices in a state about to be scheduled (``run(c)`` runs what follows on a
        copy ``c``): for each live request holding drafts, how many of them the verifier accepts, among
        ``env.accepted`` (capped at the drafts it holds: the verifier accepts at most those scheduled). Which
        requests verify does not depend on the choice (phase 5 reads none of it), so one probe with the first
        option each finds them, and only their options are enumerated. Returns (choice as (live position, accepted)
        pairs of the requests that verify, a copy of ``t`` with the choice offered), the probe's first, in the
        order of itertools.product; the copies are not stepped."""
        live = [r for r in t.requests if r.status in LIVE_STATUSES]
        drafts, verified = t.spec.drafts, t.spec.verified
        options = []  # (position, rid, accepted counts) of the live requests holding drafts
        for j, r in enumerate(live):
            held = drafts.get(r.rid, 0)
            if held:
                options.append((j, r.rid, sorted({min(a, held) for a in self.accepted})))
        first = t.copy()
        offer(first, {rid: values[0] for _, rid, values in options})
        probe = first.copy()
        run(probe)
        options = [o for o in options if probe.spec.verified.get(o[1], 0) > verified.get(o[1], 0)]
        out = []
        for combo in itertools.product(*(values for _, _, values in options)):
            acc = tuple((j, a) for (j, _, _), a in zip(options, combo))
            if not out:
                out.append((acc, first))
                continue
            c = t.copy()
            offer(c, {rid: a for (_, rid, _), a in zip(options, combo)})
            out.append((acc, c))
        return out

    def _successors_whole(self, key: tuple) -> dict[tuple, dict[tuple, Label]]:
        """successors() without the memo: one whole step per choice."""
        live = key[0]
        arrival_options, cancel_options = self.choices(key)
        out: dict[tuple, dict[tuple, Label]] = {}
        base, now = self.canon.decode(key)
        next_now = now + self.canon.step_us
        readiness = [ready for ready, _ in self.readiness(base)]  # outermost, as successors() takes them
        for ready, arriving in itertools.product(readiness, arrival_options):
            self._within_limits(len(out))
            for cancelled in cancel_options:
                for choice in self._accepting(base, now, (arriving, cancelled), ready):
                    s, d = self._stepped(base, now, choice)
                    succ = self.canon.encode(s, next_now)
                    gone = 0
                    for i in range(live):
                        if s.requests[i].status in TERMINAL_STATUSES:
                            gone |= 1 << i
                    tokens = d.num_scheduled_tokens
                    core = (tokens > 0, bool(d.finished), bool(cancelled), gone)
                    labels = out.setdefault(succ, {})
                    if core not in labels:
                        labels[core] = Label(tokens, core[1], core[2], gone, choice)
        return out

    def _accepting(self, base: SchedulerState, now: int, choice: Choice, ready=None) -> list[Choice]:
        """The choice with each of the environment's acceptance choices (without speculative decoding: itself), and
        the readiness choice ``ready`` (blocked waiting states; None: none)."""
        if ready is not None:
            base = base.copy()
            make_ready(base, ready)
            return [c + ((),) * (len(c) == 2) + (ready,) for c in self._accepting(base, now, choice)]
        if self.accepted is None:
            return [choice]
        arriving, cancelled = choice
        requests = base.requests
        events = (lambda c: step(c, [c.requests[len(requests) + k] for k in range(len(arriving))],
                                 [c.requests[i] for i in cancelled], now))
        with_arrivals = base.copy()
        with_arrivals.requests += [Request(self._spec(len(requests) + k, now, cid)) for k, cid in enumerate(arriving)]
        return [(arriving, cancelled, acc) for acc, _ in self.acceptance(with_arrivals, events)]


def initial_key(canon: Canon, env: LivenessEnv) -> tuple:
    return canon.encode(SchedulerState(canon.policy, [], num_tenants=env.tenants), 0)


def explore(policy: Policy, env: LivenessEnv, max_states: int = DEFAULT_MAX_STATES, timeout_s: float = 60.0,
            progress=None, memo: bool = True, workers: int = 1) -> StateGraph:
    """Breadth-first enumeration of the reachable canonical states (so BFS paths are shortest prefixes). The
    edges are collected in adjacency dicts that become the networkx graph at the end.

    ``workers`` > 1: the successors of each BFS level are computed by that many forked processes (each with its
    own memo), a chunk of the level at a time, and merged here in the level's order: the same graph, node
    numbers and BFS tree as one process (the state limit is applied while merging, so it cuts at the same
    state; a time limit cuts wherever the clock says)."""
    if policy.scheduler is Scheduler.SGLANG:
        _sglang_supported(policy)
    if policy.pipeline.in_flight > 1:  # the policy refuses it too; one built without validation is refused here
        raise InputError(Problem("pipeline.in_flight", policy.pipeline.in_flight, "0 or 1 for the liveness explorer: "
                                 "pipeline parallelism (more than one batch in flight) is not modelled yet "
                                 "(docs/liveness.md, \"Speculative decoding and async scheduling\")"))
    refuse_unmodelled(policy)  # failed loads are not environment choices (grammar delays are)
    started = time.monotonic()
    env = instance_env(policy, env)
    canon = make_canon(policy, env)
    trans = Transition(canon, env, memo)
    trans.deadline, trans.max_states = started + timeout_s, max_states
    first = initial_key(canon, env)
    ids = {first: 0}
    keys, depth, parent = [first], [0], [None]
    succ: list[dict[int, dict]] = [{}]  # per node: successor -> edge data, in the order found
    pred: list[dict[int, dict]] = [{}]  # per node: predecessor -> the same edge data
    edges = [0]
    stop = ""
    deadline = started + timeout_s
    counts = [0, 0, 0, 0]  # choices, schedules, choices with a cache hit adopted, found: run in worker processes

    def merge(u: int, successors: dict[tuple, dict[tuple, Label]], discovered: list[int]) -> None:
        out = succ[u]
        for key, labels in successors.items():
            v = ids.get(key)
            if v is None:
                v = ids[key] = len(keys)
                keys.append(key)
                depth.append(depth[u] + 1)
                parent.append((u, next(iter(labels.values())).choice))
                succ.append({})
                pred.append({})
                discovered.append(v)
            out[v] = pred[v][u] = {"labels": tuple(labels.values())}
        edges[0] += len(successors)

    def expansions(level: list[int]):
        """(node, its successors) for the nodes of a BFS level, in order."""
        if workers <= 1:
            for u in level:
                yield u, trans.successors(keys[u])
            return
        chunk = max(16, min(256, len(level) // (4 * workers) + 1))
        parts = [level[i:i + chunk] for i in range(0, len(level), chunk)]
        for part, (results, *numbers) in zip(parts, pool.imap(_expand, [[keys[u] for u in part] for part in parts])):
            for i, n in enumerate(numbers):
                counts[i] += n
            yield from zip(part, results)

    pool = _worker_pool(workers, policy, env, memo, trans.deadline, max_states) if workers > 1 else None
    level = [0]
    collecting = gc.isenabled()
    gc.disable()  # the explorer makes no reference cycles; the collector would walk the growing graph again and again
    try:
        try:
            while level and not stop:
                discovered: list[int] = []
                for u, successors in expansions(level):
                    if len(keys) >= max_states:
                        stop = f"state limit ({max_states:,}) reached"
                        break
                    if time.monotonic() > deadline:
                        stop = f"time limit ({timeout_s:g} s) reached"
                        break
                    merge(u, successors, discovered)
                    if progress is not None and u % 5000 == 0:
                        progress(f"{len(keys):,} states, {edges[0]:,} edges")
                if not stop:
                    level = discovered
        except Cut as cut:  # one state's successors alone ran past a limit: the graph ends before that state
            stop = f"time limit ({timeout_s:g} s) reached" if cut.args[0] == "time" else \
                f"state limit ({max_states:,}) reached"
        graph = _digraph(succ, pred)
    finally:
        if collecting:
            gc.enable()
        if pool is not None:
            pool.terminate()
    return StateGraph(graph, canon, env, keys, depth, parent, complete=not stop,
                      seconds=time.monotonic() - started, stop_reason=stop, edges=edges[0],
                      choices_run=trans.choices_run + counts[0], steps_run=trans.steps_run + counts[1],
                      hit_choices=trans.hit_choices + counts[2], found_choices=trans.found_choices + counts[3])


def refuse_unmodelled(policy: Policy, source: str | None = None) -> None:
    """checker.semantics.blocked.refuse for the explorer, which covers blocked waiting states (the grammar delay is
    the environment's readiness choice): only loads that may fail are refused (connector.loads_may_fail)."""
    blocked.refuse(policy, "the liveness explorer", source, encoded=True)


def _sglang_supported(policy: Policy) -> None:
    """Under SGLang's rules the key's SGLang section follows the tenant counters directly: the block pool's content
    and the connector's section are not combined with it. Policy validation refuses both under scheduler sglang
    (checker.policy.SGLANG_UNREAD); a policy built without validation is refused here by the field."""
    for field, on in (("kv.prefix_caching.enabled", policy.kv.prefix_caching.enabled),
                      ("connector.kind", policy.connector.enabled)):
        if on:
            kind = policy.connector.kind
            value = True if field.startswith("kv") else getattr(kind, "value", kind)
            raise InputError(Problem(field, value, "false / none when scheduler is sglang: the liveness explorer's "
                                     "SGLang key (checker/liveness/canon.py) has no block pool content or KV "
                                     "connector section"))
    if policy.sglang.radix_cache:
        raise InputError(Problem("sglang.radix_cache", True, "false for the liveness explorer: its SGLang key "
                                 "(checker/liveness/canon.py) has no radix tree (its nodes, locks and access order) "
                                 "yet; verify's explicit-state search, simulate, fuzz and check-log run the engine "
                                 "with it"))


def _digraph(succ: list[dict[int, dict]], pred: list[dict[int, dict]]) -> nx.DiGraph:
    """The networkx DiGraph of nodes 0..n-1 with these adjacency dicts, handed over as its own (the graph
    add_edges_from would build from the edges in the order found, with the same node, successor and
    predecessor orders; tests/unit/test_liveness.py checks it). add_edges_from would take three times as
    long: about 5 s of a one-minute exploration with a million edges."""
    graph = nx.DiGraph()
    graph._node = {u: {} for u in range(len(succ))}
    graph._succ = graph._adj = dict(enumerate(succ))
    graph._pred = dict(enumerate(pred))
    return graph


_WORKER: Transition | None = None  # the Transition of a worker process


def _worker_pool(workers: int, policy: Policy, env: LivenessEnv, memo: bool, deadline: float, max_states: int):
    import multiprocessing

    return multiprocessing.get_context("fork").Pool(workers, _start_worker,
                                                    (policy, env, memo, deadline, max_states, os.getpid()))


def _start_worker(policy: Policy, env: LivenessEnv, memo: bool, deadline: float, max_states: int,
                  parent: int) -> None:
    """A worker leaves Ctrl-C to the parent (which stops the pool: exit 130) and dies with it (a SIGKILLed
    parent cannot stop it)."""
    global _WORKER
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    die_with_parent(parent)
    gc.disable()  # as in explore(): no reference cycles
    _WORKER = Transition(make_canon(policy, env), env, memo)
    _WORKER.deadline, _WORKER.max_states = deadline, max_states


def _expand(batch: list[tuple]) -> tuple[list[dict[tuple, dict[tuple, Label]]], int, int, int, int]:
    """In a worker: the successors of a chunk of keys, and the choices, schedules, and choices with a cache hit
    adopted and found, it took."""
    trans = _WORKER
    before = (trans.choices_run, trans.steps_run, trans.hit_choices, trans.found_choices)
    results = [trans.successors(key) for key in batch]
    after = (trans.choices_run, trans.steps_run, trans.hit_choices, trans.found_choices)
    return (results, *(a - b for a, b in zip(after, before)))


def live_positions(s: SchedulerState) -> list[int]:
    """Request numbers of the live requests of a state, in arrival order (the order of key positions)."""
    return [r.rid for r in sorted((r for r in s.requests if r.status in LIVE), key=lambda r: (r.arrival_us, r.rid))]
