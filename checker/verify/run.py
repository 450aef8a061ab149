"""``verify``: check invariants of a policy with z3, replay every counterexample on the engine, and
say how strong each verdict is."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from checker.errors import InputError, InternalError, Problem
from checker.exitcodes import ExitCode
from checker.fileio import safe_name
from checker.inputfiles import PolicyInput, load_policy, policy_source
from checker.loading import load_model
from checker.policy import BlockedWaiting, Policy, Scheduler
from checker.requests import RequestSpec
from checker.semantics.blocked import refuse as refuse_blocked
from checker.verify import counterexample as cex
from checker.verify.bmc import Found, search
from checker.verify.env import Environment, default_environment
from checker.verify.replay import first_violation, frame_differences, replay_fixed_clock
from checker.workload import Workload
from invariants.catalogue import CATALOGUE, Invariant
from invariants.plugins import load_entry_points, load_module


class Verdict(StrEnum):
    VIOLATED = "VIOLATED"  # with a counterexample replayed on the engine
    PROVED = "PROVED"  # unbounded in iterations, for the stated number of request slots
    HOLDS_UP_TO = "HOLDS_UP_TO"  # no violation within N requests and K iterations (bounded, not a proof)
    VACUOUS = "VACUOUS"  # holds only because its situation never occurs within the bounds
    UNKNOWN = "UNKNOWN"  # timeout or solver unknown


MAX_INDUCTION_DEPTH = 3  # k-induction is tried for k = 1, 2, 3 while a counterexample to induction remains

EXIT = {Verdict.VIOLATED: ExitCode.VIOLATED, Verdict.UNKNOWN: ExitCode.INCONCLUSIVE,
        Verdict.VACUOUS: ExitCode.INCONCLUSIVE, Verdict.HOLDS_UP_TO: ExitCode.OK, Verdict.PROVED: ExitCode.OK}


@dataclass
class Checked:
    invariant: Invariant
    params: dict[str, int]
    verdict: Verdict
    env: Environment
    seconds: float
    depth: int = 0  # iterations decided (or of the counterexample)
    requests: int = 0  # requests in the counterexample
    violation_step: int | None = None
    counterexample: Path | None = None
    certificate: Path | None = None
    lemmas: int = 0
    induction_depth: int = 1  # k of the k-induction that proved it
    method: str = ""  # how a PROVED verdict was proved, when not by whole-step induction
    notes: list[str] = field(default_factory=list)
    specs: list[RequestSpec] = field(default_factory=list)  # the counterexample's requests (VIOLATED)
    never_occurs: bool = False  # VACUOUS because its situation is proved never to occur, at any depth
    abstraction: str = ""  # how the environment was changed for this invariant (or why not, and what to change)
    any_n: bool = False  # PROVED for every number of requests (verify --any-n, checker/verify/anyn.py)

    @property
    def vacuity(self) -> str | None:
        """Why a VACUOUS verdict is vacuous: "never occurs at any depth" (the negation of its situation proved by
        action-wise induction) or "not reached within the bounds" (N requests, K iterations); None otherwise."""
        if self.verdict is not Verdict.VACUOUS:
            return None
        return "never occurs at any depth" if self.never_occurs else "not reached within the bounds"

    @property
    def label(self) -> str:
        if not self.params:
            return self.invariant.name
        return f"{self.invariant.name}({', '.join(f'{k}={v}' for k, v in self.params.items())})"

    def line(self) -> str:
        e = self.env
        if self.verdict is Verdict.VIOLATED:
            detail = (f"{self.requests} request(s), fails at iteration {self.violation_step}; "
                      + ("minimal: no violation with fewer requests up to depth "
                         f"{e.depth}, none shorter with {self.requests}" if not self.notes else "; ".join(self.notes))
                      + f"; replayed on the engine: {self.counterexample}")
        elif self.verdict is Verdict.PROVED and self.any_n:
            detail = (f"for any N, any number of iterations ({self.method}); "
                      + "".join(f"{note}; " for note in self.notes) + f"certificate: {self.certificate}")
        elif self.verdict is Verdict.PROVED and self.method:
            detail = (f"for {e.requests} request slots and any number of iterations ({self.method}); "
                      + "".join(f"{note}; " for note in self.notes) + f"certificate: {self.certificate}")
        elif self.verdict is Verdict.PROVED:
            method = "induction" if self.induction_depth == 1 else f"{self.induction_depth}-induction"
            detail = (f"for {e.requests} request slots and any number of iterations ({method} with "
                      f"{self.lemmas} structural lemmas; no violation up to depth {e.depth}); certificate: "
                      f"{self.certificate}")
        elif self.verdict is Verdict.HOLDS_UP_TO:
            detail = f"{e.requests} requests, {e.depth} iterations (bounded check, not a proof)"
            if self.notes:
                detail += "; " + "; ".join(self.notes)
        elif self.verdict is Verdict.VACUOUS and self.notes:
            detail = f"its situation never occurs with {e.requests} requests, at any depth ({self.notes[0]}), so nothing was checked"
        elif self.verdict is Verdict.VACUOUS:
            detail = (f"its situation never occurs within {e.requests} requests, {e.depth} iterations, "
                      "so nothing was checked")
        else:
            detail = f"timeout or solver unknown; no violation up to depth {self.depth} with {e.requests} requests"
            if self.notes:
                detail += "; " + "; ".join(self.notes)
        if self.abstraction:
            detail += f"; {self.abstraction}"
        return f"{self.verdict.value:<12} {self.label:<40} {detail}  [{self.seconds:.2f} s]"

    def as_dict(self) -> dict:
        return {"invariant": self.invariant.name, "params": self.params, "verdict": self.verdict.value,
                "statement": self.invariant.statement, "requests": self.requests or self.env.requests,
                "depth": self.depth, "violation_iteration": self.violation_step,
                "counterexample": str(self.counterexample) if self.counterexample else None,
                "certificate": str(self.certificate) if self.certificate else None,
                "seconds": round(self.seconds, 3), "notes": self.notes, "method": self.method or None,
                "vacuity": self.vacuity, **({"abstraction": self.abstraction} if self.abstraction else {}),
                **({"any_n": True} if self.any_n else {})}


# How verify checks a policy with prefix caching (both bounded, over the same finite domains; docs/prefix-caching.md)
CACHE_METHODS = ("explicit", "z3")
DEFAULT_CACHE_METHOD = "explicit"

DEFAULT_INVARIANTS = ("kv_never_overcommitted", "token_budget", "seq_cap", "request_conservation")


def parse_invariant(text: str) -> tuple[Invariant, dict[str, int]]:
    """NAME, NAME:VALUE (its first parameter) or NAME:KEY=VALUE,KEY=VALUE."""
    name, _, rest = text.partition(":")
    if name not in CATALOGUE:
        raise InputError(Problem("--invariant", name, "one of: " + ", ".join(sorted(CATALOGUE))))
    inv = CATALOGUE[name]
    params: dict[str, int] = {}
    for i, part in enumerate(p for p in rest.split(",") if p):
        key, eq, value = part.partition("=")
        if not eq:
            key, value = (list(inv.defaults) or [""])[0], part
            if i or not key:
                raise InputError(Problem("--invariant", text, f"{name}:KEY=VALUE with KEY in {list(inv.defaults)}"))
        if key not in inv.defaults:
            raise InputError(Problem("--invariant", text, f"parameters of {name}: {', '.join(inv.defaults) or 'none'}"))
        try:
            params[key] = int(value)
        except ValueError:
            raise InputError(Problem("--invariant", text, f"{key}=an integer")) from None
    return inv, params


def engine_only(policy: Policy) -> bool:
    """Rules the z3 encoding does not have (block identity, SGLang's rules): checked by explicit-state search on
    the engine (checker/verify/explicit.py)."""
    return policy.kv.prefix_caching.enabled or policy.scheduler is Scheduler.SGLANG


def proof_applies(policy: Policy) -> bool:
    """Whether a proof method (action-wise or whole-step induction) covers the policy: not the rules checked on the
    engine (prefix caching, SGLang) nor a KV connector's states (each refused by name with --unbounded)."""
    return (not engine_only(policy) and not policy.connector.enabled
            and policy.queue.blocked_waiting is BlockedWaiting.OFF)


def check_one(policy: Policy, policy_file: str | None, inv: Invariant, params: dict[str, int], env: Environment,
              timeout_s: float, out_dir: Path | None, unbounded: bool = False,
              proof_dir: Path | None = None, progress: Callable[[str], None] | None = None,
              temporal: bool = False) -> Checked:
    """The cheapest decisive method first: with ``unbounded``, the action-wise proof (PROVED for N slots and any
    depth); then the bounded search for a counterexample (VIOLATED, or HOLDS_UP_TO up to the depth); then, with
    ``unbounded``, whole-step induction (HOLDS_UP_TO -> PROVED). ``temporal`` (verify --temporal-induction, a
    windowed temporal invariant): the search at least as deep as the base case, then k-induction
    (checker/verify/temporal_induction.py) instead of whole-step induction."""
    if temporal:
        from checker.verify import temporal_induction
        env = temporal_induction.search_environment(inv, params, env)
    if engine_only(policy):  # not in the z3 encoding: explicit-state search on the engine instead
        from checker.verify.explicit import check_many
        return check_many(policy, policy_file, [(inv, params)], env, timeout_s, out_dir, unbounded, progress)[0]
    started = time.monotonic()
    tried: list[str] = []  # what was tried before the bounded search and did not decide (said with the verdict)
    if unbounded and not policy.speculative.enabled:  # action-wise induction has no speculative steps: whole-step only
        proved = _try_actionwise(policy, inv, params, env, timeout_s, proof_dir, progress, policy_file, tried)
        if proved is not None:
            return proved
    outcome = search(policy, inv, params, env, timeout_s - (time.monotonic() - started), progress)
    seconds = time.monotonic() - started
    notes = list(tried)
    if outcome.status == "unknown":
        return Checked(inv, params, Verdict.UNKNOWN, env, seconds, depth=outcome.depth_reached,
                       notes=notes + [next_step(env, timeout_s, unbounded, proof_applies(policy))])
    if outcome.status == "holds" and (outcome.vacuous or outcome.vacuity_undecided) and PROOF_CUT in tried:
        # the proof was cut by the clock: with time it may have said PROVED or VACUOUS at any depth, so a bounded
        # verdict that is not also implied by those (HOLDS_UP_TO with the situation reached) would be a different
        # decided verdict: UNKNOWN (issue 19: a time budget may turn a verdict into UNKNOWN, never into another)
        return Checked(inv, params, Verdict.UNKNOWN, env, seconds, depth=outcome.depth_reached,
                       notes=notes + ["its situation not shown to occur within the depth",
                                      next_step(env, timeout_s, unbounded, proof_applies(policy))])
    if outcome.status == "holds":
        if outcome.vacuous:
            return Checked(inv, params, Verdict.VACUOUS, env, seconds, depth=outcome.depth_reached)
        checked = Checked(inv, params, Verdict.HOLDS_UP_TO, env, seconds, depth=outcome.depth_reached, notes=notes)
        if outcome.vacuity_undecided:
            checked.notes.append(VACUITY_UNDECIDED)
        if unbounded:
            if temporal:
                temporal_induction.upgrade(checked, policy, timeout_s - seconds, proof_dir, policy_file)
            else:
                _try_induction(checked, policy, timeout_s - seconds, proof_dir, policy_file)
            checked.seconds = time.monotonic() - started
        return checked
    found = outcome.found
    assert found is not None
    step = confirm_on_engine(policy, inv, params, env, found)
    path = save_counterexample(policy, policy_file, inv, params, env, found.specs, step, found.frames,
                               outcome.minimal_checked, "; ".join(outcome.notes), "z3 bounded model checking", out_dir)
    return Checked(inv, params, Verdict.VIOLATED, env, time.monotonic() - started, depth=found.depth,
                   requests=len(found.specs), violation_step=step, counterexample=path, notes=outcome.notes,
                   specs=found.specs)


def save_counterexample(policy: Policy, policy_file: str | None, inv: Invariant, params: dict[str, int],
                        env: Environment, specs: list[RequestSpec], violation_step: int, frames: list[dict],
                        minimal: bool, not_minimal_why: str, found_by: str, out_dir: Path | None,
                        **verdict_extra: object) -> Path | None:
    """Write an invariant counterexample to ``out_dir`` (nothing when it is None); its path."""
    if out_dir is None:
        return None
    from invariants.plugins import ORIGINS

    prop = {"kind": "invariant", "name": inv.name, "params": {**inv.defaults, **params}, "statement": inv.statement}
    if ORIGINS.get(inv.name) is not None:  # a user invariant: replay and report load its module again
        prop["module"] = ORIGINS[inv.name]
    doc = cex.build(policy, policy_file, prop,
                    {"verdict": Verdict.VIOLATED.value, "minimal": minimal,
                     "minimality": "fewest requests, then fewest iterations" if minimal else not_minimal_why,
                     **verdict_extra},
                    env.as_dict(), specs, env.step_us, violation_step, frames, found_by)
    return cex.save(doc, out_dir)


# Seconds the action-wise proof may take before the bounded search and whole-step induction get the rest.
ACTIONWISE_SHARE = 0.5
# The same in an environment derived to fill the KV pool (more slots: the proof costs more, and a bounded search
# of K iterations cannot fill the pool anyway)
FILL_ACTIONWISE_SHARE = 0.95
# Said with a HOLDS_UP_TO or PROVED verdict whose vacuity side check did not decide within its fixed resource count
VACUITY_UNDECIDED = ("vacuity not decided: no engine probe reached its situation and z3 did not decide within its "
                     "fixed budget whether it can occur within the bounds")


# Said when the action-wise proof was cut by the clock
PROOF_CUT = "the action-wise proof did not finish within the time given"


def next_step(env: Environment, timeout_s: float, unbounded: bool, proof: bool = True) -> str:
    """What an UNKNOWN verdict's line suggests trying next (the proof only where a proof method covers the policy:
    ``proof``)."""
    fewer = (f", or fewer slots (--requests {env.requests - 1})" if env.requests > 2 and not env.fill_blocks else "")
    return (f"try next: more time (--timeout {max(1, round(3 * timeout_s))})"
            + (", or a shallower bounded search (--depth " + str(max(1, env.depth - 2)) + ")" if env.depth > 2 else "")
            + fewer + ("" if unbounded or not proof else ", or the proof (drop --bounded-only)"))


def _try_actionwise(policy: Policy, inv: Invariant, params: dict[str, int], env: Environment, timeout_s: float,
                    proof_dir: Path | None, progress: Callable[[str], None] | None,
                    policy_file: str | None = None, tried: list[str] | None = None) -> Checked | None:
    """PROVED (or VACUOUS) by action-wise induction (checker/verify/actions.py), or None to go on with the
    bounded search and whole-step induction (with why in ``tried``). Its vacuity side checks (is the invariant's
    situation reachable?) conclude the same on every run: an engine probe, then the negation of the situation
    proved by action-wise induction, then z3's search within the depth, each bounded by a resource count
    (vacuity.VACUITY_RLIMIT), not by the clock; undecided, the proof stands and the verdict says so."""
    from checker.verify import actions, vacuity

    if not actions.supported(inv):
        return None
    if progress is not None:
        progress(f"{inv.name}: action-wise induction, {env.requests} request slots")
    share = FILL_ACTIONWISE_SHARE if env.fill_blocks else ACTIONWISE_SHARE
    started = time.monotonic()
    result = actions.prove(policy, inv, params, env, timeout_s * share)
    if result.status != "proved":
        if tried is not None:
            tried.append(PROOF_CUT if result.status == "unknown" else
                         "the action-wise proof failed (its lemmas are too weak)")
        return None
    how = vacuity.engine_witness(policy, inv, params, env)
    if how is None:  # no probe reaches its situation: prove it never occurs, else search within the depth
        if actions.never_triggered(policy, inv, params, env, vacuity.VACUITY_RLIMIT):
            return Checked(inv, params, Verdict.VACUOUS, env, time.monotonic() - started, depth=env.depth,
                           notes=["action-wise induction proves its negation"], never_occurs=True)
        reach = vacuity.search_within_depth(policy, inv, params, env)
        if reach.status == "unreachable":
            return Checked(inv, params, Verdict.VACUOUS, env, time.monotonic() - started, depth=env.depth)
        how = reach.how
    checked = Checked(inv, params, Verdict.PROVED, env, time.monotonic() - started, depth=env.depth,
                      lemmas=len(result.lemmas), method=f"action-wise induction: {result.cti[0]}", notes=[how])
    checked.certificate = _write_certificate(policy, inv, env, proof_dir, result.certificate,
                                             "queries below are each unsat iff each scheduler action keeps the lemmas "
                                             "(action-wise induction)", result.lemmas, params=params,
                                             method="action-wise", tier=result.tier, alive=result.alive,
                                             policy_file=policy_file)
    return checked


def _write_certificate(policy: Policy, inv: Invariant, env: Environment, proof_dir: Path | None, body: str,
                       meaning: str, lemma_names: list[str], *, params: dict[str, int] | None = None,
                       method: str = "induction", k: int = 1, tier: str = "",
                       alive: dict[str, list[str]] | None = None, policy_file: str | None = None) -> Path | None:
    """The certificate, bound to the policy's hash, the invariant, N and the method (checker/verify/certificate.py)."""
    from checker.verify import certificate

    if proof_dir is None:
        return None
    path = proof_dir / f"{safe_name(policy.name, 'policy')}__{safe_name(inv.name)}__N{env.requests}.smt2"
    full = {**getattr(inv, "defaults", {}), **(params or {})}
    cex.write_atomic(path, certificate.render(policy, inv.name, full, env, method, k, lemma_names, meaning, body,
                                              tier, alive, policy_file))
    return path


def _try_induction(checked: Checked, policy: Policy, timeout_s: float, proof_dir: Path | None,
                   policy_file: str | None = None) -> None:
    """Upgrade a bounded result to PROVED when the invariant plus the structural lemmas is inductive."""
    from checker.verify.induction import prove

    inv = checked.invariant
    deadline = time.monotonic() + max(1.0, timeout_s)
    for k in range(1, MAX_INDUCTION_DEPTH + 1):  # plain induction first; k-induction rules out unreachable CTIs
        result = prove(policy, inv, checked.params, checked.env, max(1.0, deadline - time.monotonic()), k)
        if result.status != "cti" or time.monotonic() >= deadline:
            break
    if result.status == "proved":
        checked.verdict = Verdict.PROVED
        checked.lemmas = len(result.lemmas)
        checked.induction_depth = result.k
        checked.certificate = _write_certificate(
            policy, inv, checked.env, proof_dir, result.certificate,
            f"step query below is unsat iff the invariant with its lemmas is "
            f"{'inductive' if result.k == 1 else f'{result.k}-inductive'}", result.lemmas, params=checked.params,
            method="induction", k=result.k, policy_file=policy_file)
    elif result.status == "cti":
        checked.notes.append(f"induction failed (up to k={result.k}), counterexample to induction: "
                             + "; ".join(result.cti[:3]))
    elif result.status == "unknown":
        checked.notes.append("induction timed out")
    elif inv.name in temporal_windows():
        checked.notes.append(f"unbounded proofs of {checked.label} need --temporal-induction (k-induction; it looks "
                             "back more than one iteration)")
    else:
        checked.notes.append(f"unbounded proofs of {checked.label} are not available yet (it looks back more than one "
                             "iteration)")


def temporal_windows() -> dict[str, str]:
    from checker.verify.temporal_induction import WINDOWS
    return WINDOWS


def confirm_on_engine(policy: Policy, inv: Invariant, params: dict[str, int], env: Environment, found: Found) -> int:
    """Replay the solver's counterexample on the engine; any disagreement is a bug in batchcheck."""
    replay = replay_fixed_clock(policy, found.specs, found.depth, env.step_us, env.tenants)
    diffs = frame_differences(replay, found.frames)
    step = first_violation(inv, params, replay)
    if diffs or step != found.depth - 1:
        raise InternalError(
            f"engine and solver disagree on a counterexample to {inv.name} for policy {policy.name}: the solver "
            f"says it fails at iteration {found.depth - 1}, the engine's replay says "
            f"{'it holds' if step is None else f'iteration {step}'}; first differences: {diffs[:5]}; "
            f"requests: {cex.requests_json(found.specs)}")
    return step


def overall_exit(results: list[Checked], split_vacuous: bool = False) -> ExitCode:
    """1 on a violation, else 3 if a check is undecided (UNKNOWN, or VACUOUS), else 0. ``split_vacuous``
    (verify --split-vacuous): a VACUOUS whose situation never occurs at any depth is decided, not undecided:
    exit 4 (NEVER_OCCURS) when nothing is violated or undecided; one not reached within the bounds stays 3."""
    codes = {ExitCode.NEVER_OCCURS if split_vacuous and r.never_occurs else EXIT[r.verdict] for r in results}
    for code in (ExitCode.VIOLATED, ExitCode.INCONCLUSIVE, ExitCode.NEVER_OCCURS):
        if code in codes:
            return code
    return ExitCode.OK


def run_verify(policy: PolicyInput, invariants: list[str] | None = None, requests: int = 3, depth: int = 5,
               timeout_s: float = 60.0, workload: str | Path | None = None, out_dir: str | Path | None = "counterexamples",
               prompt: tuple[int, int] | None = None, output: tuple[int, int] | None = None,
               cancellations: bool = True, step_ms: float = 10.0, unbounded: bool | None = False,
               proof_dir: str | Path | None = "proofs", invariant_modules: list[str] | None = None,
               progress=None, cache_method: str = DEFAULT_CACHE_METHOD, any_n: bool = False,
               temporal_induction: bool = False):
    """Check invariants of a policy (a file, or a Policy object) with z3 (bounded model checking); a policy with
    prefix caching by
    ``cache_method``: "explicit", explicit-state search on the engine (checker/verify/explicit.py), or "z3", z3
    bounded model checking with the block pool (checker/verify/cache_bmc.py), both over the same finite domains;
    returns (environment, results). ``unbounded``: try the proofs (True), the bounded check alone (False), or None
    (verify's default): the proofs where a proof method covers the policy (proof_applies), else the bounded check
    as before. ``temporal_induction``: the windowed temporal invariants by k-induction (refused by name where it
    does not apply; checker/verify/temporal_induction.py)."""
    load_entry_points()
    for module in invariant_modules or []:
        load_module(module)
    pol, source = load_policy(policy), policy_source(policy)  # a Policy object: no file (its spec is recorded)
    # blocked waiting states: encoded for the bounded search (not for any-N, the proofs, nor the engine-only search)
    refuse_blocked(pol, "verify (--any-n: any-N)" if any_n else "verify", source,
                   encoded=not any_n and not engine_only(pol))
    if unbounded or temporal_induction:
        refuse_blocked(pol, "verify --unbounded / --temporal-induction (induction proofs)", source)
    if unbounded is None:
        unbounded = proof_applies(pol)
    chosen = [parse_invariant(text) for text in (invariants or DEFAULT_INVARIANTS)]
    wl = load_model(Workload, workload) if workload is not None else None
    env = default_environment(pol, requests, depth, wl, prompt, output, cancellations, round(step_ms * 1000))
    out = Path(out_dir) if out_dir is not None else None
    proofs = Path(proof_dir) if proof_dir is not None else None
    if cache_method not in CACHE_METHODS:
        raise InputError(Problem("--cache-method", cache_method, " or ".join(CACHE_METHODS)))
    if temporal_induction:  # refused by name where it does not apply (before any check)
        from checker.verify.temporal_induction import refuse_unless_applies
        refuse_unless_applies(pol, chosen, unbounded, any_n)
    if any_n:  # every number of requests (checker/verify/anyn_verify.py); refuses what it does not cover
        from checker.verify import anyn_verify
        return env, anyn_verify.check_many(pol, source, chosen, env, timeout_s, out, proofs, progress,
                                           output is None and wl is None)
    if engine_only(pol):
        from checker.verify import explicit
        if cache_method == "z3" and pol.scheduler is Scheduler.SGLANG:  # the SGLang encoding (sglang_bmc.py), over
            from checker.verify import sglang_bmc  # the plain environment's ranges
            if unbounded:
                raise InputError(Problem("--unbounded", True, "no proof method covers SGLang's rules yet: a bounded "
                                         "check only (drop --unbounded)"))
            return env, sglang_bmc.check_many(pol, source, chosen, env, timeout_s, out, progress)
        env = explicit.explicit_environment(pol, env, [inv for inv, _ in chosen])
        if cache_method == "z3":  # z3 BMC over the pool encoding, one invariant at a time (cache_bmc.py)
            from checker.verify import cache_bmc
            if unbounded:
                raise InputError(Problem("--unbounded", True, "no proof method covers the prefix cache yet: a "
                                         "bounded check only (drop --unbounded)"))
            env = cache_bmc.domain_environment(pol, env, [inv for inv, _ in chosen])
            return env, cache_bmc.check_many(pol, source, chosen, env, timeout_s, out, progress)
        # one explicit-state search on the engine for all of them (explicit.py)
        return env, explicit.check_many(pol, source, chosen, env, timeout_s, out, unbounded, progress)
    if unbounded:  # refused by name before any check (not only where a proof is reached)
        from checker.smt.encode import refuse_proof_with_connector
        refuse_proof_with_connector(pol)
    outputs_free = output is None and wl is None  # the output domain is the default one: it may be raised
    if temporal_induction:  # the windowed temporal invariants by k-induction, the others as before
        from checker.verify.temporal_induction import WINDOWS
        return env, [check_one(pol, source, inv, params, env, timeout_s, out, unbounded, proofs, progress, temporal=True)
                     if inv.name in WINDOWS else
                     check_filling_pool(pol, source, inv, params, env, timeout_s, out, unbounded, proofs, progress,
                                        outputs_free) for inv, params in chosen]
    return env, [check_filling_pool(pol, source, inv, params, env, timeout_s, out, unbounded, proofs, progress,
                                    outputs_free) for inv, params in chosen]


def _proved_for_any_n(policy: Policy, policy_file: str | None, inv: Invariant, params: dict[str, int],
                      env: Environment, need, timeout_s: float, out_dir: Path | None, proof_dir: Path | None,
                      progress, outputs_free: bool) -> Checked | None:
    """A pool that more requests than verify raises N to are needed to fill (an imported production pool): the proof
    for any N (checker/verify/anyn_verify.py) where it covers the policy, so that the default is decided, not VACUOUS
    (issue 19 item 3). None where it does not cover the policy or does not prove it (the arithmetic VACUOUS stands)."""
    from checker.verify import anyn_verify
    from checker.verify.anyn_model import not_covered
    from checker.verify.env import MAX_FILL_REQUESTS

    if (need.least <= MAX_FILL_REQUESTS or timeout_s <= 1 or not_covered(policy)
            or {**inv.defaults, **params} != inv.defaults):
        return None
    if progress is not None:
        progress(f"{inv.name}: {need.least} requests fill the pool (more than {MAX_FILL_REQUESTS}): the proof for "
                 "any N")
    (checked,) = anyn_verify.check_many(policy, policy_file, [(inv, params)], env, timeout_s, out_dir, proof_dir,
                                        progress, outputs_free)
    if checked.verdict is not Verdict.PROVED:
        return None
    checked.abstraction = (f"{need.shortfall()}: {need.least} requests could fill it, more than the "
                           f"{MAX_FILL_REQUESTS} slots verify raises N to, so it was proved for any N (--any-n)")
    return checked


# Invariants whose situation is the KV pool filling up: checked in an environment whose requests can fill it
POOL_INVARIANTS = ("kv_never_overcommitted",)


def check_filling_pool(policy: Policy, policy_file: str | None, inv: Invariant, params: dict[str, int],
                       env: Environment, timeout_s: float, out_dir: Path | None, unbounded: bool,
                       proof_dir: Path | None, progress: Callable[[str], None] | None, outputs_free: bool) -> Checked:
    """check_one, but the KV invariant with --unbounded is checked where N requests can fill the pool: when the
    environment's N cannot (checker/verify/env.py pool_fill), N is raised to the least that can, with outputs long
    enough (pool_fill_environment), and the verdict states it; when N can but no engine probe of the environment
    fills the pool and the output domain is the default one, its outputs are raised so that one does. The raised environment covers every behaviour of the
    given one. Without --unbounded (a bounded search of K iterations cannot fill a real pool) and beyond
    MAX_FILL_REQUESTS, the environment is kept and a VACUOUS verdict says why and what to change."""
    from checker.verify import vacuity
    from checker.verify.env import MAX_FILL_REQUESTS, pool_fill, pool_fill_environment

    if inv.name not in POOL_INVARIANTS:
        return check_one(policy, policy_file, inv, params, env, timeout_s, out_dir, unbounded, proof_dir, progress)
    started = time.monotonic()
    headroom = {**inv.defaults, **params}.get("headroom", 0)
    need = pool_fill(policy, env, headroom)

    def fills(e: Environment) -> bool:
        return vacuity.engine_witness(policy, inv, params, e) is not None

    if need.can_fill and not (unbounded and outputs_free and not fills(env)):  # N fills it, or nothing would change
        return check_one(policy, policy_file, inv, params, env, timeout_s, out_dir, unbounded, proof_dir, progress)
    raised = None
    if unbounded and need.least <= MAX_FILL_REQUESTS:
        raised = pool_fill_environment(policy, env, headroom, outputs_free, fills)
    if raised is None and need.can_fill:  # kept: the verdict is check_one's
        return check_one(policy, policy_file, inv, params, env, timeout_s, out_dir, unbounded, proof_dir, progress)
    if raised is None and unbounded and (proved := _proved_for_any_n(policy, policy_file, inv, params, env, need,
                                                                     timeout_s - (time.monotonic() - started),
                                                                     out_dir, proof_dir, progress, outputs_free)):
        return proved
    if raised is None:  # N requests cannot hold the pool: its situation (and so a violation, which implies it)
        # never occurs, by arithmetic: VACUOUS at once, the same on every run, saying why and what to change
        checked = Checked(inv, params, Verdict.VACUOUS, env, time.monotonic() - started, depth=env.depth,
                          notes=[f"arithmetic: {need.requests} x {need.per_request:,} blocks < {need.blocks:,}"],
                          never_occurs=True)
        todo = (f"the proof (the default; not with --bounded-only) checks it with N raised to {need.least}"
                if need.least <= MAX_FILL_REQUESTS else
                f"{need.least} requests could fill it, more than the {MAX_FILL_REQUESTS} slots verify raises N to "
                f"(the proof's cost grows with N): --requests {need.least} checks it, slowly"
                + (", or a longer --prompt-range" if env.prompt[1] < policy.max_model_len - 1 else ""))
        checked.abstraction = f"{need.shortfall()}: {todo}"
        return checked
    wider, why = raised
    if progress is not None:
        progress(f"{inv.name}: {why}")
    left = max(1.0, timeout_s - (time.monotonic() - started))  # the probes that derived it count against the budget
    checked = check_one(policy, policy_file, inv, params, wider, left, out_dir, unbounded, proof_dir, progress)
    checked.abstraction = why
    checked.seconds = time.monotonic() - started
    return checked
