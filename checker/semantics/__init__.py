"""The scheduler step, defined once (docs/semantics.md). The engine iterates it; the Z3 encoder in
checker/smt mirrors it and is pinned to it by tests/conformance."""
