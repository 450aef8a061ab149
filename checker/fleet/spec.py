"""The fleet spec: replicas behind a router, the clients that send to it, the faults injected, and the
properties the fleet is held to (docs/fleet.md). YAML, validated by pydantic; every error names the file, the
field path, the value and what is allowed (checker/loading.py).

A fleet file names its replicas' policies and profiles (paths relative to the fleet file, or the names of
shipped examples) and, optionally, an SLO file whose ``latency`` (ttft_ms, e2e_ms) and ``rejection_rate``
properties are evaluated across the fleet.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Literal, Union

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, model_validator
from pydantic_core import PydanticCustomError

from checker.errors import InputError, Problem
from checker.fuzz.slo import LatencyBound, Property, RejectionRate, SLOFile
from checker.inputfiles import apply_overrides, load_policy
from checker.loading import load_document, load_model, validate
from checker.policy import MAX_MS, Policy
from checker.profile import Profile, load_profile

MAX_REPLICAS = 1024
MAX_RETRIES = 100
MAX_FACTOR = 1000.0


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


def _fail(field: str, value: object, expected: str) -> PydanticCustomError:
    return PydanticCustomError("consistency", "", {"field": field, "value": value, "expected": expected})


Ms = Annotated[float, Field(ge=0, le=MAX_MS)]


# ----------------------------------------------------------------------------------------- replicas
class ReplicaGroup(_Strict):
    """``count`` identical replicas: one policy, one service-curve profile. Groups may differ (heterogeneous)."""

    name: Annotated[str, Field(min_length=1, pattern=r"^[A-Za-z0-9_.]+$")]
    policy: Annotated[str, Field(min_length=1)]
    """A policy file (relative to the fleet file) or a shipped policy's name (vllm_v1)."""
    profile: str | None = None
    """A profile file (relative to the fleet file) or a shipped profile's name (default: default_linear)."""
    count: Annotated[int, Field(ge=1, le=MAX_REPLICAS)] = 1
    set: list[str] = []
    """Policy settings FIELD.PATH=VALUE applied to this group's policy (as ``--set`` applies them)."""

    def replica_names(self) -> list[str]:
        return [self.name] if self.count == 1 else [f"{self.name}-{i}" for i in range(self.count)]


class TransferRange(_Strict):
    """A transfer latency drawn per request, uniform in [min_ms, max_ms], from a stream seeded by (seed, request,
    attempt): the same on every run."""

    min_ms: Ms
    max_ms: Ms
    seed: Annotated[int, Field(ge=0, le=2**32 - 1)] = 0

    @model_validator(mode="after")
    def _ordered(self) -> TransferRange:
        if self.max_ms < self.min_ms:
            raise _fail("max_ms", self.max_ms, f">= min_ms={self.min_ms:g}")
        return self


class Pools(_Strict):
    """How the replicas share the work: ``shared`` (each replica prefills and decodes its requests) or
    ``disaggregated``: the groups named in ``prefill`` run each request's prefill (its first token), the groups
    named in ``decode`` the rest, the prompt's KV reaching the decode replica ``transfer_ms`` after the first
    token (docs/fleet.md, Disaggregated prefill and decode)."""

    kind: Literal["shared", "disaggregated"] = "shared"
    prefill: list[str] | None = None
    """disaggregated: the replica groups that run prefills (their policies pin a finished prefill's blocks:
    connector.kind prefill_node or both)."""
    decode: list[str] | None = None
    """disaggregated: the replica groups that decode (their policies admit a transferred prompt as a load:
    connector.kind decode_node or both)."""
    transfer_ms: Annotated[Union[Annotated[Ms, Tag("fixed")], Annotated[TransferRange, Tag("range")]],
                           Discriminator(lambda v: "range" if isinstance(v, (dict, TransferRange)) else "fixed")] = 0.0
    """disaggregated: the time from a prefill's first token to its KV at the decode replica: fixed, or
    {min_ms, max_ms, seed} drawn per request."""

    @model_validator(mode="after")
    def _sides(self) -> Pools:
        if self.kind == "shared":
            for name in ("prefill", "decode"):
                if getattr(self, name) is not None:
                    raise _fail(name, getattr(self, name), "no prefill or decode groups with kind shared (every "
                                                           "replica prefills and decodes)")
            if self.transfer_ms != 0.0:
                raise _fail("transfer_ms", self.transfer_ms, "0 with kind shared (no KV is transferred)")
            return self
        for name in ("prefill", "decode"):
            if not getattr(self, name):
                raise _fail(name, getattr(self, name), "a non-empty list of replica groups with kind disaggregated")
        for j, name in enumerate(self.decode):
            if name in self.prefill:
                raise _fail(f"decode.{j}", name, "a group not also in prefill (a replica is in one pool)")
        return self


# ----------------------------------------------------------------------------------------- router
class Strategy(StrEnum):
    ROUND_ROBIN = "round_robin"
    LEAST_OUTSTANDING = "least_outstanding"  # fewest requests routed there and not yet ended
    LEAST_KV_LOAD = "least_kv_load"  # smallest share of its KV pool in use
    PREFIX_AWARE = "prefix_aware"  # longest prompt prefix already sent there, unless over the load cap
    SESSION_AFFINITY = "session_affinity"  # the replica its session went to first


class Router(_Strict):
    strategy: Strategy = Strategy.ROUND_ROBIN
    staleness_ms: Ms = 0.0
    """The router sees each replica's load as it was this long ago (0: as it is)."""
    load_cap: Annotated[int | None, Field(ge=1, le=1_000_000)] = None
    """prefix_aware only: a replica with this many outstanding requests (in the router's view) is passed over
    for the least outstanding one (None: no cap)."""

    @model_validator(mode="after")
    def _cap_for_prefix(self) -> Router:
        if self.load_cap is not None and self.strategy is not Strategy.PREFIX_AWARE:
            raise _fail("load_cap", self.load_cap, f"no load_cap with strategy {self.strategy.value} (it caps "
                                                   "prefix_aware's choice only)")
        return self


# ----------------------------------------------------------------------------------------- clients
class Jitter(StrEnum):
    NONE = "none"  # the backoff delay itself
    FULL = "full"  # uniform in [0, delay]
    EQUAL = "equal"  # delay / 2 plus uniform in [0, delay / 2]


class Backoff(_Strict):
    """Retry k (1, 2, ...) waits min(max_ms, initial_ms * multiplier ** (k - 1)), jittered; the jitter is drawn
    from a stream seeded by (seed, request, attempt), so a run is reproducible."""

    initial_ms: Ms = 0.0
    multiplier: Annotated[float, Field(ge=1, le=1000)] = 2.0
    max_ms: Ms = 60_000.0
    jitter: Jitter = Jitter.NONE
    seed: Annotated[int, Field(ge=0, le=2**32 - 1)] = 0


class RetryBudget(_Strict):
    """Retries allowed so far, this one included: ``min_retries + ratio * requests sent so far`` (first attempts)."""

    ratio: Annotated[float, Field(ge=0, le=1000)] = 0.1
    min_retries: Annotated[int, Field(ge=0, le=1_000_000_000)] = 10


class OnFailure(StrEnum):
    RETRY = "retry"
    GIVE_UP = "give_up"


class Client(_Strict):
    """The clients sending the requests of some classes: a first-token timeout, what a rejection (an admission
    rejection, a lost replica, no replica to route to) or a timeout means to them, retries and their budget."""

    name: Annotated[str, Field(min_length=1)]
    classes: list[str] | None = None
    """The request classes this client sends (None: every class no other client names)."""
    timeout_ms: Annotated[float | None, Field(gt=0, le=MAX_MS)] = None
    """No first token this long after sending: the client cancels the attempt (None: it waits for ever)."""
    on_reject: OnFailure = OnFailure.RETRY
    on_timeout: OnFailure = OnFailure.RETRY
    max_retries: Annotated[int, Field(ge=0, le=MAX_RETRIES)] = 0
    """Retries of one request at most (0: never retry)."""
    backoff: Backoff = Backoff()
    budget: RetryBudget | None = None
    """This client's retry budget (None: none beyond max_retries)."""


# ----------------------------------------------------------------------------------------- faults
class SlowFault(_Strict):
    """Steps of the replica that start in [start_ms, end_ms) take ``factor`` times their service curve."""

    kind: Literal["slow"]
    replica: str
    start_ms: Ms
    end_ms: Ms
    factor: Annotated[float, Field(ge=1, le=MAX_FACTOR)]

    @model_validator(mode="after")
    def _ordered(self) -> SlowFault:
        if self.end_ms <= self.start_ms:
            raise _fail("end_ms", self.end_ms, f"> start_ms={self.start_ms:g}")
        return self


class LostRule(StrEnum):
    FAIL = "fail"  # its requests fail (reason replica_lost): their clients see a rejection
    REROUTE = "reroute"  # the router sends them again, from scratch, to the other replicas


class LostFault(_Strict):
    """The replica is lost at ``at_ms``: its requests fail or are re-routed (``rule``). The router notices after
    ``detect_ms`` (until then what it sends there fails at once); the replica comes back empty
    ``recover_after_ms`` after the loss (None: never), its steps ``warmup_factor`` times slower for
    ``warmup_ms``."""

    kind: Literal["lost"]
    replica: str
    at_ms: Ms
    rule: LostRule = LostRule.FAIL
    detect_ms: Ms = 0.0
    recover_after_ms: Annotated[float | None, Field(gt=0, le=MAX_MS)] = None
    warmup_ms: Ms = 0.0
    warmup_factor: Annotated[float, Field(ge=1, le=MAX_FACTOR)] = 1.0

    @model_validator(mode="after")
    def _detect_before_recovery(self) -> LostFault:
        if self.recover_after_ms is not None and self.detect_ms > self.recover_after_ms:
            raise _fail("detect_ms", self.detect_ms, f"<= recover_after_ms={self.recover_after_ms:g}")
        return self


class ViewLostFault(_Strict):
    """In [start_ms, end_ms) the router's view of the replica's load stays as it was at start_ms."""

    kind: Literal["view_lost"]
    replica: str
    start_ms: Ms
    end_ms: Ms

    @model_validator(mode="after")
    def _ordered(self) -> ViewLostFault:
        if self.end_ms <= self.start_ms:
            raise _fail("end_ms", self.end_ms, f"> start_ms={self.start_ms:g}")
        return self


Fault = Annotated[Union[SlowFault, LostFault, ViewLostFault], Field(discriminator="kind")]


# ----------------------------------------------------------------------------------------- canary
class Rollback(_Strict):
    """When a canary is rolled back: any condition met on a class that both arms served enough of."""

    ttft_p99_worse_ms: Ms | None = None
    """The canary's p99 TTFT of a class passes the baseline's by more than this many ms."""
    lost_share_worse: Annotated[float | None, Field(ge=0, le=1)] = None
    """The canary's share of a class's requests lost passes the baseline's by more than this."""

    @model_validator(mode="after")
    def _some_condition(self) -> Rollback:
        if self.ttft_p99_worse_ms is None and self.lost_share_worse is None:
            raise _fail("ttft_p99_worse_ms", None, "at least one rollback condition: ttft_p99_worse_ms (ms) or "
                                                   "lost_share_worse (a share)")
        return self


class Canary(_Strict):
    """A policy change on a stable fraction of the fleet: the replicas of ``group`` run it, and the requests whose
    key hashes below ``share`` go to them (the rest to the other replicas: the baseline), on the same arrivals.
    The assignment is a hash of the key, the same on every run (docs/fleet.md, Canary)."""

    group: Annotated[str, Field(min_length=1)]
    """The replica group that runs the change (its policy and set: are the canary's)."""
    share: Annotated[float | None, Field(gt=0, lt=1)] = None
    """The share of requests sent to the canary (None: its share of the replicas)."""
    key: Literal["session", "request"] = "session"
    """What the assignment hashes: the request's session (its prompt's first run, as session_affinity reads it:
    every turn goes to the same arm; a request of its own tokens is its own session; requests behind one shared
    system prompt share it) or the request itself (its index in the requests)."""
    classes: list[str] | None = None
    """The classes judged (None: every class)."""
    min_requests: Annotated[int, Field(ge=1, le=1_000_000_000)] = 50
    """Requests of a class each arm must have served (finished or lost) for that class to be judged."""
    rollback: Rollback


# ----------------------------------------------------------------------------------------- properties
class FleetProperties(_Strict):
    max_retry_amplification: Annotated[float | None, Field(ge=1, le=1000)] = None
    """Requests offered to the router (first attempts, retries, re-routes) per unique request, at most (plus
    ``retry_slack`` requests)."""
    retry_slack: Annotated[int, Field(ge=0, le=1_000_000_000)] = 0
    """Requests offered beyond max_retry_amplification * unique that the bound allows (a retry budget's
    min_retries lets a run of few requests retry more than its ratio)."""
    every_request_accounted: bool = True
    """Each request finishes, is cancelled by its client, or ends with a reason (none left stuck)."""
    recovery_window_ms: Annotated[float, Field(gt=0, le=MAX_MS)] = 10_000.0
    """The sliding window of arrivals over which a class's p99 TTFT is taken for recovery times."""
    max_recovery_ms: Annotated[float | None, Field(gt=0, le=MAX_MS)] = None
    """After each fault, each class with a p99 TTFT bound is back within it for good this soon at most (its
    recovery time, docs/fleet.md); a class not back by the end of the run violates it (None: no such property)."""


class Fleet(_Strict):
    format: Literal["batchcheck-fleet"] = "batchcheck-fleet"
    name: str | None = None
    replicas: Annotated[list[ReplicaGroup], Field(min_length=1)]
    pools: Pools = Pools()
    router: Router = Router()
    clients: Annotated[list[Client], Field(min_length=1)] = [Client(name="default")]
    global_retry_budget: RetryBudget | None = None
    """A retry budget shared by every client (None: none)."""
    faults: list[Fault] = []
    workload: str | None = None
    """The requests when the command line names none: a workload file (relative to the fleet file) or a shipped
    workload's name."""
    trace: str | None = None
    """Or a trace (relative to the fleet file): batchcheck JSON, Azure CSV or Mooncake JSONL."""
    slo: str | None = None
    """An SLO file (relative to the fleet file, or a shipped SLO's name): its latency (ttft_ms, e2e_ms) and
    rejection_rate properties, held across the fleet."""
    properties: FleetProperties = FleetProperties()
    canary: Canary | None = None
    """A policy change on part of the fleet, judged against the rest (None: none)."""

    def replica_names(self) -> list[str]:
        return [n for g in self.replicas for n in g.replica_names()]

    @model_validator(mode="after")
    def _consistent(self) -> Fleet:
        names = self.replica_names()
        seen: set[str] = set()
        for i, g in enumerate(self.replicas):
            for n in g.replica_names():
                if n in seen:
                    raise _fail(f"replicas.{i}.name", g.name, "a replica name used once (a group of count N > 1 "
                                                              "names its replicas NAME-0 ... NAME-(N-1))")
                seen.add(n)
        if len(names) > MAX_REPLICAS:
            raise _fail("replicas", f"{len(names)} replicas", f"at most {MAX_REPLICAS} replicas in all")
        for i, f in enumerate(self.faults):
            if f.replica not in seen:
                raise _fail(f"faults.{i}.replica", f.replica, "a replica of the fleet: " + ", ".join(names))
        lost = [f for f in self.faults if isinstance(f, LostFault)]
        for i, f in enumerate(self.faults):
            if isinstance(f, LostFault) and sum(1 for g in lost if g.replica == f.replica) > 1:
                raise _fail(f"faults.{i}.replica", f.replica, "one lost fault per replica")
        clients = [c.name for c in self.clients]
        catch_all = [i for i, c in enumerate(self.clients) if c.classes is None]
        for i, c in enumerate(self.clients):
            if clients.index(c.name) != i:
                raise _fail(f"clients.{i}.name", c.name, "a client name used once")
        if len(catch_all) > 1:
            raise _fail(f"clients.{catch_all[1]}.classes", None, "a list of classes (only one client may take "
                                                                 "every class no other client names)")
        claimed: dict[str, int] = {}
        for i, c in enumerate(self.clients):
            for cls in c.classes or []:
                if cls in claimed:
                    raise _fail(f"clients.{i}.classes", cls, f"a class no other client sends (clients.{claimed[cls]} "
                                                             "sends it)")
                claimed[cls] = i
        if self.canary is not None:
            groups = [g.name for g in self.replicas]
            if self.canary.group not in groups:
                raise _fail("canary.group", self.canary.group, "a replica group of the fleet: " + ", ".join(groups))
            if len(groups) == 1:
                raise _fail("canary.group", self.canary.group, "a group beside others (the baseline is the replicas "
                                                               "of the other groups)")
        if self.pools.kind == "disaggregated":
            groups = [g.name for g in self.replicas]
            for side in ("prefill", "decode"):
                for j, name in enumerate(getattr(self.pools, side)):
                    if name not in groups:
                        raise _fail(f"pools.{side}.{j}", name, "a replica group of the fleet: " + ", ".join(groups))
                    if getattr(self.pools, side).index(name) != j:
                        raise _fail(f"pools.{side}.{j}", name, "a group named once")
            for i, g in enumerate(self.replicas):
                if g.name not in self.pools.prefill and g.name not in self.pools.decode:
                    raise _fail(f"replicas.{i}.name", g.name, "a group in pools.prefill or pools.decode (disaggregated "
                                                              "pools place every replica)")
            if self.canary is not None:
                raise _fail("canary", self.canary.group, "no canary with disaggregated pools (not modelled yet: "
                                                         "docs/fleet.md, Not yet)")
        if self.workload is not None and self.trace is not None:
            raise _fail("trace", self.trace, "no trace when a workload is given (one source of requests)")
        return self


# ----------------------------------------------------------------------------------------- loading
@dataclass(frozen=True)
class Replica:
    """One replica as the simulation runs it."""

    name: str
    group: str
    policy: Policy
    profile: Profile


@dataclass(frozen=True)
class LoadedFleet:
    spec: Fleet
    source: str
    replicas: list[Replica]
    slo: list[Property]  # the SLO file's properties (latency on ttft_ms / e2e_ms, rejection_rate)
    slo_source: str | None
    workload: str | None  # the workload file the fleet names (None: none)
    trace: str | None = None  # the trace file it names (None: none)

    @property
    def name(self) -> str:
        return self.spec.name or Path(self.source).stem

    def with_faults(self, faults: list[Fault]) -> LoadedFleet:
        """The same fleet with these faults in place of its own (a search's draw, a counterexample's)."""
        return LoadedFleet(self.spec.model_copy(update={"faults": faults}), self.source, self.replicas, self.slo,
                           self.slo_source, self.workload, self.trace)


SLO_METRICS = ("ttft_ms", "e2e_ms")  # what the fleet measures per request, from its first arrival


def _file(fleet_path: Path, value: str, kind: str, field: str) -> Path:
    """The file a fleet field names: relative to the fleet file, else a shipped example of that kind; an input
    error naming the field when it is neither."""
    from checker.examples import KINDS, is_bare_name, resolve

    here = fleet_path.parent / value
    if here.is_file():
        return here
    shipped = kind in KINDS  # traces are no shipped examples
    found = resolve(value, kind) if shipped and is_bare_name(value) else here
    if found.is_file():
        return found
    noun = "SLO" if kind == "slo" else kind
    raise InputError(Problem(field, value, f"a {noun} file (relative to the fleet file)" +
                             (f" or a shipped {noun}'s name" if shipped else "")), str(fleet_path))


def load_fleet(path: str | Path) -> LoadedFleet:
    """The fleet file with its policies, profiles and SLO file loaded. InputError (exit 2) naming the fleet file
    and the field for a file that is not there or an SLO property the fleet cannot measure; a policy's or
    profile's own errors name that file."""
    path = Path(path)
    data, lines = load_document(path)
    return build_fleet(validate(Fleet, data, str(path), lines), path)


def build_fleet(spec: Fleet, path: Path, files: dict | None = None) -> LoadedFleet:
    """A validated fleet spec with the files it names loaded (relative to ``path``, the fleet file). ``files``: what
    files read before held, kept by the caller between calls on the same files (a sweep builds one fleet per
    configuration: each reads the same policy, profile and SLO files); None: read each one."""
    source = str(path)
    files = {} if files is None else files

    def read(kind: str, where: Path | None, load):
        key = (kind, None if where is None else str(where))
        if key not in files:
            files[key] = load(where)
        return files[key]

    loaded: dict[tuple[str, str | None, tuple[str, ...]], tuple[Policy, Profile]] = {}
    replicas: list[Replica] = []
    for i, g in enumerate(spec.replicas):
        key = (g.policy, g.profile, tuple(g.set))
        if key not in loaded:
            pol = _file(path, g.policy, "policy", f"replicas[{i}].policy")
            prof = None if g.profile is None else _file(path, g.profile, "profile", f"replicas[{i}].profile")
            try:
                policy = apply_overrides(read("policy", pol, load_policy), g.set)
            except InputError as exc:
                if exc.source != "--set" and exc.source is not None:
                    raise
                raise InputError([Problem(f"replicas[{i}].set" + ("" if p.path == "--set" else f": {p.path}"), p.value,
                                          p.expected) for p in exc.problems], source) from None
            loaded[key] = (policy, read("profile", prof, load_profile))
        policy, profile = loaded[key]
        _check_pool_role(spec, i, g, policy, source)
        replicas.extend(Replica(n, g.name, policy, profile) for n in g.replica_names())
    _check_decode_holds_prefill(spec, replicas, source)
    slo: list[Property] = []
    slo_source = None
    if spec.slo is not None:
        slo_path = _file(path, spec.slo, "slo", "slo")
        slo_source = str(slo_path)
        for prop in read("slo", slo_path, lambda p: load_model(SLOFile, p)).properties:
            if isinstance(prop, LatencyBound) and prop.metric in SLO_METRICS or isinstance(prop, RejectionRate):
                slo.append(prop)
                continue
            what = prop.metric if isinstance(prop, LatencyBound) else prop.kind
            raise InputError(Problem(f"properties.{prop.name}", what, "a property the fleet measures: latency of "
                                     f"{' or '.join(SLO_METRICS)}, or rejection_rate"), slo_source)
    workload = None if spec.workload is None else str(_file(path, spec.workload, "workload", "workload"))
    trace = None if spec.trace is None else str(_file(path, spec.trace, "trace", "trace"))
    return LoadedFleet(spec, source, replicas, slo, slo_source, workload, trace)


def _check_pool_role(spec: Fleet, i: int, group: ReplicaGroup, policy: Policy, source: str) -> None:
    """In disaggregated pools a prefill group's policy pins a finished prefill's blocks until the transfer is
    confirmed (connector prefill_node or both, release not immediate) and a decode group's admits a transferred
    prompt as a load (decode_node or both): an input error naming the group otherwise."""
    pools = spec.pools
    if pools.kind != "disaggregated":
        return
    c = policy.connector
    if group.name in pools.prefill and not c.pins:
        raise InputError(Problem(f"replicas[{i}].policy: connector.kind", f"{c.kind.value} (release "
                                 f"{c.release.value})", "prefill_node or both with release on_completion or deadline "
                                 f"(group {group.name} is in pools.prefill: its finished prefills' blocks stay pinned "
                                 "until the transfer completes)"), source)
    if group.name in pools.decode and c.kind.value not in ("decode_node", "both"):
        raise InputError(Problem(f"replicas[{i}].policy: connector.kind", c.kind.value, "decode_node or both (group "
                                 f"{group.name} is in pools.decode: it admits a transferred prompt as a KV load)"),
                         source)


def _check_decode_holds_prefill(spec: Fleet, replicas: list[Replica], source: str) -> None:
    """Every prompt a prefill replica accepts fits a decode replica: each decode group's max_model_len and KV pool
    hold the prefill pool's longest sequence (else a transferred prompt could never be admitted there)."""
    if spec.pools.kind != "disaggregated":
        return
    longest = max(r.policy.max_model_len for r in replicas if r.group in spec.pools.prefill)
    for i, g in enumerate(spec.replicas):
        if g.name not in spec.pools.decode:
            continue
        policy = next(r.policy for r in replicas if r.group == g.name)
        why = (f"group {g.name} is in pools.decode and the prefill pool's max_model_len is {longest}: every prompt "
               "it accepts must fit here")
        if policy.max_model_len < longest:
            raise InputError(Problem(f"replicas[{i}].policy: max_model_len", policy.max_model_len,
                                     f">= {longest} ({why})"), source)
        size = policy.kv.block_size
        if policy.kv.num_blocks * size < longest:
            raise InputError(Problem(f"replicas[{i}].policy: kv.num_blocks", policy.kv.num_blocks,
                                     f">= {-(-longest // size)} ({why})"), source)


def check_classes(fleet: LoadedFleet, class_names: list[str]) -> None:
    """Every class a client or an SLO property names is a class of the requests."""
    for i, c in enumerate(fleet.spec.clients):
        for cls in c.classes or []:
            if cls not in class_names:
                raise InputError(Problem(f"clients[{i}].classes", cls, "a class of the requests: " +
                                         ", ".join(class_names)), fleet.source)
    canary = fleet.spec.canary
    for cls in (canary.classes or []) if canary is not None else []:
        if cls not in class_names:
            raise InputError(Problem("canary.classes", cls, "a class of the requests: " + ", ".join(class_names)),
                             fleet.source)
    for prop in fleet.slo:
        if prop.request_class is not None and prop.request_class not in class_names:
            raise InputError(Problem(f"properties.{prop.name}", prop.request_class, "a class of the requests: " +
                                     ", ".join(class_names)), fleet.slo_source)
