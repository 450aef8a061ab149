"""A small project for the `batchcheck ci` tests: three shipped policies copied into a temporary folder
and a config whose checks end in every kind of verdict (violated and gating, violated but warning only,
bounded holds, vacuous, a fuzz search)."""

from __future__ import annotations

import shutil
from pathlib import Path

from tests.helpers import POLICIES, ROOT

SAMPLE_CONFIG = """\
policies = ["spec/policies/*.yaml"]

[defaults]
requests = 2
depth = 2
timeout_s = 60
unbounded = false   # the bounded search alone: bounded holds and vacuous verdicts to report

[output]
counterexamples = "out/counterexamples"

[[verify]]
policies = ["spec/policies/unchecked_growth.yaml"]
invariants = ["kv_never_overcommitted"]

[[verify]]
policies = ["spec/policies/tgi_router.yaml"]
invariants = ["cancellation_releases:0"]
depth = 3
level = "warning"

[[verify]]
policies = ["spec/policies/vllm_v1.yaml", "spec/policies/tgi_router.yaml"]
invariants = ["token_budget"]

[[verify]]
policies = ["spec/policies/vllm_v1.yaml"]
invariants = [
  "kv_never_overcommitted",
]
requests = 1
depth = 1

[[fuzz]]
policies = ["spec/policies/vllm_v1.yaml"]
workload = "spec/workloads/chat_mixed.yaml"
slo = "spec/slo/kv_safety.slo.yaml"
max_examples = 5
time_budget_s = 5
"""

SAMPLE_POLICIES = {"vllm_v1.yaml": POLICIES / "vllm_v1.yaml", "tgi_router.yaml": POLICIES / "tgi_router.yaml",
                   "unchecked_growth.yaml": POLICIES / "broken" / "unchecked_growth.yaml"}


def make_project(folder: Path, config: str = SAMPLE_CONFIG) -> Path:
    """Lay out the sample project in ``folder``; return the config file."""
    (folder / "spec" / "policies").mkdir(parents=True, exist_ok=True)
    for name, source in SAMPLE_POLICIES.items():
        shutil.copy(source, folder / "spec" / "policies" / name)
    for sub in ("workloads", "slo"):
        shutil.copytree(ROOT / "spec" / sub, folder / "spec" / sub, dirs_exist_ok=True)
    path = folder / "batchcheck.toml"
    path.write_text(config)
    return path


def line_of(path: Path, prefix: str) -> int:
    """1-based line of the first line of ``path`` that starts with ``prefix`` (after indentation)."""
    for number, text in enumerate(path.read_text().splitlines(), start=1):
        if text.strip().startswith(prefix):
            return number
    raise AssertionError(f"{prefix!r} not in {path}")
