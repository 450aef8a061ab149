"""The sections of a counterexample file a report reads, validated before anything is replayed.

``checker.verify.counterexample.load`` checks the format and that the sections exist; this model checks
their contents (a corrupted file: a request without a prompt, a policy spec that is no policy, an
iteration that is not a number), so that bad input is a located input error, never a crash.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, model_validator
from pydantic_core import PydanticCustomError

from checker.fuzz.slo import Property
from checker.loading import validate
from checker.policy import MAX_TOKENS, Policy
from checker.profile import Profile
from checker.verify import counterexample as cex

# integers are strict (no 0.0, no "3"): replay reads the raw document, so a value pydantic would coerce must be
# refused here, not reach the engine as a float or a string
Tokens = Annotated[StrictInt, Field(ge=1, le=MAX_TOKENS)]
Millis = Annotated[float, Field(ge=0, le=1e12)]  # the JSON trace's bound (checker.traces.TraceRequest)
MAX_ITERATIONS = 100_000
"""The last iteration a counterexample may record: replay steps the engine that far."""


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True, populate_by_name=True)


class CexRequest(_Open):
    id: Annotated[StrictInt, Field(ge=0)]
    arrival_ms: Millis
    prompt_tokens: Tokens
    output_tokens: Tokens
    max_output_tokens: Tokens
    priority: Annotated[StrictInt, Field(ge=-1_000_000, le=1_000_000)] = 0
    tenant: Annotated[StrictInt, Field(ge=0, le=1_000_000)] | str = 0
    class_: Annotated[str | None, Field(alias="class")] = None
    cancel_after_ms: Millis | None = None
    # generated workloads' prompts use negative token ids (checker.workload.TokenNames), traces' positive ones
    prompt_runs: list[tuple[Annotated[StrictInt, Field(ge=-2**62, le=2**62)], Tokens]] | None = None


class CexPolicy(_Open):
    name: str | None = None
    file: str | None = None
    sha256: str
    spec: Policy


class CexProperty(_Open):
    kind: Literal["invariant", "slo", "liveness"]
    name: Annotated[str, Field(min_length=1)]
    params: dict[str, StrictInt] = {}
    statement: str | None = None
    module: str | None = None  # a user invariant's --invariant-module, as given when it was found
    spec: Property | None = None
    observed: float | None = None
    allowed: float | None = None
    detail: str | None = None


class CexClock(_Open):
    step_us: Annotated[StrictInt, Field(ge=1, le=3_600_000_000)]


class CexViolation(_Open):
    iteration: Annotated[StrictInt | None, Field(ge=0, le=MAX_ITERATIONS)] = None


class CexProfile(_Open):
    name: str | None = None
    spec: Profile


class CounterexampleDoc(_Open):
    """A counterexample file (docs/counterexamples.md) as the report reads it."""

    policy: CexPolicy
    property: CexProperty
    verdict: dict[str, Any] = {}
    environment: dict[str, Any] = {}
    requests: Annotated[list[CexRequest], Field(min_length=1)]
    clock: CexClock | None = None
    violation: CexViolation = CexViolation()
    profile: CexProfile | None = None

    @model_validator(mode="after")
    def _consistent(self) -> CounterexampleDoc:
        for index, row in enumerate(self.requests):
            if self.property.kind != "slo" and not isinstance(row.tenant, int):  # SLO files name tenants
                raise _inconsistent(f"requests[{index}].tenant", row.tenant, "a tenant number >= 0")
            if row.id != index:
                raise _inconsistent(f"requests[{index}].id", row.id, f"{index} (requests numbered in order)")
            if row.max_output_tokens < row.output_tokens:
                raise _inconsistent(f"requests[{index}].max_output_tokens", row.max_output_tokens,
                                    f">= output_tokens={row.output_tokens}")
        if self.property.kind in ("invariant", "liveness"):
            what = "a lasso file" if self.is_lasso else "an invariant counterexample"
            if self.clock is None:
                raise _inconsistent("clock", "<missing>", f"the fixed clock of {what}")
            if self.violation.iteration is None:
                raise _inconsistent("violation.iteration", "<missing>", "the last iteration of the lasso's second turn"
                                    if self.is_lasso else "the iteration at which the invariant fails")
            states = (self.model_extra or {}).get("states")
            if isinstance(states, list) and self.violation.iteration != len(states) - 1:
                raise _inconsistent("violation.iteration", self.violation.iteration,
                                    f"{len(states) - 1}, the last of the {len(states)} recorded states")
            if self.is_lasso:
                self._lasso_consistent()
        else:
            if self.property.spec is None:
                raise _inconsistent("property.spec", "<missing>", "the SLO property's spec")
            if self.profile is None:
                raise _inconsistent("profile", "<missing>", "the service-curve profile of an SLO counterexample")
        return self

    def _lasso_consistent(self) -> None:
        params = self.property.params
        for key, least in (("prefix", 0), ("cycle", 1)):
            if not isinstance(params.get(key), int) or params[key] < least:
                raise _inconsistent(f"property.params.{key}", params.get(key, "<missing>"),
                                    f"an integer >= {least} (the lasso's {key} iterations)")
        last = params["prefix"] + 2 * params["cycle"] - 1
        if self.violation.iteration != last:
            raise _inconsistent("violation.iteration", self.violation.iteration,
                                f"{last}: the last iteration of the second turn (prefix + 2 x cycle - 1)")

    @property
    def is_slo(self) -> bool:
        return self.property.kind == "slo"

    @property
    def is_lasso(self) -> bool:
        """A liveness counterexample (``batchcheck liveness``): a prefix and two turns of a cycle."""
        return self.property.kind == "liveness"

    @property
    def prefix(self) -> int:
        return self.property.params["prefix"] if self.is_lasso else 0

    @property
    def cycle(self) -> int:
        return self.property.params["cycle"] if self.is_lasso else 0

    @property
    def graph(self) -> dict[str, Any]:
        """The state graph a lasso was found in, as stored (``graph``: states, edges, generated, seconds, complete)."""
        graph = (self.model_extra or {}).get("graph")
        return graph if isinstance(graph, dict) else {}


def _inconsistent(field: str, value: object, expected: str) -> PydanticCustomError:
    return PydanticCustomError("consistency", "", {"field": field, "value": value, "expected": expected})


def load_counterexample(path: str | Path, invariant_modules: list[str] | None = None
                        ) -> tuple[dict[str, Any], CounterexampleDoc]:
    """The raw document (for the replay functions) and its validated sections. InputError on bad input.
    A user invariant's module is loaded first: ``invariant_modules`` (--invariant-module), then the one the
    file records (``property.module``)."""
    from checker.loading import load_document
    from invariants.catalogue import CATALOGUE
    from invariants.plugins import ORIGINS, load_module, load_recorded

    for module in invariant_modules or []:
        if not any(m == module and n in CATALOGUE for n, m in ORIGINS.items()):  # loaded once per process
            load_module(module)
    doc = cex.load(path)
    prop = doc["property"]
    if prop.get("kind") == "invariant" and isinstance(prop.get("module"), str) and isinstance(prop.get("name"), str):
        load_recorded(prop["name"], prop["module"], str(path))
    _, lines = load_document(path)
    return doc, validate(CounterexampleDoc, doc, str(path), lines)
