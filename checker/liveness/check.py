"""``liveness``: explore the state graph, look for lassos, replay each one on the engine, save it, and
derive the starvation bound when no request can wait forever."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path

from checker.errors import InputError, InternalError, Problem
from checker.exitcodes import ExitCode
from checker.inputfiles import PolicyInput, apply_overrides, load_policy, policy_source
from checker.liveness.canon import STATUS_AT, identities_need_the_cache, live_field
from checker.liveness.explore import (DEFAULT_MAX_STATES, Choice, LivenessEnv, StateGraph, Transition, explore,
                                      EXTERNAL_BLOCK, external_name, instance_env, live_positions, make_canon,
                                      refuse_unmodelled)
from checker.liveness.lasso import (ALL_PROPERTIES, EVENTUALLY_SERVED, NO_HOLD_AND_WAIT, STATEMENTS, Lasso,
                                    StarvationBound, default_properties, find_lasso, starvation_bound)
from checker.liveness.properties import LIVENESS
from checker.policy import Policy
from checker.requests import Identity, RequestSpec
from checker.semantics.state import FIELDS, Status
from checker.verify import counterexample as cex
from checker.verify.replay import Replay, first_violation, replay_fixed_clock
from invariants.catalogue import CATALOGUE

VIOLATED, PROVED, NO_COUNTEREXAMPLE, VACUOUS = "VIOLATED", "PROVED", "NO_COUNTEREXAMPLE", "VACUOUS"
EXIT = {VIOLATED: ExitCode.VIOLATED, PROVED: ExitCode.OK, NO_COUNTEREXAMPLE: ExitCode.INCONCLUSIVE,
        VACUOUS: ExitCode.INCONCLUSIVE}
FOUND_BY = "batchcheck liveness: explicit state graph (networkx), canonical states, lasso search"


@dataclass
class PropertyResult:
    prop: str
    verdict: str
    lasso: Lasso | None = None
    counterexample: Path | None = None
    why: str = ""  # VACUOUS: what the instance never reaches

    def line(self, sg: StateGraph) -> str:
        if self.verdict == VACUOUS:
            detail = f"no lasso in the complete graph, but {self.why}"
        elif self.verdict == VIOLATED:
            l = self.lasso
            detail = (f"lasso: {len(l.prefix)} iteration(s) to a cycle of {len(l.cycle)} that repeats forever "
                      f"({_cycle_story(self.prop)}); replayed on the engine (prefix + two turns): {self.counterexample}")
        elif self.verdict == PROVED:
            detail = "no lasso in the complete graph: for this instance, any number of iterations"
        else:
            detail = f"no lasso among the states explored, but the graph is not complete ({sg.stop_reason})"
            if sg.canon.cache:
                detail += ("; with prefix caching the block pool's content is part of the state (duplicate and cached "
                           "free blocks fill the pool), so the graph grows with the pool: try a small "
                           "kv.num_blocks with --set")
        return f"{self.verdict:<18} {self.prop:<18} {detail}"

    def as_dict(self) -> dict:
        return {"property": self.prop, "statement": STATEMENTS[self.prop], "verdict": self.verdict,
                "prefix_iterations": len(self.lasso.prefix) if self.lasso else None,
                "cycle_iterations": len(self.lasso.cycle) if self.lasso else None,
                "counterexample": str(self.counterexample) if self.counterexample else None}


def _cycle_story(prop: str) -> str:
    return {EVENTUALLY_SERVED: "a request stays live on it",
            "no_livelock": "tokens are scheduled, nobody finishes",
            "no_deadlock": "requests wait, no token is scheduled",
            NO_HOLD_AND_WAIT: "a request holds KV blocks outside the running batch throughout, and no continuation "
                              "of its entry state ends that"}[prop]


@dataclass
class BoundResult:
    bound: StarvationBound
    engine_iteration: int | None = None  # where the witness violates bounded_starvation(bound - 1) on the engine
    witness_requests: int = 0
    after_lasso: bool = False  # eventually_served has a lasso: a request (maybe admitted before) waits forever

    def line(self) -> str:
        b = self.bound
        if self.after_lasso:
            return ("starvation bound: none (the eventually_served lasso keeps a request waiting forever, "
                    "after a preemption or before its first admission)")
        if b.iterations is None:
            return "starvation bound: none (a request can wait for its first admission forever)"
        if b.iterations == 0:
            return ("starvation bound: 0 iterations (every request is admitted, rejected or cancelled in the "
                    "iteration it arrives): bounded_starvation(0) holds for this instance")
        return (f"starvation bound: {b.iterations} iteration(s): bounded_starvation({b.iterations}) holds for this "
                f"instance and bounded_starvation({b.iterations - 1}) does not (witness: {self.witness_requests} "
                f"request(s), a request arriving at iteration {b.arrival_iteration} still waits after iteration "
                f"{b.arrival_iteration + b.iterations - 1}; replayed on the engine: violated at iteration "
                f"{self.engine_iteration})")

    def as_dict(self) -> dict:
        b = self.bound
        return {"iterations": b.iterations, "arrival_iteration": b.arrival_iteration,
                "witness_requests": self.witness_requests, "engine_violation_iteration": self.engine_iteration}


@dataclass
class LivenessReport:
    policy: Policy
    env: LivenessEnv
    graph: StateGraph
    results: list[PropertyResult]
    bound: BoundResult | None = None
    overrides: list[str] = field(default_factory=list)

    def graph_line(self) -> str:
        g = self.graph
        state = "complete" if g.complete else f"partial: {g.stop_reason}"
        return (f"graph: {g.states:,} states, {g.edges:,} edges, {g.seconds:.2f} s ({state}); "
                f"{g.choices_run:,} successor states generated" + cache_hits(g))

    def exit_code(self) -> ExitCode:
        codes = {EXIT[r.verdict] for r in self.results}
        for code in (ExitCode.VIOLATED, ExitCode.INCONCLUSIVE):
            if code in codes:
                return code
        return ExitCode.OK

    def as_dict(self) -> dict:
        g = self.graph
        return {"policy": self.policy.name, "overrides": self.overrides, "environment": self.env.as_dict(),
                "assumptions": self.env.describe(),
                "graph": {**g.summary(), "stop_reason": g.stop_reason or None},
                "results": [r.as_dict() for r in self.results],
                "starvation_bound": self.bound.as_dict() if self.bound else None,
                "exit_code": int(self.exit_code())}


# ----------------------------------------------------------------------------------------- concrete traces
def concrete_trace(sg: StateGraph, steps: list[tuple[int, Choice]]) -> list[RequestSpec]:
    """The requests of a path of the graph as a trace: each arrival is a new request (numbered in arrival
    order), each cancel sets that request's cancel time; with speculative decoding each request's ``accepted``
    lists the verifier's choices at its verifying steps; with blocked waiting states a request arriving with a grammar
    gets the grammar_steps that make it ready in the iteration whose readiness choice names it, or, if none does,
    one after the path (blocked in every scan of it). Checks that the path's states are the graph's."""
    trans = Transition(sg.canon, sg.env)
    step_us = sg.env.step_us
    specs: list[RequestSpec] = []
    live: list[int] = []  # trace numbers of the live requests, in arrival order
    accepted: dict[int, list[int]] = {}  # trace number -> drafts accepted at each of its verifying steps
    ready_at: dict[int, int] = {}  # trace number -> the iteration whose scan finds its grammar ready
    for k, (node, choice) in enumerate(steps):
        key = sg.keys[node]
        if len(live) != key[0]:
            raise InternalError(f"liveness: path step {k} reaches a state with {len(live)} live requests, "
                                f"the graph says {key[0]}")
        now = k * step_us
        m = key[0]
        holding = len(trans.canon.decode(key)[0].requests) - m
        for cid in choice[0]:
            specs.append(sg.canon.spec(len(specs), now, cid))
        for pos in choice[1]:
            specs[live[pos]] = replace(specs[live[pos]], cancel_us=now)
        for pos in choice[3] if len(choice) > 3 else ():
            ready_at[live[pos]] = k
        s, _, next_now = trans.apply(key, choice)
        if s.spec is not None:  # the verifier's choice, appended to what each request verifying drafts accepts
            chosen = dict(choice[2]) if len(choice) > 2 else {}
            for rid in s.spec.verified:  # the representative's live requests are numbered by position
                accepted.setdefault(live[rid], []).append(chosen.get(rid, 0))
        new = range(len(specs) - len(choice[0]), len(specs))
        number = {i: live[i] for i in range(m)} | {m + holding + j: g for j, g in enumerate(new)}
        live = [number[rid] for rid in live_positions(s)]
        if k + 1 < len(steps) and sg.canon.encode(s, next_now) != sg.keys[steps[k + 1][0]]:
            raise InternalError(f"liveness: path step {k} does not reach the graph's next state")
    for number, values in accepted.items():
        specs[number] = replace(specs[number], accepted=tuple(values))
    for number, spec in enumerate(specs):
        if spec.grammar_steps:  # arrived blocked (Canon.spec: NEVER)
            arrived = spec.arrival_us // step_us
            specs[number] = replace(spec, grammar_steps=ready_at.get(number, len(steps) + 1) - arrived)
    return specs


def _frames_json(replay: Replay) -> list[dict]:
    return [{"now_us": f.now_us, "kv_used": f.kv_used,
             "requests": [{**{name: slot[name] for name in FIELDS}, "scheduled": f.scheduled[i],
                           "produced": bool(f.produced[i]), "preempted": bool(f.preempted[i])}
                          for i, slot in enumerate(f.slots)]} for f in replay.frames]


def confirm_lasso(policy: Policy, sg: StateGraph, lasso: Lasso) -> tuple[list[RequestSpec], Replay, int]:
    """Replay the prefix and two turns of the cycle on the engine; the property must fail at the last
    iteration (a disagreement is a bug in batchcheck)."""
    steps = lasso.prefix + lasso.cycle + lasso.cycle
    specs = _lookahead_trace(sg, steps, lasso.cycle[0])
    replay = replay_fixed_clock(policy, specs, len(steps), sg.env.step_us, sg.env.tenants)
    params = {"prefix": len(lasso.prefix), "cycle": len(lasso.cycle)}
    at = first_violation(LIVENESS[lasso.prop], params, replay)
    c = sg.canon
    whole = c.cache or c.connector or c.sglang or c.speculative or c.pipelined or c.blocking  # not in the frames
    if at != len(steps) - 1 or (whole and not _pool_closes(policy, sg, lasso, specs)):
        raise InternalError(f"liveness: the engine's replay of the {lasso.prop} lasso for policy {policy.name} "
                            f"does not close the cycle (prefix {params['prefix']}, cycle {params['cycle']}); "
                            f"requests: {cex.requests_json(specs)}")
    return specs, replay, at


def _lookahead_trace(sg: StateGraph, steps: list[tuple[int, Choice]], following: tuple[int, Choice]) -> list[RequestSpec]:
    """concrete_trace of ``steps`` with blocked waiting states read one iteration further (``following``, the
    cycle's first again): a request the next turn's first readiness choice names is ready in the scan after the
    replay, so the engine's state at the end has it as the key does at the cycle's start (ready in the next scan).
    The following iteration's own arrivals and cancels are left out."""
    if not sg.canon.blocking:
        return concrete_trace(sg, steps)
    specs = concrete_trace(sg, steps + [following])
    end = len(steps) * sg.env.step_us
    return [s if s.cancel_us is None or s.cancel_us < end else replace(s, cancel_us=None)
            for s in specs if s.arrival_us < end]


def _pool_closes(policy: Policy, sg: StateGraph, lasso: Lasso, specs: list[RequestSpec]) -> bool:
    """With the cache, a KV connector, SGLang's rules, speculative decoding or async scheduling: the engine's states
    after the prefix, one turn and two turns have the same whole key, block pool content, transfers, SGLang's
    scheduler state, drafts and batches in flight included (the frames the property reads carry none of these:
    checker.liveness.properties)."""
    env = sg.env
    ends = [len(lasso.prefix) + j * len(lasso.cycle) for j in range(3)]
    keys = {sg.canon.encode(replay_fixed_clock(policy, specs, n, env.step_us, env.tenants).state, n * env.step_us)
            for n in ends}
    return len(keys) == 1


def save_lasso(policy: Policy, policy_file: str | None, sg: StateGraph, lasso: Lasso, specs: list[RequestSpec],
               replay: Replay, at: int, out_dir: Path, overrides: list[str]) -> Path:
    prefix, cycle = len(lasso.prefix), len(lasso.cycle)
    environment = {**sg.env.as_dict(), "policy_overrides": overrides}
    doc = cex.build(policy, policy_file,
                    {"kind": "liveness", "name": lasso.prop, "params": {"prefix": prefix, "cycle": cycle},
                     "statement": STATEMENTS[lasso.prop]},
                    {"verdict": VIOLATED, "minimal": False,
                     "minimality": "shortest prefix to a violating cycle in the explored graph; that cycle is a "
                                   "shortest one through its entry state"},
                    environment, specs, sg.env.step_us, at, _frames_json(replay), FOUND_BY)
    doc["lasso"] = {"prefix_iterations": prefix, "cycle_iterations": cycle,
                    "cycle_starts_after_iteration": prefix - 1, "replayed_iterations": prefix + 2 * cycle,
                    "note": "the state after iteration prefix-1, after one turn and after two turns is the same "
                            "canonical state; replay runs the prefix and two turns"}
    # ITF's lasso: after the last state comes states[loop] again (states hold the frames after iterations
    # 0..prefix+2*cycle-1; the last equals the one after iteration prefix-1+cycle as a canonical state, so its
    # successor is the one after iteration prefix+cycle): the second turn is the loop, the first is in the prefix
    doc["loop"] = prefix + cycle
    doc["graph"] = sg.summary()
    # "_lasso" in the name: no_deadlock is also a bounded invariant, whose files share the policy__name prefix
    name = cex.file_name(doc).replace(f"__{lasso.prop}__", f"__{lasso.prop}_lasso__", 1)
    path = out_dir / name
    cex.write_atomic(path, json.dumps(doc, indent=1) + "\n")
    return path


def confirm_bound(policy: Policy, sg: StateGraph, bound: StarvationBound) -> BoundResult:
    """Replay the bound's witness on the engine: bounded_starvation(bound - 1) must fail on it."""
    result = BoundResult(bound)
    if not bound.iterations:
        return result
    specs = concrete_trace(sg, bound.witness)
    replay = replay_fixed_clock(policy, specs, len(bound.witness), sg.env.step_us, sg.env.tenants)
    at = first_violation(CATALOGUE["bounded_starvation"], {"steps": bound.iterations - 1}, replay)
    if at is None:
        raise InternalError(f"liveness: the witness of the starvation bound {bound.iterations} does not violate "
                            f"bounded_starvation({bound.iterations - 1}) on the engine; requests: "
                            f"{cex.requests_json(specs)}")
    result.engine_iteration, result.witness_requests = at, len(specs)
    return result


def check_liveness(policy: Policy, policy_file: str | None, env: LivenessEnv, properties: list[str] | None = None,
                   max_states: int = DEFAULT_MAX_STATES, timeout_s: float = 60.0, out_dir: Path | None = None,
                   overrides: list[str] | None = None, progress=None, workers: int = 1) -> LivenessReport:
    chosen = list(properties or default_properties(policy))
    sg = explore(policy, env, max_states, timeout_s, progress, workers=workers)
    report = LivenessReport(policy, env, sg, [], overrides=list(overrides or []))
    for prop in chosen:
        lasso = find_lasso(sg, prop)
        if lasso is None:
            report.results.append(PropertyResult(prop, PROVED if sg.complete else NO_COUNTEREXAMPLE))
            continue
        specs, replay, at = confirm_lasso(policy, sg, lasso)
        path = save_lasso(policy, policy_file, sg, lasso, specs, replay, at, out_dir, report.overrides) \
            if out_dir is not None else None
        report.results.append(PropertyResult(prop, VIOLATED, lasso, path))
    served = next((r for r in report.results if r.prop == EVENTUALLY_SERVED), None)
    if served is not None and served.verdict == VIOLATED:  # a request stays live forever: no bound, whatever
        report.bound = BoundResult(StarvationBound(None, [], 0, 0), after_lasso=True)  # first admission says
    elif served is not None and sg.complete:
        report.bound = confirm_bound(policy, sg, starvation_bound(sg))
    reasons = []
    if sg.complete and not _someone_waits(sg) and not _someone_rejected(sg):
        reasons.append(untouched_limits(policy, env))
    if sg.complete and sg.canon.cache and not sg.found_choices:
        reasons.append(no_cache_hits(policy, sg))
    if reasons:
        why = "; and ".join(reasons)
        report.results = [replace(r, verdict=VACUOUS, why=why) if r.verdict == PROVED else r for r in report.results]
    return report


def cache_hits(g: StateGraph) -> str:
    """With the cache: in how many transitions an admission found a cached prefix, and adopted one (none found: the
    output says the cache is never exercised)."""
    if not g.canon.cache:
        return ""
    if not g.found_choices:
        return "; no admission finds a cached prefix in any transition (the cache is never exercised)"
    return (f"; prefix cache: an admission finds a cached prefix in {g.found_choices:,} of {g.choices_run:,} "
            f"transitions, adopts one in {g.hit_choices:,}")


def no_cache_hits(policy: Policy, sg: StateGraph) -> str:
    """Why a complete graph of a caching policy in which no lookup finds a cached prefix proves nothing about the
    cache: without a hit found the cache changes no decision (no shared block, no hit in an admission check)."""
    size = policy.kv.block_size
    return (f"no admission of this instance finds a cached prefix (0 of {sg.choices_run:,} transitions): the cache "
            f"never changes a decision, so the verdict says nothing about it; a hit needs a prompt of more than one "
            f"block (a fresh request recomputes its last token: --prompts {2 * size}) and a shared prefix "
            f"(--identities g0, the default)")


def _someone_waits(sg: StateGraph) -> bool:
    """Whether some reachable state has a request waiting after a step (not admitted in the iteration it
    arrived, or preempted back to the queue): only then do the policy's limits decide anything."""
    waiting = (int(Status.WAITING), int(Status.SWAPPED), int(Status.LOADING))
    for key in sg.keys:
        for i in range(key[0]):
            if live_field(key, i, STATUS_AT) in waiting:
                return True
    return False


def _someone_rejected(sg: StateGraph) -> bool:
    """Whether some iteration of the graph rejects an arrival (admission control is a limit reached). Called
    only for graphs in which nobody waits, which are small: each edge's choice is stepped again."""
    trans = Transition(sg.canon, sg.env)
    for key in sg.keys:
        if key[0] >= sg.env.requests:
            continue  # no room for an arrival
        for cid in range(len(sg.canon.classes)):  # one request of each class arriving now
            if trans.apply(key, ((cid,), ()))[1].rejected:
                return True
    return False


def untouched_limits(policy: Policy, env: LivenessEnv) -> str:
    """Why a complete graph without waiting proves nothing about the policy: what the instance never reaches."""
    return (f"no request ever waits in this instance ({env.requests} request(s) in flight, every arrival admitted "
            f"in its iteration, none rejected): the policy's limits (batch.max_num_seqs={policy.batch.max_num_seqs}, "
            f"batch.max_num_batched_tokens={policy.batch.max_num_batched_tokens}, "
            f"kv.num_blocks={policy.kv.num_blocks}) are never reached, so the property holds trivially; give more "
            "--requests, or smaller limits with --set (e.g. --set batch.max_num_seqs=1)")


def run_liveness(policy: PolicyInput, properties: list[str] | None = None, requests: int = 2,
                 prompts: tuple[int, ...] | None = None, outputs: tuple[int, ...] = (1, 2),
                 priorities: tuple[int, ...] | None = None, tenants: int = 1, cancellations: bool = False,
                 arrivals_per_step: int | None = None, step_ms: float = 10.0, overrides: list[str] | None = None,
                 max_states: int | None = None, timeout_s: float = 60.0,
                 out_dir: str | Path | None = "counterexamples", progress=None, jobs: int = 1,
                 identities: tuple[Identity, ...] | None = None,
                 external: tuple[int, ...] | None = None, accepted: tuple[int, ...] | None = None) -> LivenessReport:
    """Explore the policy's reachable states for a small instance into a networkx graph and check
    eventually_served, no_livelock and no_deadlock on it (docs/liveness.md); returns a LivenessReport.
    Defaults: prompts of one KV block (two with prefix caching), priorities 0 and 1 when the policy reads
    priorities (else 0), prompt identities (prefix caching only) DEFAULT_IDENTITIES; with a loading KV connector,
    ``external`` hits (tokens; explore.EXTERNAL_ALL: the whole prompt, EXTERNAL_BLOCK: one block; default none, the
    first block and the whole prompt),
    load latencies from the policy's connector section (explore.instance_env); with speculative decoding the drafts
    the verifier may accept in a step, ``accepted`` (default 0..speculative.num_tokens).
    ``jobs`` > 1 explores with that many worker processes (the same graph)."""
    for name in properties or []:
        if name not in ALL_PROPERTIES:
            raise InputError(Problem("--property", name, "one of: " + ", ".join(ALL_PROPERTIES)))
    if jobs < 1:
        raise InputError(Problem("--jobs", jobs, ">= 1"))
    pol = apply_overrides(load_policy(policy), overrides)
    refuse_unmodelled(pol, policy_source(policy))  # located; explore() refuses it too
    env = liveness_env(pol, requests, prompts, outputs, priorities, tenants, cancellations, arrivals_per_step, step_ms,
                       identities, external, accepted)
    return check_liveness(pol, policy_source(policy), env, properties, max_states or DEFAULT_MAX_STATES, timeout_s,
                          Path(out_dir) if out_dir is not None else None, overrides, progress, jobs)


def liveness_env(pol: Policy, requests: int = 2, prompts: tuple[int, ...] | None = None,
                 outputs: tuple[int, ...] = (1, 2), priorities: tuple[int, ...] | None = None, tenants: int = 1,
                 cancellations: bool = False, arrivals_per_step: int | None = None,
                 step_ms: float = 10.0, identities: tuple[Identity, ...] | None = None,
                 external: tuple[int, ...] | None = None, accepted: tuple[int, ...] | None = None) -> LivenessEnv:
    """The LivenessEnv of an instance of ``pol``, with run_liveness's defaults; InputError (naming the
    liveness option) for an instance that cannot be explored, e.g. a step that does not divide the aging
    interval, or prompt identities for a policy without prefix caching."""
    reads_priority = pol.queue.uses_priority or pol.preemption.victim.value == "lowest_priority"
    caching = pol.kv.prefix_caching.enabled
    if identities is not None and not caching:
        raise identities_need_the_cache(identities)
    if external is not None and not pol.connector.loads:
        raise InputError(Problem("--external", ",".join(map(external_name, external)),
                                 "only with a KV connector that loads (connector.kind offload or decode_node; without one "
                                 "a request's external hit is never read)"))
    if accepted is not None:
        spec = pol.speculative
        shown = ",".join(map(str, accepted))
        if not spec.enabled:
            raise InputError(Problem("--accepted", shown, "only with speculative decoding (speculative.method other "
                                     "than none; without it no draft is ever verified)"))
        if not accepted or max(accepted) > spec.num_tokens or min(accepted) < 0:
            raise InputError(Problem("--accepted", shown, f"draft counts in 0..{spec.num_tokens} "
                                     f"(speculative.num_tokens={spec.num_tokens}: the verifier accepts at most the "
                                     "drafts scheduled)"))
    if external is not None:  # "block": the policy's block size
        external = tuple(pol.kv.block_size if e == EXTERNAL_BLOCK else e for e in external)
    prompt = pol.kv.block_size * (2 if caching else 1)  # with the cache: a block a fresh request can hit
    env = LivenessEnv(requests, tuple(prompts or (prompt,)), tuple(outputs),
                      tuple(priorities or ((0, 1) if reads_priority else (0,))), tenants, cancellations,
                      arrivals_per_step, round(step_ms * 1000), identities, external=external, accepted=accepted)
    env = instance_env(pol, env)
    make_canon(pol, env)  # checks the clock against the policy's aging, and the identities against the cache
    return env
