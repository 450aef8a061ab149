"""Workload generation builds no more than it keeps (issue 23): ``max_requests`` and ``--limit`` stop a class
at the limit, and a workload whose arrivals alone are too many is refused before any is drawn. The requests
are exactly those the generation gave before that change: the fingerprints below were taken from it (the
tree of 2026-12-01, before checker.workload.generate took a limit) on every shipped workload and on two
workloads made to break a lazy merge (overlapping bursts with cancels and a stop time; sessions with shared
prefixes, whose token runs are numbered across classes), each whole and with limits 1, 7 and 100."""

from __future__ import annotations

import hashlib
import resource
import time

import pytest

from checker.errors import InputError
from checker.traces import load_requests
from tests.helpers import ROOT

PIN = ROOT / "tests" / "data" / "workload_pin"
# (file, limit): (requests, sha256 of their repr, first 16 hex digits)
BEFORE = {
    ("chat_mixed.yaml", None): (323, "faa9ea8969426bcf"),
    ("chat_mixed.yaml", 1): (1, "06af956e7b311e58"),
    ("chat_mixed.yaml", 7): (7, "4759bf8439555466"),
    ("chat_mixed.yaml", 100): (100, "f2256075dfd12a02"),
    ("disaggregated_decode.yaml", None): (154, "743775aab4b44e6a"),
    ("disaggregated_decode.yaml", 1): (1, "497d513165eba548"),
    ("disaggregated_decode.yaml", 7): (7, "496f767ba1caeb44"),
    ("disaggregated_decode.yaml", 100): (100, "ba399d8cc31b1fed"),
    ("shared_prefixes.yaml", None): (401, "14740129fbfbd76f"),
    ("shared_prefixes.yaml", 1): (1, "b82c089cd7161731"),
    ("shared_prefixes.yaml", 7): (7, "042a8cb7d7ef88d2"),
    ("shared_prefixes.yaml", 100): (100, "c03f3472512d29e7"),
    ("tiered_normal.yaml", None): (450, "adfca7bdf89ead65"),
    ("tiered_normal.yaml", 1): (1, "3d52cf3938c51c6f"),
    ("tiered_normal.yaml", 7): (7, "e354aa1f44e446d5"),
    ("tiered_normal.yaml", 100): (100, "d81da488d745d88f"),
    ("tiered_overload_2x.yaml", None): (884, "d2be1c23ccd61652"),
    ("tiered_overload_2x.yaml", 1): (1, "a81edf9ba3d6c874"),
    ("tiered_overload_2x.yaml", 7): (7, "5a86c1446a48e160"),
    ("tiered_overload_2x.yaml", 100): (100, "d8c8e557f1df90e6"),
    ("weakness_cache_uncounted_hits.yaml", None): (110, "637f27e5d4bef7ef"),
    ("weakness_cache_uncounted_hits.yaml", 1): (1, "817994277994178f"),
    ("weakness_cache_uncounted_hits.yaml", 7): (7, "91f613b6590bc721"),
    ("weakness_cache_uncounted_hits.yaml", 100): (100, "bd5fa87669cb2d75"),
    ("weakness_unreserved_lookahead.yaml", None): (65, "216061f884d2f447"),
    ("weakness_unreserved_lookahead.yaml", 1): (1, "435a130fc0f2436a"),
    ("weakness_unreserved_lookahead.yaml", 7): (7, "a32086099929767a"),
    ("weakness_orca.yaml", None): (573, "9b1eb163bf0bf72d"),
    ("weakness_orca.yaml", 1): (1, "0ef88f91f64a3cec"),
    ("weakness_orca.yaml", 7): (7, "b7ae92a144cc28c9"),
    ("weakness_orca.yaml", 100): (100, "88ece62f3f5cfcd0"),
    ("weakness_sarathi_serve.yaml", None): (760, "b7e4b6a3070dead1"),
    ("weakness_sarathi_serve.yaml", 1): (1, "0518a855def75285"),
    ("weakness_sarathi_serve.yaml", 7): (7, "9d6bd713749127f2"),
    ("weakness_sarathi_serve.yaml", 100): (100, "98eba079750372d5"),
    ("weakness_static_batching.yaml", None): (176, "b01ee9dbddd76ba5"),
    ("weakness_static_batching.yaml", 1): (1, "3d14e41d0c2d5792"),
    ("weakness_static_batching.yaml", 7): (7, "301d9510e427b2f1"),
    ("weakness_static_batching.yaml", 100): (100, "c30b983daa8408f2"),
    ("weakness_strict_priority.yaml", None): (246, "06892f9e1ea6a555"),
    ("weakness_strict_priority.yaml", 1): (1, "4ddb85e9bbd2dbb3"),
    ("weakness_strict_priority.yaml", 7): (7, "8355d5c4f145556a"),
    ("weakness_strict_priority.yaml", 100): (100, "f5f122422a2c7257"),
    ("weakness_tgi_router.yaml", None): (600, "2a2b681d155854fe"),
    ("weakness_tgi_router.yaml", 1): (1, "2b80878f14fad14f"),
    ("weakness_tgi_router.yaml", 7): (7, "2ce191d306644732"),
    ("weakness_tgi_router.yaml", 100): (100, "8838665548db82b5"),
    ("weakness_trtllm_guaranteed_no_evict.yaml", None): (594, "ffc50e78eb15df40"),
    ("weakness_trtllm_guaranteed_no_evict.yaml", 1): (1, "16763111301b6caa"),
    ("weakness_trtllm_guaranteed_no_evict.yaml", 7): (7, "249a635eede25981"),
    ("weakness_trtllm_guaranteed_no_evict.yaml", 100): (100, "deb2e0d1fff02afe"),
    ("weakness_trtllm_max_utilization.yaml", None): (224, "53c33f7481615c21"),
    ("weakness_trtllm_max_utilization.yaml", 1): (1, "ac2f52c2e4b58dc9"),
    ("weakness_trtllm_max_utilization.yaml", 7): (7, "3e586eaec236e63e"),
    ("weakness_trtllm_max_utilization.yaml", 100): (100, "848dddbe5f350aac"),
    ("weakness_vllm_v0_no_chunking.yaml", None): (103, "34502a1c60838707"),
    ("weakness_vllm_v0_no_chunking.yaml", 1): (1, "86baba3428739cc2"),
    ("weakness_vllm_v0_no_chunking.yaml", 7): (7, "b51b29d4eb13e8c6"),
    ("weakness_vllm_v0_no_chunking.yaml", 100): (100, "1e7f6dda644c3dd3"),
    ("weakness_vllm_v1.yaml", None): (86, "95cff9979048375a"),
    ("weakness_vllm_v1.yaml", 1): (1, "d3236689c894f1da"),
    ("weakness_vllm_v1.yaml", 7): (7, "3c61df116d6c57d4"),
    ("weakness_vllm_v1.yaml", 100): (86, "95cff9979048375a"),
    ("weakness_vtc_fair.yaml", None): (684, "3ab23f9d4b46964b"),
    ("weakness_vtc_fair.yaml", 1): (1, "4a40b5c4fb8b0875"),
    ("weakness_vtc_fair.yaml", 7): (7, "28d1f436a58f6b45"),
    ("weakness_vtc_fair.yaml", 100): (100, "0a37867f06a45526"),
    ("pin/bursts.yaml", None): (40, "f1aac8ed9848f228"),
    ("pin/bursts.yaml", 1): (1, "1fd78ac481f07dd0"),
    ("pin/bursts.yaml", 7): (7, "ad2676a825ba2936"),
    ("pin/bursts.yaml", 100): (40, "f1aac8ed9848f228"),
    ("pin/sessions.yaml", None): (562, "971dde7bee12633e"),
    ("pin/sessions.yaml", 1): (1, "c80ce75ee3717c43"),
    ("pin/sessions.yaml", 7): (7, "17b37870bf4c17f8"),
    ("pin/sessions.yaml", 100): (100, "9748d0d9615555b3"),
}


def _path(name: str):
    return PIN / name.removeprefix("pin/") if name.startswith("pin/") else ROOT / "spec" / "workloads" / name


@pytest.mark.parametrize("name,limit", sorted(BEFORE, key=str))
def test_the_same_requests_as_before(name, limit):
    specs = load_requests(workload=_path(name), limit=limit).specs
    assert (len(specs), hashlib.sha256(repr(specs).encode()).hexdigest()[:16]) == BEFORE[name, limit]


def test_every_shipped_workload_is_pinned():
    shipped = {p.name for p in (ROOT / "spec" / "workloads").glob("*.yaml") if not p.name.endswith(".slo.yaml")}
    assert shipped == {n for n, _ in BEFORE if not n.startswith("pin/")}


def test_a_million_a_second_for_a_week_is_refused_before_any_arrival_is_drawn(tmp_path):
    path = tmp_path / "bomb.yaml"
    path.write_text("duration_s: 604800\nmax_requests: 10\nclasses:\n  - {name: a, arrival: {process: poisson, "
                    "rate_per_s: 1000000}, prompt_tokens: {dist: fixed, value: 8}, output_tokens: {dist: fixed, "
                    "value: 2}}\n")
    started = time.monotonic()
    with pytest.raises(InputError) as exc:
        load_requests(workload=path, limit=5)
    assert time.monotonic() - started < 5
    assert str(path) in str(exc.value) and "classes.0.arrival" in str(exc.value), str(exc.value)
    assert "at most 5,000,000 arrivals in all over duration_s=604800" in str(exc.value), str(exc.value)


def test_a_limit_stops_the_requests_of_a_large_workload(tmp_path):
    """4,000,000 arrivals drawn (the draws of a class come from one stream: all of them), 10 requests built:
    the memory of the times, not of four million requests."""
    path = tmp_path / "large.yaml"
    path.write_text("duration_s: 40\nclasses:\n  - {name: a, arrival: {process: poisson, rate_per_s: 100000}, "
                    "prompt_tokens: {dist: uniform, low: 1, high: 9}, output_tokens: {dist: fixed, value: 2}}\n")
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    specs = load_requests(workload=path, limit=10).specs
    assert [s.rid for s in specs] == list(range(10))
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert grown_mib < 600, grown_mib  # four million requests take several GiB
