"""Input files as the checks take them: a policy file (named after the file when it names no policy), with
``--set FIELD.PATH=VALUE`` overrides; a trace's requests under trace options, never none.

An inputs-level module: it reads files into the input models and knows nothing of the semantics or the
checks built on them.
"""

from __future__ import annotations

from pathlib import Path

from checker.errors import InputError, Problem
from checker.loading import load_document, validate
from checker.policy import Policy
from checker.traces import RequestSet, TraceOptions, load_requests


PolicyInput = str | Path | Policy  # what the library's entry points take: a file, or a Policy built in Python


def load_policy(path: PolicyInput) -> Policy:
    """The policy a file holds (named after the file when it names none); a Policy object as it is (named
    "policy" when it names none), so that library callers can build or vary policies in Python."""
    if isinstance(path, Policy):
        return path if path.name is not None else path.model_copy(update={"name": "policy"})
    data, lines = load_document(path)
    policy = validate(Policy, data, str(path), lines)
    if policy.name is None:
        policy = policy.model_copy(update={"name": Path(path).stem})
    return policy


def policy_source(policy: PolicyInput) -> str | None:
    """The file a policy came from, as results and counterexamples record it (None for a Policy object: its
    whole spec is recorded anyway)."""
    return None if isinstance(policy, Policy) else str(policy)


def apply_overrides(policy: Policy, overrides: list[str] | None) -> Policy:
    """The policy with FIELD.PATH=VALUE settings applied (VALUE read as YAML), validated again."""
    import yaml

    if not overrides:
        return policy
    data = policy.model_dump(mode="json")
    for text in overrides:
        path, eq, raw = text.partition("=")
        parts = path.split(".") if path else []
        if not eq or not parts or not all(parts):
            raise InputError(Problem("--set", text, "FIELD.PATH=VALUE, e.g. batch.max_num_seqs=1"))
        node = data
        for part in parts[:-1]:
            if not isinstance(node.get(part), dict):
                node[part] = {}  # an unknown section: validation below names it
            node = node[part]
        try:
            node[parts[-1]] = yaml.safe_load(raw)
        except yaml.YAMLError:
            raise InputError(Problem("--set", text, "a YAML value after '='")) from None
    return validate(Policy, data, "--set")


def trace_requests(trace: str | Path, options: TraceOptions | None = None) -> RequestSet:
    """A trace's requests with the trace options applied; an input error when the window holds none."""
    rs = load_requests(trace=trace, options=options)
    if not rs.specs:
        window = options.window_s if options is not None else None
        shown = "<none>" if window is None else f"{window[0]:g}:{window[1]:g}"
        raise InputError(Problem("--window", shown, "a window holding at least one request of the trace"),
                         str(trace))
    return rs
