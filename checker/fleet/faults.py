"""The faults of a fleet run, as the simulation reads them: each replica's step-time factor at a time (slow
windows), and the timed fault events (a replica lost, the router noticing, the replica back, a view lost and
regained)."""

from __future__ import annotations

from dataclasses import dataclass

from checker.fleet.spec import Fault, LostFault, SlowFault, ViewLostFault


def us(ms: float) -> int:
    return round(ms * 1000)


@dataclass(frozen=True)
class FaultEvent:
    t_us: int
    what: str  # "lost", "detected", "recovered", "slow" (a window starts), "view_lost", "view_back"
    replica: int
    fault: int  # index into the fleet's faults


def fault_events(faults: list[Fault], replica_index: dict[str, int]) -> list[FaultEvent]:
    events = []
    for i, f in enumerate(faults):
        r = replica_index[f.replica]
        if isinstance(f, LostFault):
            events.append(FaultEvent(us(f.at_ms), "lost", r, i))
            events.append(FaultEvent(us(f.at_ms + f.detect_ms), "detected", r, i))
            if f.recover_after_ms is not None:
                events.append(FaultEvent(us(f.at_ms + f.recover_after_ms), "recovered", r, i))
        elif isinstance(f, SlowFault):  # the window itself is read by SlowWindows; this marks its start
            events.append(FaultEvent(us(f.start_ms), "slow", r, i))
        elif isinstance(f, ViewLostFault):
            events.append(FaultEvent(us(f.start_ms), "view_lost", r, i))
            events.append(FaultEvent(us(f.end_ms), "view_back", r, i))
    return sorted(events, key=lambda e: (e.t_us, e.fault, e.what))


class SlowWindows:
    """Step-time factors per replica: slow faults (the window the step starts in) and warm-up after a recovery."""

    def __init__(self, faults: list[Fault], replica_index: dict[str, int], num_replicas: int):
        self.windows: list[list[tuple[int, int, float]]] = [[] for _ in range(num_replicas)]
        for f in faults:
            if isinstance(f, SlowFault):
                self.windows[replica_index[f.replica]].append((us(f.start_ms), us(f.end_ms), f.factor))

    def warm_up(self, replica: int, start_us: int, f: LostFault) -> None:
        if f.warmup_ms > 0 and f.warmup_factor > 1:
            self.windows[replica].append((start_us, start_us + us(f.warmup_ms), f.warmup_factor))

    def next_start(self, replica: int, t_us: int) -> int | None:
        """The first window of the replica that starts after t_us (None: none)."""
        return min((start for start, _, _ in self.windows[replica] if start > t_us), default=None)

    def factor(self, replica: int, t_us: int) -> float:
        factor = 1.0
        for start, end, k in self.windows[replica]:
            if start <= t_us < end:
                factor *= k
        return factor

