"""``verify --any-n``: the state invariants for every number of requests (checker/verify/anyn.py), as verdicts.

Per invariant: PROVED for any N when the aggregate proof keeps it (and its side conditions pass on concrete
states), with a certificate bound to the policy's hash, the invariant and the method; otherwise the bounded check
of the given environment runs as without the flag (so a violation within it is still found and replayed) and the
line says why the any-N proof did not go through. A policy rule or an invariant the method does not cover is
refused by name (exit 2): ``any-N: not covered: ...``.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

from checker.errors import InputError, InternalError, Problem
from checker.fileio import safe_name
from checker.policy import Policy
from checker.verify import anyn
from checker.verify.anyn_model import not_covered
from checker.verify.env import Environment
from checker.verify.temporal_induction import WINDOWS
from invariants.catalogue import Invariant

KEPT_SLOTS = 2  # the slots an instance keeps whole (the binding's "requests": the proof holds for every N)
_SIDE: dict[str, anyn.SideConditions] = {}


def refuse_uncovered(policy: Policy, chosen: list[tuple[Invariant, dict[str, int]]]) -> None:
    from checker.verify.run import proof_applies

    rules = not_covered(policy)
    if rules:
        raise InputError(Problem("--any-n", True, f"a policy the any-N method covers; any-N: not covered: {rules[0]}"
                                 + (f" (and {len(rules) - 1} more: {'; '.join(rules[1:])})" if len(rules) > 1 else "")
                                 + "; drop --any-n for the bounded check"
                                 + (" and --unbounded's proofs for N slots" if proof_applies(policy) else "")))
    for inv, params in chosen:
        if inv.name in WINDOWS:  # a temporal invariant: refused by name, with the reason
            raise InputError(Problem("--invariant", inv.name, f"a state invariant ({', '.join(anyn.TARGETS)}) for "
                                     f"--any-n; any-N: not covered: invariant {inv.name} (a temporal invariant: it "
                                     f"reads a window of iterations set by {WINDOWS[inv.name]}, and the aggregate "
                                     "abstraction keeps no per-request history across steps; verify "
                                     "--temporal-induction proves it for N slots by k-induction)"))
        if inv.name not in anyn.TARGETS or {**inv.defaults, **params} != inv.defaults:
            shown = inv.name + "".join(f" {k}={v}" for k, v in params.items())
            raise InputError(Problem("--invariant", shown, f"one of {', '.join(anyn.TARGETS)} with its default "
                                     f"parameters for --any-n; any-N: not covered: invariant {shown} (--unbounded "
                                     "proves it for N slots)"))


def side_conditions(policy: Policy, alive: dict[str, list[str]]) -> anyn.SideConditions:
    key = policy.model_dump_json()
    if key not in _SIDE:
        side = anyn.side_conditions(policy, alive)
        if side.mismatches:  # the abstraction and the concrete step disagree: a bug in batchcheck
            raise InternalError(f"any-N: the instance differs from the concrete step ({len(side.mismatches)} "
                                f"mismatches; first: {side.mismatches[0]})")
        _SIDE[key] = side
    return _SIDE[key]


def pool_words(policy: Policy) -> str:
    return (f"pool {policy.kv.num_blocks:,} blocks of {policy.kv.block_size}, max_num_seqs "
            f"{policy.batch.max_num_seqs}, token budget {policy.batch.max_num_batched_tokens:,}")


def occurs(policy: Policy, inv: Invariant, params: dict[str, int], env: Environment) -> str | None:
    """An engine probe that reaches the invariant's situation on the real pool: with as many requests as fill it
    (checker/verify/env.py pool_fill), outputs long enough to keep them running."""
    from checker.verify import vacuity
    from checker.verify.env import fill_outputs, pool_fill

    need = pool_fill(policy, env, 0)
    n = max(env.requests, need.least)
    out = max(env.output[1], fill_outputs(policy, n))
    probe_env = replace(env, requests=n, output=(env.output[0], out), max_output_cap=max(env.max_output_cap, out),
                        fill_blocks=need.blocks)
    return vacuity.engine_witness(policy, inv, params, probe_env)


def check_many(policy: Policy, policy_file: str | None, chosen: list[tuple[Invariant, dict[str, int]]],
               env: Environment, timeout_s: float, out_dir: Path | None, proof_dir: Path | None, progress,
               outputs_free: bool) -> list:
    from checker.verify.run import Checked, Verdict, check_filling_pool

    refuse_uncovered(policy, chosen)
    started = time.monotonic()
    if progress is not None:
        progress("any-N: the aggregate proof")
    proof = anyn.prove(policy, timeout_s)
    side, shared_s = None, proof.seconds
    if proof.status == "done":
        if progress is not None:
            progress("any-N: side conditions (instance = concrete action)")
        began = time.monotonic()
        side = side_conditions(policy, proof.alive)
        shared_s += time.monotonic() - began  # shared by the invariants, as the proof is
    results = []
    for inv, params in chosen:
        began = time.monotonic()
        if proof.proved(inv.name) and side is not None and not side.undecided:
            how = occurs(policy, inv, params, env)
            notes = [how or "its situation was not shown to occur by an engine probe (a PROVED that may be vacuous)"]
            method = f"method: {anyn.METHOD}, {pool_words(policy)}, side conditions checked: {side.summary()}"
            checked = Checked(inv, params, Verdict.PROVED, env, time.monotonic() - began + shared_s,
                              depth=env.depth, lemmas=len(proof.alive["P"]) - 1, method=method, notes=notes,
                              any_n=True)
            checked.certificate = write_certificate(policy, inv.name, proof, proof_dir, policy_file)
        else:
            why = (proof.reason if proof.status != "done" else
                   f"a side condition was not decided: {side.undecided[0]}" if side and side.undecided else
                   f"the {proof.broken_by.get(anyn.target_name(inv.name), 'initial state')} breaks it on the "
                   "instance (not a counterexample: the abstraction may be too coarse)")
            left = max(1.0, timeout_s - (time.monotonic() - started))
            checked = check_filling_pool(policy, policy_file, inv, params, env, left, out_dir, False, proof_dir,
                                         progress, outputs_free)
            checked.notes.append(f"any-N: not proved ({why})")
        results.append(checked)
    return results


MEANING = ("queries below are each unsat iff each scheduler action, on its instance (kept slots and sums over the "
           "rest), keeps the candidates that survived (any-N aggregate abstraction)")


def write_certificate(policy: Policy, inv_name: str, proof: anyn.AnyNProof, proof_dir: Path | None,
                      policy_file: str | None) -> Path | None:
    from checker.verify import certificate
    from checker.verify import counterexample as cex
    from checker.verify.counterexample import policy_hash

    if proof_dir is None:
        return None
    body = proof.certificate
    binding = certificate.Binding(
        format=certificate.FORMAT, policy=policy.name or "", policy_sha256=policy_hash(policy), invariant=inv_name,
        params={}, requests=KEPT_SLOTS, kv_blocks=policy.kv.num_blocks, method="any-n", k=1,
        lemmas=proof.alive["P"], environment={"requests": KEPT_SLOTS, "any_n": True},
        queries=body.count(certificate_block()), query_sha256=certificate._sha256(body), tier="aggregate",
        alive=proof.alive, policy_file=policy_file)
    text = (f"; batchcheck certificate: {inv_name} for policy {policy.name}, any number of requests, any depth.\n"
            f"; The {MEANING}.\n; Lemmas: {', '.join(proof.alive['P'])}\n"
            f"{certificate._binding_line(binding)}\n{body}")
    path = proof_dir / f"{safe_name(policy.name, 'policy')}__{safe_name(inv_name)}__anyN.smt2"
    cex.write_atomic(path, text)
    return path


def certificate_block() -> str:
    from checker.smt.ops import CERTIFICATE_BLOCK
    return CERTIFICATE_BLOCK
