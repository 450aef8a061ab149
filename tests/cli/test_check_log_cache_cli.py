"""check-log on a real vLLM 0.33 log with prefix caching: no false violation from what a log cannot show."""

from __future__ import annotations

import gzip
from pathlib import Path

from checker.cli import main

DATA = Path(__file__).resolve().parent.parent / "data" / "vllm"


def _unpack(tmp_path: Path, name: str) -> tuple[str, str, str]:
    out = []
    for suffix in (".log.jsonl", ".trace.json"):
        path = tmp_path / f"{name}{suffix}"
        path.write_bytes(gzip.decompress((DATA / f"{name}{suffix}.gz").read_bytes()))
        out.append(str(path))
    return str(DATA / f"{name}.yaml"), out[0], out[1]


def test_a_correct_caching_log_passes_and_says_what_it_could_not_check(capsys, tmp_path):
    policy, log, arrivals = _unpack(tmp_path, "fcfs_groups_on")  # requests share prefixes: blocks are shared
    assert main(["check-log", policy, log, "--arrivals", arrivals, "--conformance"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == ("note: not checked under prefix caching: request_conservation, cancellation_releases (a log "
                      "shows no cache hits or shared blocks; --conformance compares the engine, which models the cache)")
    assert out[-1].endswith("572/572 steps agree (100.0 %)")


def test_asking_for_an_invariant_a_caching_log_cannot_show_is_refused(capsys, tmp_path):
    policy, log, arrivals = _unpack(tmp_path, "fcfs_groups_on")
    assert main(["check-log", policy, log, "--arrivals", arrivals, "--invariant", "request_conservation"]) == 2
    assert capsys.readouterr().err.startswith("batchcheck: error: --invariant='request_conservation' (expected an "
                                              "invariant a log can show under a policy with "
                                              "kv.prefix_caching.enabled")
