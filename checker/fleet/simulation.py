"""The fleet simulation: one global event loop in time over the replicas, the router, the clients and the faults.

Each replica is a scheduler state stepped by the one step (checker.semantics.step.step), its iteration times
from its own profile, exactly as the reference engine steps one (checker/engine.py: a step that schedules tokens
takes ``profile.step_us``; a quiet replica sleeps until its next internal event, ``engine._wake_time``, or until
the router sends it a request). A 1-replica fleet with no faults and clients that never time out or retry runs
every request exactly as ``checker.engine.simulate`` does (tests/unit/test_fleet_simulation.py).

Events at one time go in this order: what a step reported (first tokens, finishes), faults, client timeouts and
cancels, arrivals and retries, transfers completed (disaggregated pools); then the replicas whose next step
is due, by index. What a replica's step
produces is seen by the router and the clients at the end of the step (its first tokens and finishes), its
rejections at its start (as RequestTimes records them).

Every send to the router is an attempt: a request's first attempt, a client's retry (a new arrival, counted apart)
or a re-route of a request on a lost replica (rule ``reroute``). A request's TTFT and end-to-end time are taken
from its first arrival to its first token / finish in whichever attempt produced them.

Disaggregated pools (docs/fleet.md): an attempt is a prefill leg on a prefill replica (one output token, its blocks
pinned by the prefill_node connector once it finishes); ``transfer_ms`` after its first token the prefill replica's
connector reports the send confirmed and the fleet sends the request's decode leg (not an attempt offered by a
client) to a decode replica, where the decode_node connector admits it as a load of its prompt.
"""

from __future__ import annotations

import gc
import heapq
import random
import time
from bisect import bisect_left
from dataclasses import dataclass, field, replace
from itertools import accumulate

from checker.engine import LIVELOCK_SLACK_TOKENS, _livelock_limit, _next_internal_event, _wake_time
from checker.fastforward import (apply_stretch, finish_stretch, finishing_step, may_finish_in_stretch,
                                 next_steps_are_quiet_decodes, stretch_durations)
from checker.fleet import canary
from checker.fleet.clients import NO_RETRY_CLIENT, Budget, backoff_us, client_of_class
from checker.fleet.faults import FaultEvent, SlowWindows, fault_events, us
from checker.fleet.router import Router
from checker.fleet.spec import LoadedFleet, LostFault, LostRule, OnFailure, Strategy, TransferRange
from checker.metrics import UNSET, RequestTimes
from checker.requests import GREEDY_OUTPUT_TOKEN, RequestSpec
from checker.semantics.kv import blocks_for
from checker.semantics.state import TERMINAL, Reason, Request, SchedulerState
from checker.semantics.step import step
from checker.semantics.transfer import steps_pending
from checker.traces import RequestSet

DEFAULT_MAX_STEPS = 5_000_000

# event kinds, in the order they go at one time (_TRANSFER: disaggregated pools only)
_REPORT, _FAULT, _TIMEOUT, _CANCEL, _SEND, _TRANSFER = range(6)
FIRST, RETRY, REROUTE = "first", "retry", "reroute"
DECODE = "decode"  # disaggregated pools: a request's decode leg, sent by the fleet after its transfer (not offered)


class _NoClock:
    """A replica has no arrivals of its own: the router sends them (engine._wake_time reads next_time)."""

    @staticmethod
    def next_time() -> None:
        return None


@dataclass
class Attempt:
    index: int
    request: int  # index of the request (RequestSet.specs)
    kind: str  # FIRST, RETRY or REROUTE
    sent_us: int
    replica: int = -1  # -1: no replica to send it to
    incarnation: int = 0
    rid: int = -1  # its rid on the replica
    first_token_us: int | None = None  # as the client saw it
    end_us: int | None = None
    outcome: str | None = None  # finished, rejected:<reason>, replica_lost, no_replica, timeout, cancelled,
    # transferred (a prefill leg whose first token went on to a decode replica)


@dataclass
class RequestRecord:
    index: int  # in RequestSet.specs
    spec: RequestSpec
    client: int
    attempts: list[int] = field(default_factory=list)
    retries: int = 0
    reroutes: int = 0
    first_token_us: int | None = None
    done_us: int | None = None
    outcome: str | None = None  # finished, cancelled, or why it was lost (None at the end: unfinished)
    budget_denied: bool = False  # a retry it would have made was refused by a budget

    @property
    def live(self) -> int | None:
        return self.attempts[-1] if self.attempts else None


class Incarnation:
    """One life of a replica (a lost replica that recovers starts a new one, empty)."""

    def __init__(self, policy, num_tenants: int):
        self.state = SchedulerState(policy, [], num_tenants=num_tenants)
        self.times = RequestTimes(0)
        self.attempt_of: list[int] = []  # rid -> attempt index


class Node:
    """A replica as the loop drives it."""

    def __init__(self, index: int, name: str, policy, profile, num_tenants: int):
        self.index, self.name, self.policy, self.profile = index, name, policy, profile
        self.num_tenants = num_tenants
        self.lives = [Incarnation(policy, num_tenants)]
        self.up = True  # running (False from its loss to its recovery)
        self.routable = True  # the router sends it requests (False from the loss's detection to the recovery)
        self.inbox: list[Request] = []
        self.cancels: list[Request] = []
        self.clock = 0
        self.next_us: int | None = None  # when its next step is due (None: asleep until something arrives)
        self.sleeping = True
        self.quiet_since: int | None = None
        self.unfinished = 0  # its requests not yet finished, rejected or cancelled (inbox included)
        self.stall_tokens, self.stall_limit = 0, LIVELOCK_SLACK_TOKENS
        self.livelock = False
        self.steps = self.busy_us = self.kv_peak = 0
        self.stretch: list[int] | None = None  # a quiet decode stretch not yet applied: its steps' starts and end
        self.stretch_finishes = False  # its last step finishes requests (fastforward.finish_stretch)

    @property
    def life(self) -> Incarnation:
        return self.lives[-1]

    def add(self, spec_of: RequestSpec, attempt: int, now: int) -> Request:
        life = self.life
        rid = len(life.state.requests)
        r = Request(RequestSpec(rid, now, spec_of.prompt_len, spec_of.output_len, spec_of.max_output,
                                spec_of.priority, spec_of.tenant, spec_of.cls, None, spec_of.content,
                                spec_of.external_tokens, spec_of.load_steps, spec_of.send_steps, spec_of.ignore_eos))
        life.state.requests.append(r)
        life.attempt_of.append(attempt)
        t = life.times
        for slot in RequestTimes.__slots__:
            getattr(t, slot).append(UNSET if slot in ("first_scheduled", "first_token", "last_token", "done") else 0)
        self.inbox.append(r)
        self.unfinished += 1
        self.wake(now)
        return r

    def wake(self, now: int) -> None:
        """Something arrived for it at ``now``: a sleeping replica steps then, but not before its last step ended."""
        if self.sleeping and not self.livelock:
            self.next_us = max(self.clock, now if self.next_us is None else min(self.next_us, now))

    def kv_share(self) -> float:
        return self.life.state.kv_used / self.policy.kv.num_blocks


@dataclass
class FleetResult:
    fleet: LoadedFleet
    requests: RequestSet
    records: list[RequestRecord]
    attempts: list[Attempt]
    nodes: list[Node]
    fault_times: list[tuple[int, int]]  # (fault index, when it began)
    end_us: int
    steps: int
    wall_s: float
    step_limit_hit: bool = False
    arms: list[bool] | None = None  # per request: in the canary arm (None: no canary)


class _Run:
    def __init__(self, fleet: LoadedFleet, requests: RequestSet, max_steps: int, fast_forward: bool = True):
        spec = fleet.spec
        self.fleet, self.requests, self.max_steps = fleet, requests, max_steps
        # quiet decode stretches in one go (the router's view of KV load changes at every step of one: not then)
        self.fast = fast_forward and spec.router.strategy is not Strategy.LEAST_KV_LOAD
        self.reserved = 0  # steps of the stretches planned and not yet applied (within max_steps with the rest)
        n_tenants = len(requests.tenant_names)
        self.nodes = [Node(i, r.name, r.policy, r.profile, n_tenants) for i, r in enumerate(fleet.replicas)]
        self.index = {r.name: i for i, r in enumerate(fleet.replicas)}
        self.router = Router(spec.router, len(self.nodes))
        self.slow = SlowWindows(spec.faults, self.index, len(self.nodes))
        self.clients = list(spec.clients)
        owner = client_of_class(self.clients, requests.class_names)
        self.client_budgets = [Budget(c.budget) for c in self.clients]
        self.global_budget = Budget(spec.global_retry_budget)
        self.records = [RequestRecord(i, s, owner[s.cls] if s.cls < len(owner) else -1)
                        for i, s in enumerate(requests.specs)]
        self.attempts: list[Attempt] = []
        self.heap: list[tuple] = []
        self.seq = 0
        self.steps = 0
        self.fault_times: list[tuple[int, int]] = []
        self.arms = canary.arms(fleet, requests.specs) if spec.canary is not None else None
        self.canary_nodes = canary.canary_replicas(fleet) if spec.canary is not None else set()
        pools = spec.pools
        self.disagg = pools.kind == "disaggregated"
        self.prefill_nodes = {i for i, r in enumerate(fleet.replicas) if self.disagg and r.group in pools.prefill}
        self.lost_rule = {self.index[f.replica]: f.rule for f in spec.faults if isinstance(f, LostFault)}
        for i, s in enumerate(requests.specs):
            self.push(s.arrival_us, _SEND, ("request", i))
            if s.cancel_us is not None:
                self.push(s.cancel_us, _CANCEL, i)
        for e in fault_events(spec.faults, self.index):
            self.push(e.t_us, _FAULT, e)

    def push(self, t: int, kind: int, payload) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, kind, self.seq, payload))

    def client(self, rec: RequestRecord):
        return self.clients[rec.client] if rec.client >= 0 else NO_RETRY_CLIENT

    # ------------------------------------------------------------------------------------- the loop
    def run(self) -> FleetResult:
        started = time.perf_counter()
        now = 0
        limit_hit = False
        nodes = self.nodes
        while True:
            due = [n.next_us for n in nodes if n.next_us is not None]
            t_node = min(due) if due else None
            if self.heap and (t_node is None or self.heap[0][0] <= t_node):
                t, kind, _, payload = heapq.heappop(self.heap)
                now = t
                self.event(t, kind, payload)
                continue
            if t_node is None:
                break
            node = next(n for n in nodes if n.next_us == t_node)
            if node.stretch is not None:  # the start of its last step: the whole stretch, as plain stepping
                now = t_node
                self.complete_stretch(node)
                continue
            if self.steps + self.reserved >= self.max_steps:  # the steps of planned stretches count
                limit_hit = True
                break
            now = t_node
            self.step_node(node, t_node)
        for rec in self.records:  # an attempt still live here is stuck (or was cut off by the step limit)
            if rec.outcome is None and rec.live is not None and self.attempts[rec.live].outcome is None:
                self.attempts[rec.live].outcome = "unfinished"
        return FleetResult(self.fleet, self.requests, self.records, self.attempts, nodes, self.fault_times,
                           max([now] + [n.clock for n in nodes]), self.steps, time.perf_counter() - started,
                           limit_hit, self.arms)

    def event(self, t: int, kind: int, payload) -> None:
        if kind == _REPORT:
            what, a = payload
            att = self.attempts[a]
            if att.outcome is not None:
                return  # the client had given up on it, or its replica was lost, before the step ended
            rec = self.records[att.request]
            if what == "first":
                att.first_token_us = t
                if rec.first_token_us is None:
                    rec.first_token_us = t
            elif self.disagg and att.kind != DECODE and rec.spec.output_len > 1:
                self.end_attempt(att, t, "transferred")
                self.push(t + self.transfer_us(rec, a), _TRANSFER, a)
            else:
                self.end_attempt(att, t, "finished")
                rec.outcome, rec.done_us = "finished", t
        elif kind == _FAULT:
            self.fault(t, payload)
        elif kind == _TIMEOUT:
            att = self.attempts[payload]
            if att.outcome is None and att.first_token_us is None:
                self.cancel_on_replica(att, t)
                self.end_attempt(att, t, "timeout")
                self.failed(self.records[att.request], t, "timeout", self.client(self.records[att.request]).on_timeout)
        elif kind == _CANCEL:
            rec = self.records[payload]
            if rec.outcome is not None:
                return
            if rec.live is not None and self.attempts[rec.live].outcome is None:
                att = self.attempts[rec.live]
                self.cancel_on_replica(att, t)
                self.end_attempt(att, t, "cancelled")
            rec.outcome, rec.done_us = "cancelled", t
        elif kind == _TRANSFER:
            self.transfer_done(t, payload)
        else:
            what, i = payload
            rec = self.records[i]
            if rec.outcome is not None:
                return  # cancelled by its client while it waited to retry
            self.send(rec, i, t, FIRST if what == "request" else what)

    def send(self, rec: RequestRecord, i: int, t: int, kind: str) -> None:
        a = len(self.attempts)
        att = Attempt(a, i, kind, t)
        self.attempts.append(att)
        rec.attempts.append(a)
        if kind == FIRST:
            self.global_budget.sent += 1
            if rec.client >= 0:
                self.client_budgets[rec.client].sent += 1
        candidates = [n.index for n in self.nodes if n.routable and (not self.disagg or n.index in self.prefill_nodes)]
        if self.arms is not None:  # a canary: the request's arm only
            candidates = [r for r in candidates if (r in self.canary_nodes) == self.arms[i]]
        if not self.place(rec, att, candidates, prefill_leg(rec.spec) if self.disagg else rec.spec, t):
            return
        timeout = self.client(rec).timeout_ms
        if timeout is not None:
            self.push(t + us(timeout), _TIMEOUT, a)

    def place(self, rec: RequestRecord, att: Attempt, candidates: list[int], spec: RequestSpec, t: int) -> bool:
        """The router sends the attempt to one of the candidates, where it arrives as ``spec``; False when it
        failed at once (no candidate, or a lost replica the router has not noticed yet)."""
        if not candidates:
            self.end_attempt(att, t, "no_replica")
            self.failed(rec, t, "no_replica", self.client(rec).on_reject)
            return False
        r = self.router.choose(rec.spec.content, candidates, t)
        node = self.nodes[r]
        att.replica, att.incarnation = r, len(node.lives) - 1
        if not node.up:  # lost, and the router has not noticed yet
            self.end_attempt(att, t, "replica_lost")
            self.failed(rec, t, "replica_lost", self.client(rec).on_reject)
            return False
        self.cut(node, t)
        att.rid = node.add(spec, att.index, t).rid
        self.router.views[r].record(t, node.unfinished, node.kv_share())
        return True

    # ------------------------------------------------------------------------------------- disaggregated pools
    def transfer_us(self, rec: RequestRecord, attempt: int) -> int:
        """The transfer latency of this prefill leg: fixed, or drawn from a stream seeded by (seed, request,
        attempt)."""
        spec = self.fleet.spec.pools.transfer_ms
        if isinstance(spec, TransferRange):
            return us(random.Random(f"{spec.seed}:{rec.index}:{attempt}").uniform(spec.min_ms, spec.max_ms))
        return us(spec)

    def transfer_done(self, t: int, a: int) -> None:
        """A prefill leg's KV reached the decode side: the prefill replica's connector reports the send confirmed
        in the output of its next step (its pinned blocks freed), and the request goes to a decode replica as a
        load of its prompt. A prefill replica lost meanwhile lost the KV: its lost fault's rule applies."""
        att = self.attempts[a]
        rec = self.records[att.request]
        node = self.nodes[att.replica]
        if not node.up or att.incarnation != len(node.lives) - 1:
            if rec.outcome is None:
                self.lost_leg(rec, t, self.lost_rule.get(node.index, LostRule.FAIL))
            return
        self.cut(node, t)
        s = node.life.state
        r = s.requests[att.rid]
        if r in s.holding:
            r.transfer_step = s.step + 1
            node.wake(t)
        if rec.outcome is not None:
            return  # its client cancelled it during the transfer
        d = len(self.attempts)
        datt = Attempt(d, rec.index, DECODE, t)
        self.attempts.append(datt)
        rec.attempts.append(d)
        candidates = [n.index for n in self.nodes if n.routable and n.index not in self.prefill_nodes]
        self.place(rec, datt, candidates, decode_leg(rec.spec), t)

    def lost_leg(self, rec: RequestRecord, t: int, rule: LostRule) -> None:
        """A request's live leg is gone with its replica: re-routed from scratch, or failed (its client decides)."""
        if rule is LostRule.REROUTE:
            rec.reroutes += 1
            self.push(t, _SEND, (REROUTE, rec.index))
        else:
            self.failed(rec, t, "replica_lost", self.client(rec).on_reject)

    def end_attempt(self, att: Attempt, t: int, outcome: str) -> None:
        att.outcome, att.end_us = outcome, t

    def cancel_on_replica(self, att: Attempt, t: int) -> None:
        node = self.nodes[att.replica] if att.replica >= 0 else None
        if node is None or not node.up or att.incarnation != len(node.lives) - 1 or att.rid < 0:
            return
        r = node.life.state.requests[att.rid]
        if r.status not in TERMINAL:
            self.cut(node, t)
            node.cancels.append(r)
            node.wake(t)

    def failed(self, rec: RequestRecord, t: int, why: str, action: OnFailure) -> None:
        """An attempt failed (rejected, lost, timed out): its client retries it, or the request ends lost."""
        client = self.client(rec)
        if action is OnFailure.RETRY and rec.retries < client.max_retries:
            own = self.client_budgets[rec.client] if rec.client >= 0 else None
            if (own is None or own.allows()) and self.global_budget.allows():
                rec.retries += 1
                self.global_budget.retries += 1
                if own is not None:
                    own.retries += 1
                self.push(t + backoff_us(client.backoff, rec.index, rec.retries), _SEND, (RETRY, rec.index))
                return
            rec.budget_denied = True
        rec.outcome, rec.done_us = why, t

    # ------------------------------------------------------------------------------------- faults
    def fault(self, t: int, e: FaultEvent) -> None:
        node = self.nodes[e.replica]
        f = self.fleet.spec.faults[e.fault]
        if e.what == "lost":
            self.fault_times.append((e.fault, t))
            self.lose(node, t, f)
        elif e.what == "detected":
            if not node.up:
                node.routable = False
        elif e.what == "recovered":
            node.lives.append(Incarnation(node.policy, node.num_tenants))
            node.up = node.routable = True
            node.inbox, node.cancels = [], []
            node.unfinished, node.sleeping, node.next_us, node.clock = 0, True, None, t
            node.quiet_since, node.stall_tokens, node.livelock = None, 0, False
            self.router.views[node.index].record(t, 0, 0.0)
            self.slow.warm_up(node.index, t, f)
        elif e.what == "view_lost":
            self.fault_times.append((e.fault, t))
            self.router.frozen[node.index] = t
        elif e.what == "slow":
            self.fault_times.append((e.fault, t))
        else:
            self.router.frozen.pop(node.index, None)

    def lose(self, node: Node, t: int, f: LostFault) -> None:
        self.cut(node, t)
        node.up = False
        node.next_us, node.sleeping = None, True
        node.inbox, node.cancels = [], []
        node.unfinished = 0
        if f.detect_ms == 0:
            node.routable = False
        live = [a for a in node.life.attempt_of if self.attempts[a].outcome is None]
        for a in live:
            att = self.attempts[a]
            self.end_attempt(att, t, "replica_lost")
            self.lost_leg(self.records[att.request], t, f.rule)

    # ------------------------------------------------------------------------------------- a replica's step
    def step_node(self, node: Node, now: int) -> None:
        """One step of one replica: engine._simulate's loop body, for a replica whose arrivals the router sends."""
        life = node.life
        s, reqs, times = life.state, life.state.requests, life.times
        arrived, cancelled = node.inbox, node.cancels
        node.inbox, node.cancels = [], []
        d = step(s, arrived, cancelled, now)
        self.steps += 1
        node.steps += 1
        dt = node.profile.step_us(d) if d.scheduled else 0
        if dt:
            factor = self.slow.factor(node.index, now)
            if factor != 1.0:
                dt = max(1, round(dt * factor))
        firsts = [rid for rid in d.produced if times.first_token[rid] == UNSET]
        times.observe(d, reqs, now, now + dt)
        node.unfinished -= len(d.finished) + len(d.rejected) + len(d.cancelled)
        attempt_of = life.attempt_of
        for rid in firsts:
            self.push(now + dt, _REPORT, ("first", attempt_of[rid]))
        for rid in d.finished:
            self.push(now + dt, _REPORT, ("finished", attempt_of[rid]))
        for rid, reason in d.rejected:
            att = self.attempts[attempt_of[rid]]
            if att.outcome is None:
                why = "rejected:" + Reason(reason).name.lower()
                self.end_attempt(att, now, why)
                rec = self.records[att.request]
                self.failed(rec, now, why, self.client(rec).on_reject)
        node.kv_peak = max(node.kv_peak, d.kv_blocks_used)
        self.router.views[node.index].record(now, node.unfinished, node.kv_share())
        if d.produced or d.rejected or d.cancelled:
            node.stall_tokens = 0
        else:
            node.stall_tokens += max(1, d.num_scheduled_tokens)
            if node.stall_tokens > node.stall_limit:
                node.stall_limit = _livelock_limit(s)
                if node.stall_tokens > node.stall_limit:
                    node.livelock = True
                    node.next_us, node.sleeping = None, True
                    return
        node.clock = now + dt
        node.busy_us += dt
        if not (node.unfinished or s.holding):
            node.next_us, node.sleeping, node.quiet_since = None, True, None
            return
        if not d.is_quiet:
            node.quiet_since = None
            node.next_us, node.sleeping = node.clock, False
            if self.fast and dt and next_steps_are_quiet_decodes(s, d):
                self.plan_stretch(node)
        elif not (s.holding or s.loads_in_flight) or not steps_pending(s):
            node.quiet_since = node.clock if node.quiet_since is None else node.quiet_since
            wake = _wake_time(s, _NoClock, node.clock, node.quiet_since)
            node.next_us = None if wake is None else max(node.clock, wake)
            node.sleeping = True
        else:
            node.next_us, node.sleeping = node.clock, False


    # ------------------------------------------------------------------------------------- quiet decode stretches
    # After a step whose next steps only decode (checker.fastforward), the replica's steps until an event of its
    # own (the end of the stretch: a finish, the pool, a queue timeout, a slow window) are planned at once and
    # applied lazily: all of them when the loop reaches the start of the last one (where plain stepping would
    # step it, its finishes reported at its end), or those that start before t when something reaches the
    # replica at t (a request, a cancel, its loss): the step after them then takes it, stepped plainly. The
    # steps of a stretch produce no first token, no finish but in the last, no rejection, and leave the
    # router's view (requests outstanding) as it was, so applying them later changes nothing anyone sees
    # (tests/unit/test_fleet_fastforward.py pins it to plain stepping). The steps of planned stretches count against
    # the step limit when planned: a run never takes more steps than plain stepping allows; near the limit it
    # may stop (every verdict UNKNOWN) a little before plain stepping would, never decide where it would not.
    def plan_stretch(self, node: Node) -> None:
        start, s = node.clock, node.life.state
        if self.slow.factor(node.index, start) != 1.0:
            return
        horizon = [t for t in (_next_internal_event(s, start), self.slow.next_start(node.index, start))
                   if t is not None]
        last = finishing_step(s) if may_finish_in_stretch(s) else None
        durations = stretch_durations(s, node.profile, start, min(horizon) if horizon else None,
                                      self.max_steps - self.steps - self.reserved, last)
        if durations:
            self.reserved += len(durations)
            node.stretch = list(accumulate(durations, initial=start))
            node.stretch_finishes = len(durations) == last
            node.next_us = node.stretch[-2]

    def cut(self, node: Node, t: int) -> None:
        """Something reaches the replica at t: apply its stretch's steps that start before t; plain stepping goes
        on from the next one."""
        starts = node.stretch
        if starts is None:
            return
        node.stretch = None
        self.reserved -= len(starts) - 1
        j = bisect_left(starts, t, 0, len(starts) - 2)  # t is at most the last step's start (the loop's order)
        self.apply_steps(node, starts, j, False)
        node.clock = node.next_us = starts[j]

    def complete_stretch(self, node: Node) -> None:
        starts, finishes = node.stretch, node.stretch_finishes
        node.stretch = None
        k = len(starts) - 1
        self.reserved -= k
        done = self.apply_steps(node, starts, k, finishes)
        node.clock = end = starts[k]
        if done:
            attempt_of = node.life.attempt_of
            node.unfinished -= len(done)
            for r in done:
                self.push(end, _REPORT, ("finished", attempt_of[r.rid]))
            self.router.views[node.index].record(starts[k - 1], node.unfinished, node.kv_share())
        if not (node.unfinished or node.life.state.holding):
            node.next_us, node.sleeping = None, True
        else:
            node.next_us, node.sleeping = end, False

    def apply_steps(self, node: Node, starts: list[int], j: int, finishes: bool) -> list[Request]:
        """The first j steps of a stretch (the engine's bookkeeping, checker.engine._skip_quiet_decodes): the
        state, each running request's tokens, gap and last token, the finishes of the last step when
        ``finishes``; the replica's counts."""
        if j == 0:
            return []
        s, t = node.life.state, node.life.times
        if finishes:  # the blocks in use before the last step's finishes (they only grow until then)
            size = s.policy.kv.block_size
            node.kv_peak = max(node.kv_peak, s.kv_used + sum(max(0, blocks_for(r.num_computed + j - 1, size) - r.blocks)
                                                             for r in s.running))
        apply_stretch(s, j)
        end = starts[j]
        t.decoded(s.running, j, starts[1], max(b - a for a, b in zip(starts, starts[1:j + 1])), end)
        done = finish_stretch(s) if finishes else []
        for r in done:
            t.done[r.rid] = end
        node.kv_peak = max(node.kv_peak, s.kv_used)
        self.steps += j
        node.steps += j
        node.busy_us += end - starts[0]
        node.stall_tokens, node.quiet_since = 0, None
        return done


def prefill_leg(spec: RequestSpec) -> RequestSpec:
    """A request as a prefill replica runs it: its prompt and first token (max_tokens 1, as a P/D proxy sends
    it); its blocks stay pinned after it finishes until the fleet reports the transfer done (send_steps None), a
    request of one output token being done there (its send confirmed in the next step's output)."""
    return replace(spec, output_len=1, max_output=1, send_steps=0 if spec.output_len <= 1 else None,
                   external_tokens=0)


def decode_leg(spec: RequestSpec) -> RequestSpec:
    """A request as a decode replica receives it: its prompt and first token, the prompt's KV loaded from the
    prefill side (external_tokens, reported in the output of the step that admits it: the latency was the
    transfer's), then the rest of its output."""
    content = None if spec.content is None else spec.content + ((GREEDY_OUTPUT_TOKEN, 1),)
    return replace(spec, prompt_len=spec.prompt_len + 1, output_len=spec.output_len - 1,
                   max_output=max(spec.output_len, spec.max_output) - 1, content=content,
                   external_tokens=spec.prompt_len, load_steps=1, send_steps=0)


def simulate_fleet(fleet: LoadedFleet, requests: RequestSet, max_steps: int = DEFAULT_MAX_STEPS,
                   fast_forward: bool = True) -> FleetResult:
    """Run the requests through the fleet (deterministic: the same inputs give the same run). Python's cyclic
    garbage collector is off while it runs, as in checker.engine.simulate."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        return _Run(fleet, requests, max_steps, fast_forward).run()
    finally:
        if enabled:
            gc.enable()
