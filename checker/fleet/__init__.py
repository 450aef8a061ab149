"""The fleet: replicas behind a router, clients that retry, faults and recovery (docs/fleet.md).

spec (the fleet file) -> router, clients, faults -> simulation (the event loop over replicas that each step the
one semantics) -> metrics -> properties (and their Hypothesis search)."""
