"""The project config of ``batchcheck ci`` (``batchcheck.toml``), validated by pydantic.

It names the policies (globs allowed), the invariants to verify with their parameters and bounds, the
fuzz budgets and SLO files, the liveness instances, and whether each finding gates the change (``error``) or only warns
(``warning``). Every bad value is reported as ``batchcheck.toml:LINE: path=value (expected ...)``.
The format is documented in docs/ci.md.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from checker.ci.tomllines import LineMap, toml_lines
from checker.errors import InputError, Problem
from checker.loading import MAX_DEPTH, check_depth, check_size, read_text, validate
from checker.parallel import MAX_JOBS

Level = Literal["error", "warning"]
"""error: the finding gates (exit 1 when violated); warning: it is reported, the exit code ignores it."""

MAX_REQUESTS = 16  # request slots: beyond this the bounded search does not finish in CI time
MAX_DEPTH = 64
MAX_TIMEOUT_S = 3600.0
MAX_EXAMPLES = 100_000
MAX_STATES = 10_000_000  # liveness: explored states (the graph lives in memory)
LivenessProperty = Literal["eventually_served", "no_livelock", "no_deadlock",
                           "no_hold_and_wait"]  # checker.liveness.lasso.ALL_PROPERTIES


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


Requests = Annotated[int, Field(ge=1, le=MAX_REQUESTS)]
Depth = Annotated[int, Field(ge=1, le=MAX_DEPTH)]
Timeout = Annotated[float, Field(gt=0, le=MAX_TIMEOUT_S)]
Names = Annotated[list[Annotated[str, Field(min_length=1)]], Field(min_length=1)]


class Defaults(_Strict):
    """What every [[verify]] and [[fuzz]] entry inherits unless it says otherwise ([[liveness]]: only level)."""

    requests: Requests = 3
    """Request slots of the bounded search (verify --requests)."""
    depth: Depth = 5
    """Iterations of the bounded search (verify --depth)."""
    timeout_s: Timeout = 60.0
    """Seconds per invariant (verify --timeout)."""
    unbounded: bool | None = None
    """verify's default when unset: the proof first (PROVED for N slots and any depth) where a proof method covers
    the policy, then the bounded search; true: the proof, refused where none covers it (verify --unbounded);
    false: the bounded search alone (verify --bounded-only, the default before issue 19)."""
    temporal_induction: bool = False
    """As verify --temporal-induction: the windowed temporal invariants (decode_progress, cancellation_releases,
    bounded_starvation) proved for N slots by k-induction; refused with unbounded = false."""
    level: Level = "error"
    """Whether a finding gates the change (error) or only warns (warning)."""


class Gate(_Strict):
    inconclusive: Level = "error"
    """What an inconclusive verdict (UNKNOWN, VACUOUS, a liveness NO_COUNTEREXAMPLE) of an error-level check
    does: error makes the run inconclusive (exit 3); warning only reports it."""
    split_vacuous: bool = False
    """As verify --split-vacuous: a gating VACUOUS whose situation never occurs at any depth (proved) is not
    inconclusive; the run exits 4 when it is the only gating finding that is not a pass (a VACUOUS not reached
    within the bounds stays inconclusive). Off: every VACUOUS is inconclusive, as before."""


class Output(_Strict):
    """Where results go (relative to the config file; the command-line flags override these)."""

    junit: str | None = None
    sarif: str | None = None
    summary: str | None = None
    counterexamples: str = "counterexamples"
    """Directory for the counterexamples of violated checks."""
    proofs: str | None = None
    """Directory for the certificates of PROVED checks (none: not kept)."""


class VerifyEntry(_Strict):
    """Invariants to check on some policies, with bounds (batchcheck verify)."""

    invariants: Names
    """NAME or NAME:PARAMS, as for ``verify --invariant``."""
    policies: Names | None = None
    """Policy files or globs (default: the top-level ``policies``)."""
    requests: Requests | None = None
    depth: Depth | None = None
    timeout_s: Timeout | None = None
    unbounded: bool | None = None
    temporal_induction: bool | None = None
    """As verify --temporal-induction (default: the [defaults] value)."""
    workload: str | None = None
    """Take length ranges, priorities and tenants from this workload."""
    level: Level | None = None


class FuzzEntry(_Strict):
    """An SLO fuzzing budget on some policies (batchcheck fuzz)."""

    workload: str
    slo: str | None = None
    """SLO file (default: NAME.slo.yaml next to the workload)."""
    properties: Names | None = None
    """Only these SLO properties (default: all in the file)."""
    policies: Names | None = None
    max_examples: Annotated[int, Field(ge=1, le=MAX_EXAMPLES)] = 100
    time_budget_s: Timeout = 30.0
    """Seconds per policy, shared by its properties."""
    seed: Annotated[int, Field(ge=0)] = 0
    max_requests: Annotated[int, Field(ge=1, le=1000)] = 20
    profile: str | None = None
    level: Level | None = None


class DiffEntry(_Strict):
    """Two versions of a policy to compare (``batchcheck diff OLD NEW``): see checker/ci/diffhook.py. Without
    ``old`` and ``new``, each policy file (``policies``, else the top-level ones) that changed since
    ``batchcheck ci --base REF`` is compared with its own version at REF."""

    old: str | None = None
    new: str | None = None
    policies: Names | None = None
    """Base-diff entries only: the policy files compared with their version at --base (default: the top level's)."""
    invariants: Names | None = None
    requests: Requests | None = None
    depth: Depth | None = None
    timeout_s: Timeout | None = None
    level: Level | None = None


Tokens = Annotated[list[Annotated[int, Field(ge=1)]], Field(min_length=1)]


class LivenessEntry(_Strict):
    """A small instance's state graph searched for lassos (batchcheck liveness); one check per property.
    The defaults are the liveness command's; only ``level`` comes from [defaults]."""

    policies: Names | None = None
    properties: Annotated[list[LivenessProperty], Field(min_length=1)] | None = None
    """Default: eventually_served, no_livelock, no_deadlock, and no_hold_and_wait under a KV connector."""
    requests: Requests = 2
    """Requests in the system at once (liveness --requests)."""
    prompts: Tokens | None = None
    """Prompt lengths (default: one KV block of the policy)."""
    outputs: Tokens = Field(default_factory=lambda: [1, 2])
    priorities: Annotated[list[int], Field(min_length=1)] | None = None
    """Default: 0 and 1 when the policy reads priorities, else 0."""
    tenants: Annotated[int, Field(ge=1, le=64)] = 1
    cancellations: bool = False
    identities: Annotated[list[Literal["own", "g0", "g1", "g0+1"]], Field(min_length=1)] | None = None
    """Prompt identities (liveness --identities; prefix caching only; default: g0 for a caching policy)."""
    external: Annotated[list[Literal["none", "block", "all"]], Field(min_length=1)] | None = None
    """A KV connector's external hits of the arrivals (liveness --external; default: the explorer's)."""
    accepted: Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)] | None = None
    """Speculative decoding: the verifier's accepted-draft counts explored (liveness --accepted; default 0..k)."""
    arrivals_per_step: Annotated[int, Field(ge=1, le=MAX_REQUESTS)] | None = None
    """At most this many arrivals per iteration (default: as many as there are free places)."""
    step_ms: Annotated[float, Field(gt=0, le=3_600_000)] = 10.0
    max_states: Annotated[int, Field(ge=1, le=MAX_STATES)] = 200_000
    timeout_s: Timeout = 60.0
    """Seconds for the exploration."""
    set: list[Annotated[str, Field(min_length=1)]] = Field(default_factory=list)
    """Policy overrides FIELD.PATH=VALUE for the instance (liveness --set)."""
    level: Level | None = None


class CiConfig(_Strict):
    policies: list[Annotated[str, Field(min_length=1)]] = Field(default_factory=list)
    """Policy files or globs that entries without their own ``policies`` check."""
    invariant_modules: list[str] = Field(default_factory=list)
    """User invariants: modules or .py files (relative to the config) with an INVARIANTS list."""
    jobs: Annotated[int | None, Field(ge=1, le=MAX_JOBS)] = None
    """Parallel checks on this machine (default: the number of CPUs)."""
    defaults: Defaults = Field(default_factory=Defaults)
    gate: Gate = Field(default_factory=Gate)
    output: Output = Field(default_factory=Output)
    verify: list[VerifyEntry] = Field(default_factory=list)
    fuzz: list[FuzzEntry] = Field(default_factory=list)
    diff: list[DiffEntry] = Field(default_factory=list)
    liveness: list[LivenessEntry] = Field(default_factory=list)


ENTRIES = "at least one [[verify]], [[fuzz]], [[diff]] or [[liveness]] entry"
_TOML_POSITION = re.compile(r"\s*\(at line (\d+), column \d+\)$|\s*\(at end of document\)$")


def parse_toml(text: str, source: str) -> tuple[dict, LineMap]:
    """Parse TOML text within the input limits (size, nesting); a syntax error is an input error at its line."""
    check_size(text, source, "a TOML config")
    try:
        data = tomllib.loads(text)
    except RecursionError:  # tomllib recurses per nested array or inline table
        raise InputError(Problem("", "<too deeply nested>", f"nesting at most {MAX_DEPTH} levels deep "
                                 "(arrays and tables)"), source) from None
    except tomllib.TOMLDecodeError as exc:
        message = str(exc)
        match = _TOML_POSITION.search(message)
        line = int(match.group(1)) if match and match.group(1) else (text.count("\n") + 1 if match else None)
        reason = _TOML_POSITION.sub("", message)
        raise InputError(Problem("", "<unparsable>", f"valid TOML: {reason}", line), source) from None
    check_depth(data, source)
    return data, toml_lines(text)


def load_config(path: str | Path) -> tuple[CiConfig, LineMap]:
    """Read and validate a config file; return it with its line map (for later, located errors)."""
    source = str(path)
    data, lines = parse_toml(read_text(path), source)
    if not data:
        raise InputError(Problem("", "<empty>", ENTRIES), source)
    config = validate(CiConfig, data, source, lambda: lines)
    if not (config.verify or config.fuzz or config.diff or config.liveness):
        raise InputError(Problem("verify", "<missing>", ENTRIES), source)
    return config, lines
