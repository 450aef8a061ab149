"""``[[liveness]]`` entries of batchcheck.toml: ``batchcheck liveness``'s library function
(checker.liveness.check.run_liveness) on a small instance of a policy, one check per property.

The checks of one instance are run together (checker.ci.execute.units): the state graph is explored
once and searched for each property's lasso. Verdicts keep their strength: VIOLATED (a lasso, replayed
on the engine, saved as a counterexample), PROVED (the graph is complete and has no lasso: for this
instance, any number of iterations), NO_COUNTEREXAMPLE (no lasso among the states explored, but
max_states or timeout_s cut the graph: inconclusive, gated by ``[gate] inconclusive``), VACUOUS (no lasso,
but the instance never reaches the policy's limits, or, on a policy with prefix caching, no admission ever finds
a cached prefix: inconclusive too). A caching policy's instance draws its prompts from prefix group 0 (the
liveness default; an entry's ``identities`` chooses others), and the message says how often the cache was hit.
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from checker.ci.plan import LIVENESS, Check, materialise
from checker.ci.results import COUNTEREXAMPLE, Artifact, Result, shown_paths


def run_liveness_checks(checks: Sequence[Check]) -> list:
    """Explore the instance the checks share once; one Result per check, in their order."""
    from checker.liveness.check import run_liveness

    started = time.monotonic()
    first = checks[0]
    inst = first.instance
    with tempfile.TemporaryDirectory(prefix="batchcheck-ci-") as tmp:
        folder = Path(tmp)
        paths = materialise(folder, {"policy": first.policy})
        cex_dir = folder / "counterexamples"
        report = run_liveness(paths["policy"], [c.rule for c in checks], first.requests, inst.prompts,
                              inst.outputs, inst.priorities, inst.tenants, inst.cancellations,
                              inst.arrivals_per_step, inst.step_ms, list(inst.overrides), inst.max_states,
                              first.timeout_s, cex_dir, identities=inst.identities, external=inst.external,
                              accepted=inst.accepted)
        seconds = (time.monotonic() - started) / len(checks)  # one exploration, shared
        graph = _graph(report)
        shared = {"graph": report.as_dict()["graph"], "environment": report.env.as_dict()}
        results = []
        for check, r in zip(checks, report.results):
            detail = {**r.as_dict(), **shared}
            line = f"{r.line(report.graph)}; {graph}"
            if r.prop == "eventually_served" and report.bound is not None:
                detail["starvation_bound"] = report.bound.as_dict()
                line += f"; {report.bound.line()}"
            artifacts = []
            if r.counterexample is not None:
                doc = shown_paths(json.loads(r.counterexample.read_text(encoding="utf-8")), paths, check)
                artifacts.append(Artifact(COUNTEREXAMPLE, r.counterexample.name, json.dumps(doc, indent=1) + "\n"))
                detail["counterexample"] = r.counterexample.name  # the caller replaces it with where it wrote it
                detail["requests"] = len(doc["requests"])
                detail["violation_iteration"] = doc["violation"]["iteration"]
                line = line.replace(str(r.counterexample), r.counterexample.name)
            results.append(Result(r.verdict, line, detail, seconds, artifacts, LIVENESS))
    return results


def _graph(report) -> str:
    """The graph and its instance, without run times (they stay out of CI messages)."""
    from checker.liveness.check import cache_hits
    from checker.liveness.canon import identity_token

    g, e = report.graph, report.env
    state = "complete" if g.complete else "cut"
    per_step = "" if e.arrivals_per_step is None else f", at most {e.arrivals_per_step} arrival(s) per iteration"
    identities = "" if e.identities is None else f", prompt identities {_set(map(identity_token, e.identities))}"
    return (f"graph: {g.states:,} states, {g.edges:,} edges ({state}){cache_hits(g)}; instance: {e.requests} "
            f"request(s) in flight, prompts {_set(e.prompts)}{identities}, outputs {_set(e.outputs)}, priorities "
            f"{_set(e.priorities)}, {e.tenants} tenant(s), {'' if e.cancellations else 'no '}cancellations{per_step}, "
            f"{e.step_us / 1000:g} ms per iteration" + "".join(f", {o}" for o in report.overrides))


def _set(values) -> str:
    return "{" + ", ".join(map(str, values)) + "}"
