"""The fleet: replicas behind a router, clients that retry, faults and recovery (docs/fleet.md).

spec (the fleet file) -> router, clients, faults -> simulation (the event loop over replicas that each step the
one semantics) -> metrics -> properties -> search (Hypothesis) and counterexample; run is what the facade calls,
report the text summary."""
