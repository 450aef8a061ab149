"""Verification of invariants with z3: bounded model checking over the symbolic step, counterexamples
replayed on the engine before they are reported."""
