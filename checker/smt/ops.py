"""The one module that imports z3, and every Python-vs-SMT difference in one place.

The symbolic step (checker/smt/encode.py) is written against ``Ops``: arithmetic and comparisons use
Python operators (ints and z3 terms both support them); everything else goes through an Ops method.
``IntOps`` evaluates the same code on plain ints; ``Z3Ops`` builds z3 terms. tests/conformance pins
both to the engine's step.

Differences handled here:
- ``if``: Python branches on a bool; SMT needs ``If`` (``ite``).
- ``and/or/not``: Python's keywords short-circuit and cannot be overloaded (``and_``, ``or_``, ``not_``).
- min/max: built from ``ite`` (z3 has no n-ary min/max on Ints).
- ceiling division: Python ``-(-a // b)``; z3's ``/`` on Ints is Euclidean division, equal to floor
  division for a positive divisor, so ``(a + b - 1) / b`` for a >= 0 and a constant b > 0.
- floor division by a positive constant: Python ``//``; z3 ``/`` (same for a positive divisor).
- bool to int: Python ``int(b)``; SMT ``If(b, 1, 0)``.
"""

from __future__ import annotations

from functools import reduce
from typing import Any

import z3

Term = Any  # an int / bool (IntOps) or a z3 ArithRef / BoolRef (Z3Ops)


class IntOps:
    """Concrete evaluation on Python ints and bools."""

    symbolic = False

    @staticmethod
    def const(value: int) -> int:
        return value

    @staticmethod
    def bool(value: bool) -> bool:
        return value

    @staticmethod
    def ite(cond: Term, then: Term, other: Term) -> Term:
        return then if cond else other

    @staticmethod
    def and_(*xs: Term) -> bool:
        return all(xs)

    @staticmethod
    def or_(*xs: Term) -> bool:
        return any(xs)

    @staticmethod
    def not_(x: Term) -> bool:
        return not x

    @staticmethod
    def min(a: Term, b: Term) -> Term:
        return a if a <= b else b

    @staticmethod
    def max(a: Term, b: Term) -> Term:
        return a if a >= b else b

    @staticmethod
    def ceil_div(a: Term, b: int) -> Term:
        assert b > 0
        return -(-a // b)

    @staticmethod
    def floor_div(a: Term, b: int) -> Term:
        assert b > 0
        return a // b

    @staticmethod
    def b2i(x: Term) -> int:
        return 1 if x else 0


class Z3Ops:
    """Symbolic evaluation: the same calls build z3 terms."""

    symbolic = True

    @staticmethod
    def const(value: int) -> z3.ArithRef:
        return z3.IntVal(value)

    @staticmethod
    def bool(value: bool) -> z3.BoolRef:
        return z3.BoolVal(value)

    @staticmethod
    def ite(cond: Term, then: Term, other: Term) -> Term:
        if isinstance(cond, bool):
            return then if cond else other
        return z3.If(cond, then, other)

    @staticmethod
    def and_(*xs: Term) -> Term:
        xs = tuple(x for x in xs if x is not True)
        if any(x is False for x in xs):
            return z3.BoolVal(False)
        return xs[0] if len(xs) == 1 else z3.And(*xs) if xs else z3.BoolVal(True)

    @staticmethod
    def or_(*xs: Term) -> Term:
        xs = tuple(x for x in xs if x is not False)
        if any(x is True for x in xs):
            return z3.BoolVal(True)
        return xs[0] if len(xs) == 1 else z3.Or(*xs) if xs else z3.BoolVal(False)

    @staticmethod
    def not_(x: Term) -> Term:
        if isinstance(x, bool):
            return not x
        return z3.Not(x)

    @staticmethod
    def min(a: Term, b: Term) -> Term:
        return z3.If(a <= b, a, b)

    @staticmethod
    def max(a: Term, b: Term) -> Term:
        return z3.If(a >= b, a, b)

    @staticmethod
    def ceil_div(a: Term, b: int) -> Term:
        assert b > 0
        return (a + (b - 1)) / b  # a >= 0 wherever the step uses it (token counts)

    @staticmethod
    def floor_div(a: Term, b: int) -> Term:
        assert b > 0
        return a / b

    @staticmethod
    def b2i(x: Term) -> Term:
        if isinstance(x, bool):
            return 1 if x else 0
        return z3.If(x, 1, 0)


def int_var(name: str) -> z3.ArithRef:
    return z3.Int(name)


def bool_var(name: str) -> z3.BoolRef:
    return z3.Bool(name)


def pin_and_eval(pins: list[tuple[Term, Any]], outputs: list[Term], timeout_ms: int = 60_000) -> list[int | bool]:
    """Pin each variable to a value, ask z3 for a model, evaluate the outputs in it."""
    solver = z3.Solver()
    solver.set("timeout", timeout_ms)
    for var, value in pins:
        solver.add(var == value)
    result = solver.check()
    if result != z3.sat:
        raise RuntimeError(f"pinned step query is {result}, expected sat")
    model = solver.model()
    values = []
    for term in outputs:
        v = model.eval(term, model_completion=True) if not isinstance(term, (int, bool)) else term
        values.append(_py(v))
    return values


def _py(v: Any) -> int | bool:
    if isinstance(v, (int, bool)):
        return v
    if z3.is_true(v):
        return True
    if z3.is_false(v):
        return False
    return v.as_long()


def sum_terms(xs: list[Term]) -> Term:
    return reduce(lambda a, b: a + b, xs, 0)


class SmtSession:
    """A z3 solver behind the small interface the verifier needs (so only this module imports z3)."""

    def __init__(self, timeout_ms: int | None = None):
        self.solver = z3.Solver()
        if timeout_ms is not None:
            self.solver.set("timeout", max(1, int(timeout_ms)))
        self.last_reason = ""

    int_var = staticmethod(int_var)
    bool_var = staticmethod(bool_var)

    @staticmethod
    def implies(a: Term, b: Term) -> Term:
        return z3.Implies(a, b)

    def add(self, *terms: Term) -> None:
        for term in terms:
            if term is True:
                continue
            self.solver.add(term)

    def set_timeout(self, timeout_ms: int) -> None:
        self.solver.set("timeout", max(1, int(timeout_ms)))

    def set_rlimit(self, units: int) -> None:
        """Bound each later check by z3's resource counter (``rlimit``: counted in solver steps, the same on
        every run of the same query, whatever the machine's load), not by the clock; 0: no bound."""
        self.solver.set("rlimit", max(0, int(units)))

    def check(self, *assumptions: Term) -> str:
        """'sat', 'unsat' or 'unknown' (with the reason in last_reason)."""
        self.last_reason = ""
        result = self.solver.check(*assumptions)
        if result == z3.sat:
            return "sat"
        if result == z3.unsat:
            return "unsat"
        self.last_reason = self.solver.reason_unknown()
        return "unknown"

    def to_smt2(self) -> str:
        """The solver's assertions as SMT-LIB2 (a certificate: unsat when rechecked)."""
        return self.solver.to_smt2()

    def value(self, term: Term) -> int | bool:
        if isinstance(term, (int, bool)):
            return term
        return _py(self.solver.model().eval(term, model_completion=True))


# Starts each block of a certificate made of several queries (one per scheduler action); all must be unsat.
CERTIFICATE_BLOCK = "; ---- batchcheck query: "


def recheck_smt2(text: str, timeout_ms: int = 60_000) -> str:
    """Check an SMT-LIB2 certificate with a fresh solver: 'unsat' confirms the proof. A certificate of
    several blocks (CERTIFICATE_BLOCK) is unsat when every block is. ValueError for text z3 cannot parse."""
    if CERTIFICATE_BLOCK in text:
        blocks = [block.partition("\n")[2] for block in text.split(CERTIFICATE_BLOCK)[1:]]  # after the block's name
        results = {recheck_smt2(block, timeout_ms) for block in blocks}
        return "unsat" if results == {"unsat"} else "sat" if "sat" in results else "unknown"
    solver = _parsed(text, timeout_ms)
    result = solver.check()
    return "unsat" if result == z3.unsat else "sat" if result == z3.sat else "unknown"


def _parsed(text: str, timeout_ms: int) -> z3.Solver:
    solver = z3.Solver()
    solver.set("timeout", timeout_ms)
    try:
        solver.from_string(text)
    except z3.Z3Exception as exc:
        message = exc.value.decode(errors="replace") if isinstance(exc.value, bytes) else str(exc.value)
        raise ValueError(" ".join(message.split())[:200] or "not SMT-LIB2") from None
    return solver


def query_goal(text: str, timeout_ms: int = 60_000) -> tuple[str | None, str]:
    """The shape of one certificate query (batchcheck writes each as its premises, then its goal literal
    asserted last: the Boolean constant that claims "the property breaks"): the goal literal's name (None when
    the last assertion is no Boolean constant), and what a fresh solver says of the premises alone ('sat',
    'unsat' or 'unknown'). Premises that are unsat by themselves (e.g. ``(assert false)``) prove nothing.
    ValueError for text z3 cannot parse."""
    solver = _parsed(text, timeout_ms)
    assertions = list(solver.assertions())
    if not assertions:
        return None, "sat"
    last = assertions[-1]
    goal = str(last) if z3.is_const(last) and z3.is_bool(last) and last.decl().kind() == z3.Z3_OP_UNINTERPRETED else None
    premises = z3.Solver()
    premises.set("timeout", timeout_ms)
    premises.add(*assertions[:-1])
    result = premises.check()
    return goal, "unsat" if result == z3.unsat else "sat" if result == z3.sat else "unknown"


def same_assertions(text: str, other: str) -> bool:
    """Whether two SMT-LIB2 texts assert the same terms in the same order (z3 shares equal terms, so this is
    structural identity, whatever let-bindings either printer chose). ValueError for text z3 cannot parse."""
    mine, theirs = _parsed(text, 1).assertions(), _parsed(other, 1).assertions()
    return len(mine) == len(theirs) and all(a.eq(b) for a, b in zip(mine, theirs))


def scale(ops, k: Term, x: Term, bound: int) -> Term:
    """k * x for an integer 0 <= k <= bound: symbolically a case split over k, each case linear (no nonlinear
    arithmetic for the solver; checker/smt/sglang.py's reservations, the new-token ratio times remaining output)."""
    if not ops.symbolic or isinstance(k, int):
        return k * x
    out = z3.IntVal(0)
    for j in range(1, bound + 1):
        out = z3.If(k == j, x * j, out)
    return out


def scaled_quotient(ops, a: Term, b: Term, bound: int, unit: int) -> Term:
    """a / b in units of 1/unit, exactly, for an integer 1 <= b <= bound that divides ``unit`` (a case split)."""
    if not ops.symbolic:
        assert unit % b == 0
        return a * (unit // b)
    out = z3.IntVal(0)
    for j in range(1, bound + 1):
        out = z3.If(b == j, a * (unit // j), out)
    return out
