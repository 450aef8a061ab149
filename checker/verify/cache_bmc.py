"""Bounded model checking of policies with prefix caching: the z3 unrolling (checker/verify/bmc.py) with the
block pool in the state (checker/smt/pool.py), over the finite domains of the explicit-state search.

The requests: N slots as in the plain unrolling (any arrival iteration or never, arrival order, cancels),
each with a prompt length, an output length, a declared max output, a priority and a tenant from the finite
domains that checker/verify/explicit.py derives from the policy (``explicit_environment``: the block and pool
boundaries), and a prompt identity from checker.smt.pool.IDENTITIES (own tokens, prefix group 1, prefix group 2,
group 1 from its second block). The pool encoding is exact for these (tests/conformance/test_smt_cache_conformance.py
pins it to the engine step by step), so a counterexample is a real trace: it is replayed on the engine with the
fixed clock and any disagreement is a bug in batchcheck (InternalError), as for every z3 counterexample.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

from checker.policy import Policy
from checker.requests import RequestSpec
from checker.semantics.blockpool import PoolFacts
from checker.smt.encode import SlotParams
from checker.smt.ops import SmtSession, Z3Ops
from checker.smt.pool import (IDENTITIES, POOL_FIELDS, Pool, PoolState, chained_code, empty_pool, identity_content,
                              identity_name, shape_for)
from checker.verify.env import Environment, SymbolicRequests, symbolic_requests
from checker.verify.explicit import ExplicitEnvironment, explicit_environment
from invariants.catalogue import Invariant

METHOD = "z3 bounded model checking with the block pool"


@dataclasses.dataclass(frozen=True)
class PoolEnvironment(ExplicitEnvironment):
    """The explicit search's finite domains, described as this method's (its prompt identities are the encoding's)."""

    def domains(self) -> str:
        return describe_domains(self)

    def describe(self) -> list[str]:
        lines = super().describe()
        lines[1] = f"{METHOD} (z3, exact pool encoding, checker/smt/pool.py): " + self.domains()
        return lines

    def as_dict(self) -> dict:
        return {**super().as_dict(), "method": METHOD,
                "prompt_identities": [identity_name(c) for c in range(len(IDENTITIES))]}


def domain_environment(policy: Policy, env: Environment, invariants: list[Invariant]) -> PoolEnvironment:
    """The explicit search's finite domains (prompt identities: this encoding's)."""
    if isinstance(env, PoolEnvironment):
        return env
    xenv = env if isinstance(env, ExplicitEnvironment) else explicit_environment(policy, env, invariants)
    return PoolEnvironment(**{f.name: getattr(xenv, f.name) for f in dataclasses.fields(xenv)})


def describe_domains(xenv: ExplicitEnvironment) -> str:
    prompts = ", ".join(f"{p} ({why})" for p, why in zip(xenv.prompts, xenv.prompt_why))
    caps = " or ".join("= output" if c == "output" else str(xenv.max_output_cap) for c in xenv.max_outputs)
    return (f"prompts {{{prompts}}} tokens, outputs {{{', '.join(map(str, xenv.outputs))}}} tokens, declared max "
            f"output {caps}, prompt identities {{{', '.join(identity_name(c) for c in range(len(IDENTITIES)))}}}, "
            f"priorities {{{', '.join(map(str, xenv.search_priorities))}}}, {xenv.search_tenants} tenant(s)")


def cache_requests(smt: SmtSession, o, policy: Policy, env: Environment, n: int, tag: str = "") -> SymbolicRequests:
    xenv = domain_environment(policy, env, [])
    req = symbolic_requests(smt, o, env, n, tag)
    cons = list(req.constraints)
    params = []
    for i, prm in enumerate(req.params):
        ident = smt.int_var(f"{tag}identity_{i}")
        caps = []
        for cap in xenv.max_outputs:
            caps.append(prm.max_output == prm.output_len if cap == "output"
                        else prm.max_output == o.max(prm.output_len, xenv.max_output_cap))
        cons += [o.or_(*(prm.prompt_len == p for p in xenv.prompts)), o.or_(*(prm.output_len == x for x in xenv.outputs)),
                 o.or_(*caps), o.or_(*(prm.priority == p for p in xenv.search_priorities)),
                 prm.tenant < xenv.search_tenants, ident >= 0, ident < len(IDENTITIES)]
        params.append(dataclasses.replace(prm, identity=ident))
    return SymbolicRequests(req.arrival_step, req.cancel_step, params, cons)


def initial_pool(policy: Policy, env: Environment, n: int):
    xenv = domain_environment(policy, env, [])
    kv = policy.kv
    most = min(max(xenv.prompts) + max(xenv.outputs), policy.max_model_len)
    shape = shape_for(n, most, kv.num_blocks, kv.block_size, kv.prefix_caching.chained_hashes)
    return shape, Pool(Z3Ops, shape, empty_pool(shape))


def fresh_pool(pool: Pool, blocks: list, params: list[SlotParams], fresh, k: int) -> tuple[Pool, PoolFacts]:
    """The pool after a step under fresh variables (the next step's terms stay small), and its facts."""
    st, shape = pool.s, pool.shape
    new = PoolState([[fresh(f"table_{i}_{e}@{k}", st.table[i][e]) for e in range(shape.table)]
                     for i in range(shape.num_slots)],
                    [fresh(f"ncached_{i}@{k}", c) for i, c in enumerate(st.ncached)],
                    *([fresh(f"{name}_{j}@{k}", v) for j, v in enumerate(getattr(st, name))] for name in POOL_FIELDS),
                    clock=fresh(f"clock@{k}", st.clock), overflow=fresh(f"overflow@{k}", st.overflow, True))
    out = Pool(Z3Ops, shape, new)
    true_codes = [[chained_code(Z3Ops, shape, prm.identity, prm.prompt_len, i, e) for e in range(shape.table)]
                  for i, prm in enumerate(params)]
    facts = out.facts(blocks, true_codes)
    return out, PoolFacts(*(fresh(f"pool_{name}@{k}", v) for name, v in facts._asdict().items()))


def with_contents(smt: SmtSession, sym: SymbolicRequests, policy: Policy, specs: list[RequestSpec]) -> list[RequestSpec]:
    size = policy.kv.block_size
    return [dataclasses.replace(s, content=identity_content(smt.value(sym.params[s.rid].identity), s.prompt_len, size))
            for s in specs]


def check_many(policy: Policy, policy_file: str | None, invariants: list[tuple[Invariant, dict[str, int]]],
               env: Environment, timeout_s: float, out_dir: Path | None, progress=None) -> list:
    """Verdicts for the invariants of a policy with prefix caching by z3 BMC over the pool encoding."""
    from checker.verify.bmc import search
    from checker.verify.run import Checked, Verdict, confirm_on_engine, save_counterexample

    xenv = domain_environment(policy, env, [inv for inv, _ in invariants])
    domains = xenv.domains()
    out = []
    for inv, params in invariants:
        started = time.monotonic()
        outcome = search(policy, inv, params, xenv, timeout_s, progress)
        seconds = time.monotonic() - started
        common = dict(method=METHOD, domains=domains)
        if outcome.status == "unknown":
            out.append(CacheChecked(inv, params, Verdict.UNKNOWN, xenv, seconds, depth=outcome.depth_reached, **common))
        elif outcome.status == "holds":
            verdict = Verdict.VACUOUS if outcome.vacuous else Verdict.HOLDS_UP_TO
            out.append(CacheChecked(inv, params, verdict, xenv, seconds, depth=outcome.depth_reached, **common))
        else:
            found = outcome.found
            step = confirm_on_engine(policy, inv, params, xenv, found)
            path = save_counterexample(policy, policy_file, inv, params, xenv, found.specs, step, found.frames,
                                       outcome.minimal_checked, "; ".join(outcome.notes), METHOD, out_dir)
            out.append(CacheChecked(inv, params, Verdict.VIOLATED, xenv, time.monotonic() - started, depth=found.depth,
                                    requests=len(found.specs), violation_step=step, counterexample=path,
                                    notes=outcome.notes, specs=found.specs, **common))
    return out


def _checked_base():
    from checker.verify.run import Checked
    return Checked


@dataclasses.dataclass
class CacheChecked(_checked_base()):
    """A verdict of z3 BMC with the block pool (its line names the method and the finite domains)."""

    domains: str = ""

    def line(self) -> str:
        from checker.verify.run import Verdict

        e = self.env
        how = f"{METHOD}: {self.domains}"
        if self.verdict is Verdict.VIOLATED:
            minimal = ("minimal: no violation with fewer requests up to depth "
                       f"{e.depth}, none shorter with {self.requests}" if not self.notes else "; ".join(self.notes))
            detail = (f"{self.requests} request(s), fails at iteration {self.violation_step}; {minimal} ({how}); "
                      f"replayed on the engine: {self.counterexample}")
        elif self.verdict is Verdict.HOLDS_UP_TO:
            detail = f"{e.requests} requests, {e.depth} iterations (bounded check, not a proof; {how})"
        elif self.verdict is Verdict.VACUOUS:
            detail = f"its situation never occurs within {e.requests} requests, {e.depth} iterations ({how})"
        else:
            detail = f"timeout or solver unknown; no violation up to depth {self.depth} with {e.requests} requests ({how})"
        return f"{self.verdict.value:<12} {self.label:<40} {detail}  [{self.seconds:.2f} s]"

    def as_dict(self) -> dict:
        return {**super().as_dict(), "method": METHOD, "domains": self.domains}
