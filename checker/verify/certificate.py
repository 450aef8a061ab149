"""Proof certificates: what ``verify --unbounded`` writes with a PROVED verdict, and what ``recheck`` accepts.

A certificate is bound to what it certifies. Its header ends with one binding line,
``; batchcheck binding: {...}`` (JSON): the policy's hash (checker.verify.counterexample.policy_hash, the hash
counterexamples record), the invariant and its parameters, the request slots N and the KV pool, the method
(whole-step ``induction`` with its k, or ``action-wise``), the lemmas, the environment, the number of queries and
the sha256 of the queries below it. ``recheck`` refuses (exit 2, located) a file without a binding, one whose
queries are not the ones the binding hashes, one bound to another policy, invariant or N than the ones given
(``--policy``, ``--invariant``, ``--requests``), and one whose queries are unsat by themselves: each query is its
premises and then its goal literal ("the property breaks"), and premises that are unsat without the goal (e.g.
``(assert false)``) prove nothing. With ``--policy`` the proof is rebuilt from the policy and the binding: a whole-step
induction query must assert the file's terms, in its order; an action-wise proof (found by Houdini) is rebuilt from
the candidates that survived, listed in the binding per location, and decided by fresh solvers
(checker.verify.actions.recheck_rebuilt). Then a fresh solver decides the file's queries.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from checker.errors import InputError, Problem
from checker.policy import Policy

BINDING = "; batchcheck binding: "
FORMAT = 1
MAX_REQUESTS = 256  # verify --requests


class Binding(BaseModel):
    """What a certificate certifies (its binding line)."""

    model_config = ConfigDict(extra="forbid")

    format: Literal[1]
    policy: str
    policy_sha256: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
    invariant: Annotated[str, Field(min_length=1, max_length=200)]
    params: dict[str, int]
    requests: Annotated[int, Field(ge=1, le=MAX_REQUESTS)]
    kv_blocks: Annotated[int, Field(ge=0)]
    method: Literal["induction", "action-wise", "any-n", "temporal-induction"]
    k: Annotated[int, Field(ge=1, le=16)]
    lemmas: list[str]
    environment: dict
    queries: Annotated[int, Field(ge=1)]
    query_sha256: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
    policy_file: str | None = None  # the file verify was given (recheck's policy when --policy is not given)
    tier: str = ""  # action-wise: the Houdini candidate tier
    alive: dict[str, list[str]] = {}  # action-wise: the candidates that survived, per location (P, M0, ...)


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def render(policy: Policy, inv_name: str, params: dict[str, int], env, method: str, k: int, lemmas: list[str],
           meaning: str, body: str, tier: str = "", alive: dict[str, list[str]] | None = None,
           policy_file: str | None = None) -> str:
    """The certificate file: a readable header, the binding line, then the queries (``body``)."""
    from checker.smt.ops import CERTIFICATE_BLOCK
    from checker.verify.counterexample import policy_hash

    binding = Binding(format=FORMAT, policy=policy.name or "", policy_sha256=policy_hash(policy), invariant=inv_name,
                      params=params, requests=env.requests, kv_blocks=policy.kv.num_blocks, method=method, k=k,
                      lemmas=lemmas, environment=env.as_dict() if hasattr(env, "as_dict") else {"requests": env.requests},
                      queries=max(1, body.count(CERTIFICATE_BLOCK)),
                      query_sha256=_sha256(body), tier=tier, alive=alive or {}, policy_file=policy_file)
    return (f"; batchcheck certificate: {inv_name} for policy {policy.name}, {env.requests} request slots, any depth.\n"
            f"; The {meaning}.\n; Lemmas: {', '.join(lemmas)}\n"
            f"{_binding_line(binding)}\n{body}")


def _binding_line(binding: Binding) -> str:
    return f"{BINDING}{json.dumps(binding.model_dump(mode='json'), sort_keys=True, separators=(',', ':'))}"


def with_policy_file(text: str, shown: str) -> str:
    """A certificate naming ``shown`` as its policy file (ci: the project's file, not the worker's copy; the
    queries, and so their hash, are unchanged)."""
    head, sep, rest = text.partition(BINDING)
    if not sep:
        return text
    line, _, body = rest.partition("\n")
    binding = Binding.model_validate(json.loads(line)).model_copy(update={"policy_file": shown})
    return f"{head}{_binding_line(binding)}\n{body}"


@dataclass
class Recheck:
    """A certificate rechecked: the solver's answer over its queries, and what was checked before."""

    certificate: str
    solver: str  # "unsat" (the certificate holds), "sat" or "unknown"
    binding: Binding
    checked: list[str] = field(default_factory=list)  # what the file was held to, in words
    not_checked: list[str] = field(default_factory=list)  # what it was not held to, and how to hold it to that

    @property
    def queries(self) -> int:
        return self.binding.queries


def _refuse(source: str, line: int | None, path: str, value: object, expected: str) -> InputError:
    return InputError(Problem(path, value, expected, line), source)


def read_binding(text: str, source: str) -> tuple[Binding, str, int]:
    """The binding, the queries below it, and the binding's line number; InputError (exit 2) when missing,
    malformed, or not the binding of these queries."""
    lines = text.split("\n")
    at = next((i for i, line in enumerate(lines) if line.startswith(BINDING)), None)
    if at is None:
        raise _refuse(source, None, "binding", "<missing>", f"a line '{BINDING}{{...}}' naming the policy hash, "
                      "invariant and request slots the certificate was made for (a certificate that batchcheck verify "
                      "--unbounded writes; re-run it)")
    line = at + 1
    try:
        binding = Binding.model_validate(json.loads(lines[at][len(BINDING):]))
    except (ValueError, ValidationError) as exc:
        detail = exc.errors()[0] if isinstance(exc, ValidationError) else None
        where = "binding" + ("." + ".".join(map(str, detail["loc"])) if detail and detail["loc"] else "")
        raise _refuse(source, line, where, "<invalid>" if detail is None else detail.get("input", "<invalid>"),
                      "a JSON object as batchcheck verify --unbounded writes it"
                      + (f" ({detail['msg']})" if detail else "")) from None
    body = "\n".join(lines[at + 1:])
    if _sha256(body) != binding.query_sha256:
        raise _refuse(source, line, "binding.query_sha256", binding.query_sha256, f"{_sha256(body)}, the sha256 of "
                      "the queries below it: they were edited after batchcheck wrote them")
    return binding, body, line


def recheck(path: str | Path, policy: Policy | None = None, policy_file: str | None = None,
            invariant: tuple[str, dict[str, int]] | None = None, requests: int | None = None,
            timeout_ms: int = 60_000) -> Recheck:
    """Hold a certificate to its binding and to what the caller says it certifies, then decide its queries
    with a fresh solver (the module docstring). InputError (exit 2) when it is refused."""
    from checker.loading import read_text
    from checker.smt.ops import CERTIFICATE_BLOCK, query_goal, recheck_smt2, same_assertions
    from checker.verify.counterexample import policy_hash

    source = str(path)
    binding, body, line = read_binding(read_text(path), source)
    checked = [f"its queries are the ones its binding hashes (sha256 {binding.query_sha256[:12]})"]
    missing: list[str] = []
    if policy is None and binding.policy_file:  # the policy file it names, when it still holds that policy
        policy, policy_file, why = _recorded_policy(binding, Path(path))
        if policy is None:
            missing.append(f"the policy: {binding.policy_file}, the file its binding names, {why} (give --policy "
                           "POLICY: its hash is compared, and the proof is rebuilt from it)")
    elif policy is None:
        missing.append("the policy (give --policy POLICY: its hash is compared, and the proof is rebuilt from it)")
    if policy is not None:
        if policy_hash(policy) != binding.policy_sha256:
            raise _refuse(source, line, "binding.policy_sha256", binding.policy_sha256,
                          f"{policy_hash(policy)}, the hash of {policy_file or 'the policy given'}: the certificate was "
                          f"made for another policy ({binding.policy or 'unnamed'})")
        checked.append(f"made for {policy_file or 'the policy given'} (same policy hash)")
    if invariant is not None:
        name, params = invariant
        if name != binding.invariant:
            raise _refuse(source, line, "binding.invariant", binding.invariant, f"{name!r}, the invariant given by "
                          "--invariant")
        if params and {**binding.params, **params} != binding.params:
            shown = ",".join(f"{k}={v}" for k, v in sorted(binding.params.items()))
            raise _refuse(source, line, "binding.params", shown, ",".join(f"{k}={v}" for k, v in sorted(params.items()))
                          + ", the parameters given by --invariant")
        checked.append(f"made for {binding.invariant}")
    if requests is not None and binding.method == "any-n":
        checked.append(f"made for any N (so for N={requests})")
    elif requests is not None:
        if requests != binding.requests:
            raise _refuse(source, line, "binding.requests", binding.requests, f"{requests}, the request slots given by "
                          "--requests")
        checked.append(f"made for N={binding.requests}")
    blocks = ([block.partition("\n")[2] for block in body.split(CERTIFICATE_BLOCK)[1:]] if CERTIFICATE_BLOCK in body
              else [body])
    if len(blocks) != binding.queries:
        raise _refuse(source, line, "binding.queries", binding.queries, f"{len(blocks)}, the queries in the file")
    undecided = False
    for i, block in enumerate(blocks):
        try:
            goal, premises = query_goal(block, timeout_ms)
        except ValueError as exc:
            raise _refuse(source, None, f"queries[{i}]", "<unparsable>", f"SMT-LIB2 that z3 reads ({exc})") from None
        if goal is None:
            raise _refuse(source, None, f"queries[{i}]", "<no goal>", "a query that asserts its goal literal last "
                          "(the Boolean constant claiming that the property breaks)")
        if premises == "unsat":
            raise _refuse(source, None, f"queries[{i}]", "<unsat premises>", f"premises that are satisfiable without "
                          f"the goal literal {goal}: unsat by themselves (e.g. (assert false)), the query proves "
                          "nothing")
        undecided |= premises == "unknown"
    checked.append("each query has a goal literal and satisfiable premises" if not undecided else
                   "each query has a goal literal (the solver could not decide that its premises are satisfiable)")
    if policy is not None and binding.method in ("induction", "temporal-induction"):
        rebuilt = _rebuilt(policy, binding, source, line)
        theirs = ([block.partition("\n")[2] for block in rebuilt.split(CERTIFICATE_BLOCK)[1:]]
                  if CERTIFICATE_BLOCK in rebuilt else [rebuilt])
        if len(theirs) != len(blocks) or not all(same_assertions(a, b) for a, b in zip(blocks, theirs)):
            raise _refuse(source, line, "queries", "<differ>", f"the step query that batchcheck builds for "
                          f"{binding.invariant} on {policy_file or 'the policy given'} with N={binding.requests} and "
                          f"k={binding.k} (rebuilt from the binding: the file was edited, or written by another "
                          "version of batchcheck)")
        checked.append("its query is the one rebuilt from the policy")
    if policy is not None and binding.method in ("action-wise", "any-n"):
        if binding.method == "action-wise":
            from checker.verify.actions import recheck_rebuilt

            inv, env = _invariant_and_environment(binding, source, line)
            answer, where = recheck_rebuilt(policy, inv, binding.params, env, binding.tier, binding.alive,
                                            timeout_ms / 1000)
            what = "action queries"
        else:  # every number of requests (checker/verify/anyn.py)
            from checker.verify.anyn import recheck_rebuilt as recheck_any_n

            answer, where = recheck_any_n(policy, binding.alive, timeout_ms / 1000)
            what = "instance queries (any N)"
        if answer != "unsat":
            checked.append(f"rebuilt from the policy and the candidates that survived: {where} is not shown to keep "
                           f"them (the fresh solver says {answer})")
            return Recheck(source, answer, binding, checked, missing)
        checked.append(f"its {binding.queries} {what}, rebuilt from the policy and the candidates that survived, "
                       "are unsat")
    if undecided:
        return Recheck(source, "unknown", binding, checked, missing)
    try:
        solver = recheck_smt2(body, timeout_ms)
    except ValueError as exc:
        raise _refuse(source, None, "queries", "<unparsable>", f"SMT-LIB2 that z3 reads ({exc})") from None
    return Recheck(source, solver, binding, checked, missing)


def _recorded_policy(binding: Binding, certificate: Path) -> tuple[Policy | None, str | None, str]:
    """The policy file a binding names, when it still holds the policy the certificate was made for: as named
    (from the working directory), else from the folder above the certificate's (``proofs/`` beside ``spec/``).
    What it holds is never shown: the file may be anything."""
    from checker.inputfiles import load_policy
    from checker.verify.counterexample import policy_hash

    recorded = Path(binding.policy_file or "")
    candidates = [recorded] + ([] if recorded.is_absolute() else [certificate.resolve().parent.parent / recorded])
    found = next((c for c in candidates if c.is_file()), None)
    if found is None:
        return None, None, "is not found"
    try:
        policy = load_policy(found)
    except InputError:
        return None, None, "does not load as a policy"
    if policy_hash(policy) != binding.policy_sha256:
        return None, None, "has changed since (its policy hash differs)"
    return policy, f"{binding.policy_file} (the file its binding names)", ""


def _rebuilt(policy: Policy, binding: Binding, source: str, line: int) -> str:
    from checker.verify import induction, temporal_induction

    inv, env = _invariant_and_environment(binding, source, line)
    if binding.method == temporal_induction.METHOD:
        return temporal_induction.certificate_query(policy, inv, binding.params, env, binding.k, binding.tier)
    return induction.certificate_query(policy, inv, binding.params, env, binding.k)


def _invariant_and_environment(binding: Binding, source: str, line: int):
    from checker.verify.env import Environment
    from invariants.catalogue import CATALOGUE

    inv = CATALOGUE.get(binding.invariant)
    if inv is None:
        raise _refuse(source, line, "binding.invariant", binding.invariant, "an invariant of the catalogue (load "
                      "user invariants with --invariant-module)")
    e = binding.environment
    try:
        env = Environment(e["requests"], e["depth"], tuple(e["prompt_tokens"]), tuple(e["output_tokens"]),
                          e["max_output_cap"], tuple(e["priorities"]), e["tenants"], e["cancellations"], e["step_us"])
    except (KeyError, TypeError, ValueError):
        raise _refuse(source, line, "binding.environment", "<invalid>", "the environment as verify records it "
                      "(requests, depth, prompt_tokens, output_tokens, max_output_cap, priorities, tenants, "
                      "cancellations, step_us)") from None
    return inv, env
