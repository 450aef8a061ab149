"""`recheck` holds a certificate to what it certifies (issue 23: "recheck of a file holding only (assert false)
says certificate holds"): a binding line with the policy hash, invariant, N and the hash of the queries; a file
without one, with edited queries, bound to another policy / invariant / N than the ones given, or whose queries
are unsat by themselves is refused (exit 2, located); with --policy a whole-step induction query is rebuilt from
the policy and must assert the same terms."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from checker.verify.certificate import BINDING
from tests.cli.test_cli import run
from tests.helpers import POLICIES

V1 = str(POLICIES / "vllm_v1.yaml")


@pytest.fixture(scope="module")
def certificate(tmp_path_factory) -> Path:
    """A whole-step induction certificate of cancellation_releases:1 for vllm_v1, N=2."""
    from checker.api import run_verify

    folder = tmp_path_factory.mktemp("proofs")
    _, (result,) = run_verify(V1, ["cancellation_releases:1"], 2, 2, 60.0, None, folder / "cex", (1, 2048),
                              unbounded=True, proof_dir=folder)
    assert result.certificate is not None
    return Path(result.certificate)


@pytest.fixture(scope="module")
def actionwise(tmp_path_factory) -> Path:
    """An action-wise induction certificate of request_conservation for vllm_v1, N=2."""
    from checker.api import run_verify

    folder = tmp_path_factory.mktemp("proofs")
    _, (result,) = run_verify(V1, ["request_conservation"], 2, 2, 60.0, None, folder / "cex", (1, 2048),
                              unbounded=True, proof_dir=folder)
    assert result.certificate is not None and "action-wise" in result.method
    return Path(result.certificate)


def _rebound(path: Path, target: Path, body: str, **changes) -> Path:
    """``path``'s binding over another body (its hash recomputed, as someone editing by hand would)."""
    head, _, _ = path.read_text().partition(BINDING)
    line = path.read_text().split(BINDING, 1)[1].split("\n", 1)[0]
    binding = {**json.loads(line), "query_sha256": hashlib.sha256(body.encode()).hexdigest(), **changes}
    target.write_text(f"{head}{BINDING}{json.dumps(binding)}\n{body}")
    return target


def _refused(capsys, cert: Path, *flags: str) -> str:
    """recheck's error line for a refused certificate (exit 2, nothing on stdout)."""
    code, out, err = run(capsys, "recheck", str(cert), *flags)
    assert (code, out) == (2, "")
    return err


def _body(path: Path) -> str:
    return path.read_text().split(BINDING, 1)[1].split("\n", 1)[1]


def test_a_bound_certificate_holds_and_says_what_it_was_held_to(capsys, certificate):
    code, out, err = run(capsys, "recheck", str(certificate), "--policy", V1, "--invariant", "cancellation_releases:1",
                         "--requests", "2")
    assert (code, err) == (0, "")
    sha = hashlib.sha256(_body(certificate).encode()).hexdigest()
    assert out.splitlines()[0] == f"{certificate}: certificate holds (the step query is unsat with a fresh solver)"
    assert out.splitlines()[2:] == [
        f"  checked: its queries are the ones its binding hashes (sha256 {sha[:12]})",
        f"  checked: made for {V1} (same policy hash)", "  checked: made for cancellation_releases",
        "  checked: made for N=2", "  checked: each query has a goal literal and satisfiable premises",
        "  checked: its query is the one rebuilt from the policy"]


def test_a_file_holding_only_assert_false_is_refused(capsys, tmp_path):
    cert = tmp_path / "false.smt2"
    cert.write_text("(assert false)\n")
    assert _refused(capsys, cert) == (f"batchcheck: error: {cert}: binding=<missing> (expected a line '; batchcheck binding: {{...}}' "
                   "naming the policy hash, invariant and request slots the certificate was made for (a certificate "
                   "that batchcheck verify --unbounded writes; re-run it))\n")


def test_assert_false_added_by_hand_is_refused(capsys, tmp_path, certificate):
    body = _body(certificate)
    goal = body.rindex("(assert\n goal_broken)")
    edited = body[:goal] + "(assert false)\n" + body[goal:]
    cert = tmp_path / "edited.smt2"
    cert.write_text(certificate.read_text().replace(body, edited))
    code, out, err = run(capsys, "recheck", str(cert))
    assert (code, out) == (2, "")
    sha = hashlib.sha256(edited.encode()).hexdigest()
    recorded = hashlib.sha256(body.encode()).hexdigest()
    assert err == (f"batchcheck: error: {cert}:4: binding.query_sha256='{recorded}' (expected {sha}, the sha256 of "
                   "the queries below it: they were edited after batchcheck wrote them)\n")
    _rebound(certificate, cert, edited)  # the hash recomputed too: the premises are unsat by themselves
    assert _refused(capsys, cert) == (f"batchcheck: error: {cert}: queries[0]=<unsat premises> (expected premises that are satisfiable "
                   "without the goal literal goal_broken: unsat by themselves (e.g. (assert false)), the query proves "
                   "nothing)\n")


def test_a_query_without_its_goal_literal_is_refused(capsys, tmp_path, certificate):
    body = _body(certificate)
    cert = _rebound(certificate, tmp_path / "no_goal.smt2", body.replace("(assert\n goal_broken)", "(assert\n "
                                                                                                  "(not goal_broken))"))
    assert _refused(capsys, cert) == (f"batchcheck: error: {cert}: queries[0]=<no goal> (expected a query that asserts its goal literal "
                   "last (the Boolean constant claiming that the property breaks))\n")


def test_a_goal_emptied_by_hand_is_caught_by_the_rebuilt_query(capsys, tmp_path, certificate):
    vacuous = "(declare-fun goal_broken () Bool)\n(assert (=> goal_broken false))\n(assert goal_broken)\n"
    cert = _rebound(certificate, tmp_path / "vacuous.smt2", vacuous)
    assert _refused(capsys, cert) == _refused(capsys, cert, "--policy", V1).replace(
        V1, f"{V1} (the file its binding names)")  # without --policy: the policy file its binding names
    cert = _rebound(certificate, tmp_path / "unbound.smt2", vacuous, policy_file=None)
    code, out, _ = run(capsys, "recheck", str(cert))
    assert code == 0  # its shape is right: without a policy nothing tells the goal is not the invariant's
    assert out.splitlines()[-1] == ("  not checked: the policy (give --policy POLICY: its hash is compared, and the "
                                    "proof is rebuilt from it)")
    cert = _rebound(certificate, tmp_path / "moved.smt2", vacuous, policy_file=str(tmp_path / "gone.yaml"))
    code, out, _ = run(capsys, "recheck", str(cert))
    assert code == 0 and out.splitlines()[-1] == (f"  not checked: the policy: {tmp_path / 'gone.yaml'}, the file its "
                                                  "binding names, is not found (give --policy POLICY: its hash is "
                                                  "compared, and the proof is rebuilt from it)")
    assert _refused(capsys, cert, "--policy", V1) == (f"batchcheck: error: {cert}:4: queries=<differ> (expected the step query that batchcheck builds "
                   f"for cancellation_releases on {V1} with N=2 and k=1 (rebuilt from the binding: the file was "
                   "edited, or written by another version of batchcheck))\n")


@pytest.mark.parametrize("flags, message", [
    (("--policy", str(POLICIES / "sarathi_serve.yaml")), "binding.policy_sha256='{sha}' (expected {other}, the hash "
     "of " + str(POLICIES / "sarathi_serve.yaml") + ": the certificate was made for another policy (vllm_v1))"),
    (("--invariant", "token_budget"), "binding.invariant='cancellation_releases' (expected 'token_budget', the "
     "invariant given by --invariant)"),
    (("--invariant", "cancellation_releases:2"), "binding.params='steps=1' (expected steps=2, the parameters given "
     "by --invariant)"),
    (("--requests", "3"), "binding.requests=2 (expected 3, the request slots given by --requests)"),
], ids=["policy", "invariant", "params", "requests"])
def test_a_certificate_made_for_something_else_is_refused(capsys, certificate, flags, message):
    from checker.inputfiles import load_policy
    from checker.verify.counterexample import policy_hash

    err = _refused(capsys, certificate, *flags)
    sha, other = policy_hash(load_policy(V1)), policy_hash(load_policy(POLICIES / "sarathi_serve.yaml"))
    assert err == f"batchcheck: error: {certificate}:4: {message.format(sha=sha, other=other)}\n"


def test_a_satisfiable_query_with_a_sound_shape_does_not_hold(capsys, tmp_path, certificate):
    sat = "(declare-fun x () Int)\n(declare-fun goal_broken () Bool)\n(assert (> x 0))\n(assert goal_broken)\n"
    cert = _rebound(certificate, tmp_path / "sat.smt2", sat, policy_file=None)  # no policy to rebuild it from
    code, out, _ = run(capsys, "recheck", str(cert))
    assert code == 1
    assert out.splitlines()[0] == f"{cert}: certificate does NOT hold (the fresh solver says sat)"


def test_malformed_bindings_and_queries_are_located(capsys, tmp_path, certificate):
    cert = _rebound(certificate, tmp_path / "n0.smt2", _body(certificate), requests=0)
    code, _, err = run(capsys, "recheck", str(cert))
    assert code == 2
    assert err == (f"batchcheck: error: {cert}:4: binding.requests=0 (expected a JSON object as batchcheck verify "
                   "--unbounded writes it (Input should be greater than or equal to 1))\n")
    cert = _rebound(certificate, tmp_path / "garbage.smt2", "(assert (and\n")
    code, _, err = run(capsys, "recheck", str(cert))
    assert code == 2 and err.startswith(f"batchcheck: error: {cert}: queries[0]=<unparsable> (expected SMT-LIB2 that "
                                        "z3 reads (")


def test_an_action_wise_proof_is_rebuilt_from_the_policy_and_its_surviving_candidates(capsys, tmp_path, actionwise):
    code, out, _ = run(capsys, "recheck", str(actionwise), "--policy", V1)
    assert code == 0
    assert out.splitlines()[-1] == ("  checked: its 5 action queries, rebuilt from the policy and the candidates that "
                                    "survived, are unsat")
    line = actionwise.read_text().split(BINDING, 1)[1].split("\n", 1)[0]
    alive = json.loads(line)["alive"]
    without = {**alive, "P": [n for n in alive["P"] if n != "invariant request_conservation"]}
    cert = _rebound(actionwise, tmp_path / "no_target.smt2", _body(actionwise), alive=without)
    code, out, _ = run(capsys, "recheck", str(cert), "--policy", V1)
    assert code == 1
    assert out.splitlines()[0] == f"{cert}: certificate does NOT hold (the fresh solver says sat)"
    assert out.splitlines()[-1] == ("  checked: rebuilt from the policy and the candidates that survived: the "
                                    "step-boundary candidates (they do not hold invariant request_conservation) is not "
                                    "shown to keep them (the fresh solver says sat)")
    vacuous = "(declare-fun goal_broken () Bool)\n(assert (=> goal_broken false))\n(assert goal_broken)\n"
    emptied = {loc: [n for n in names if n.startswith("invariant ")] for loc, names in alive.items()}
    cert = _rebound(actionwise, tmp_path / "emptied.smt2", vacuous, queries=1, alive=emptied)
    code, out, _ = run(capsys, "recheck", str(cert), "--policy", V1)  # no lemma left: some action breaks it
    assert code == 1 and "is not shown to keep them (the fresh solver says sat)" in out.splitlines()[-1]
