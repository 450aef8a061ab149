"""The invariant catalogue: small named predicates, one property each (cf. TLA+ specs).

Each invariant states its property in one sentence (its docstring) and is evaluated on the engine's
concrete state after a step (``holds(state, decision)``). The symbolic form of each invariant, over
z3 terms, comes with the verification engine (issue: Z3 verification).
"""

from invariants.catalogue import CATALOGUE, Invariant, get, invariant

__all__ = ["CATALOGUE", "Invariant", "get", "invariant"]
