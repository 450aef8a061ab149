"""The sweep: a grid (or a seeded random sample of it) of configurations of a fleet, each run on the same
requests, and the best configuration that meets every property of the fleet (its SLOs and the rest), as Vidur's
config search finds the cheapest deployment that meets the SLOs (docs/fleet.md, Sweep).

A knob is a policy setting FIELD.PATH applied to every replica group (after the group's own ``set:``), a router
field ``router.FIELD`` (``router.load_cap``, ``router.strategy``, ``router.staleness_ms``), or ``replicas``: the
replica count of a one-group fleet. The configurations run serially, on local worker processes
(``jobs``) or on a Dask cluster (``scheduler``), through checker.parallel; each task carries its fleet and requests
(the workers read no files), and its result is the same wherever it runs (the simulation is deterministic)."""

from __future__ import annotations

import itertools
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from checker.errors import InputError, Problem
from checker.fleet.run import check
from checker.fleet.spec import MAX_REPLICAS, Fleet, LoadedFleet, build_fleet
from checker.loading import validate
from checker.traces import RequestSet

REPLICAS = "replicas"
ROUTER = "router."  # a knob on the fleet file's router (router.load_cap), not on the policies
OBJECTIVES = {  # name -> (what it ranks by, larger is better)
    "goodput_per_replica": ("goodput (requests within their TTFT SLO per s) per replica", True),
    "goodput": ("goodput (requests within their TTFT SLO per s)", True),
    "ttft_p99": ("overall p99 TTFT", False),
    "replicas": ("fewest replicas, then goodput", False),
}
MAX_CONFIGURATIONS = 100_000


@dataclass(frozen=True)
class Knob:
    name: str  # a policy field path, or REPLICAS
    values: tuple[str, ...]


def parse_knob(text: str) -> Knob:
    """NAME=V1,V2,...: an input error naming --knob otherwise."""
    name, eq, raw = text.partition("=")
    values = tuple(v.strip() for v in raw.split(",")) if eq else ()
    if not name or not values or not all(values) or not all(name.split(".")):
        raise InputError(Problem("--knob", text, "NAME=V1,V2,... with NAME a policy field (batch.max_num_seqs), a "
                                 "router field (router.load_cap) or replicas, e.g. batch.max_num_seqs=8,16,32"))
    if len(set(values)) != len(values):
        raise InputError(Problem("--knob", text, "each value once"))
    return Knob(name, values)


def configurations(knobs: list[Knob], sample: int | None = None, seed: int = 0) -> list[dict[str, str]]:
    """The grid of knob values in order (the last knob varies fastest), or ``sample`` of them drawn without
    replacement (seeded), kept in grid order."""
    names = [k.name for k in knobs]
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise InputError(Problem("--knob", dup, "each knob once (list its values after one '=')"))
    size = 1
    for k in knobs:
        size *= len(k.values)
    if size > MAX_CONFIGURATIONS and sample is None:
        raise InputError(Problem("--knob", f"{size:,} configurations", f"at most {MAX_CONFIGURATIONS:,} in a grid "
                                 "(--random N samples it)"))
    if sample is not None and sample < size:
        chosen = sorted(random.Random(seed).sample(range(size), sample))
        grid = [_nth(knobs, i) for i in chosen]
    else:
        grid = [dict(zip(names, combo)) for combo in itertools.product(*(k.values for k in knobs))]
    return grid


def _nth(knobs: list[Knob], index: int) -> dict[str, str]:
    out = {}
    for k in reversed(knobs):
        index, r = divmod(index, len(k.values))
        out[k.name] = k.values[r]
    return {k.name: out[k.name] for k in knobs}


def configured(fleet: LoadedFleet, config: dict[str, str], files: dict | None = None) -> LoadedFleet:
    """The fleet with one configuration's knobs applied; an input error naming the configuration when the
    fleet refuses it (a value out of range, faults on replicas it no longer has). ``files``: the files the fleet
    names, as read for an earlier configuration (build_fleet's memo)."""
    import yaml

    data = fleet.spec.model_dump(mode="json", by_alias=True, exclude_unset=False)
    settings = [f"{k}={v}" for k, v in config.items() if k != REPLICAS and not k.startswith(ROUTER)]
    for k, v in config.items():
        if k.startswith(ROUTER):
            try:
                data["router"][k[len(ROUTER):]] = yaml.safe_load(v)
            except yaml.YAMLError:
                raise InputError(Problem("--knob", f"{k}={v}", "a YAML value after '='"), None) from None
    for group in data["replicas"]:
        group["set"] = list(group["set"]) + settings
    if REPLICAS in config:
        data["replicas"][0]["count"] = _count(config[REPLICAS])
    shown = ", ".join(f"{k}={v}" for k, v in config.items())
    try:
        return build_fleet(validate(Fleet, data, fleet.source), Path(fleet.source), files)
    except InputError as exc:
        raise InputError(Problem("--knob", shown, f"a configuration the fleet accepts: {exc}"), None) from None


def _count(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        n = 0
    if not 1 <= n <= MAX_REPLICAS:
        raise InputError(Problem("--knob", f"{REPLICAS}={value}", f"a whole number of replicas from 1 to {MAX_REPLICAS}"))
    return n


def check_knobs(fleet: LoadedFleet, knobs: list[Knob], files: dict | None = None) -> None:
    """Every value of every knob on its own, before anything runs (the message names the knob and value)."""
    for k in knobs:
        if k.name == REPLICAS and len(fleet.spec.replicas) != 1:
            raise InputError(Problem("--knob", REPLICAS, f"a fleet of one replica group (this one has "
                                     f"{len(fleet.spec.replicas)}: {', '.join(g.name for g in fleet.spec.replicas)})"))
        for v in k.values:
            configured(fleet, {k.name: v}, files)


@dataclass(frozen=True)
class Plan:
    """What every configuration's run needs, sent to each worker once (checker.parallel's ``shared``): the fleet
    of each configuration, in grid order, and the requests they all run."""
    fleets: tuple[LoadedFleet, ...]
    configs: tuple[dict[str, str], ...]
    requests: RequestSet


def run_nth(plan: Plan, i: int) -> dict[str, Any]:
    """Configuration i of the plan (a task is its index)."""
    return run_configuration((plan.fleets[i], plan.requests, plan.configs[i]))


def run_configuration(task: tuple[LoadedFleet, RequestSet, dict[str, str]]) -> dict[str, Any]:
    """One configuration run (in a worker): its figures and verdicts, small and picklable."""
    fleet, requests, config = task
    run = check(fleet, requests)
    s = run.summary
    violated = [f.prop.name for f in run.findings if f.verdict == "VIOLATED"]
    unknown = [f.prop.name for f in run.findings if f.verdict == "UNKNOWN"]
    n = len(fleet.replicas)
    return {"config": config, "replicas": n, "meets": not violated and not unknown, "violated": violated,
            "unknown": unknown, "goodput_per_s": s["goodput"]["per_s"],
            "goodput_per_replica": round(s["goodput"]["per_s"] / n, 4), "ttft_p99_ms": s["overall"]["ttft_ms"]["p99"],
            "lost": s["overall"]["lost"], "retry_amplification": s["offered"]["retry_amplification"],
            "steps": s["engine"]["steps"], "wall_s": s["engine"]["wall_s"]}


def best(results: list[dict], objective: str) -> int | None:
    """The index of the best configuration that meets every property (ties: the first in grid order)."""
    meeting = [i for i, r in enumerate(results) if r["meets"]]
    if not meeting:
        return None

    def rank(i: int) -> tuple:
        r = results[i]
        if objective == "ttft_p99":
            return (r["ttft_p99_ms"] if r["ttft_p99_ms"] is not None else float("inf"), i)
        if objective == "replicas":
            return (r["replicas"], -r["goodput_per_s"], i)
        return (-r[f"{objective}_per_s" if objective == "goodput" else objective], i)

    return min(meeting, key=rank)


@dataclass
class Sweep:
    fleet: LoadedFleet
    requests: RequestSet
    knobs: list[Knob]
    sampled: int | None
    objective: str
    results: list[dict]
    best: int | None
    where: str
    seconds: float


def sweep(fleet: LoadedFleet, requests: RequestSet, knobs: list[Knob], objective: str = "goodput_per_replica",
          sample: int | None = None, seed: int = 0, jobs: int = 1, scheduler: Any = None,
          done=None) -> Sweep:
    from checker.parallel import map_dask, map_processes, quiet_worker

    if objective not in OBJECTIVES:
        raise InputError(Problem("--objective", objective, "one of: " + ", ".join(OBJECTIVES)))
    files: dict = {}  # every configuration reads the same policy, profile and SLO files: once
    check_knobs(fleet, knobs, files)
    grid = configurations(knobs, sample, seed)
    plan = Plan(tuple(configured(fleet, c, files) for c in grid), tuple(grid), requests)
    tasks = range(len(grid))
    started = time.monotonic()
    if scheduler is not None:
        results = map_dask(run_nth, tasks, scheduler, done, shared=plan)
        where = f"Dask cluster at {scheduler}" if isinstance(scheduler, str) else "Dask cluster"
    else:
        import os

        # forked on Linux: the parent holds no solver or Hypothesis state, only the plan, which workers inherit
        results = map_processes(run_nth, tasks, jobs, done, quiet_worker, (os.getpid(),), start="fork", shared=plan)
        where = "1 process" if jobs <= 1 or len(tasks) <= 1 else f"{min(jobs, len(tasks))} local processes"
    return Sweep(fleet, requests, knobs, sample, objective, results, best(results, objective), where,
                 time.monotonic() - started)


def fleet_sweep(fleet: str | Path, knobs: list[str], workload: str | Path | None = None,
                trace: str | Path | None = None, limit: int | None = None, options=None,
                objective: str = "goodput_per_replica", sample: int | None = None, seed: int = 0, jobs: int = 1,
                scheduler: Any = None, done=None) -> Sweep:
    """``sweep`` on a fleet file and its requests (the workload or trace given, else the one it names); ``knobs``
    as the command line gives them (NAME=V1,V2,...)."""
    from checker.fleet.run import fleet_requests
    from checker.fleet.spec import load_fleet

    parsed = [parse_knob(k) for k in knobs]
    if not parsed:
        raise InputError(Problem("--knob", "<none>", "at least one knob NAME=V1,V2,..."))
    loaded = load_fleet(fleet)
    return sweep(loaded, fleet_requests(loaded, workload, trace, limit, options), parsed, objective, sample, seed,
                 jobs, scheduler, done)
