"""The engine's SGLang rules (policy `scheduler: sglang`) against SGLang 0.5.23's real scheduler, step by step.

The kept logs of tests/data/sglang/ (tests/sglang_driver.py in the SGLang venv, gzip'ed; tests/sglang_logs.py has
their cases and regenerates them) are compared with the engine under the policy `batchcheck import sglang --rules
sglang` makes from the driver's flags: check-log's reference comparison (scheduled tokens, preemptions and
finishes of every step, and the free blocks) and the streaming path the CLI runs (`batchcheck check-log POLICY LOG
--arrivals TRACE --conformance`, the default invariants included). These run everywhere, CI included; when the venv
exists the kept logs are also driven afresh and must come out byte for byte the same.
"""

from __future__ import annotations

import gzip
import json

import pytest

from tests import sglang_logs as L
from tests.sglang_harness import venv_python

KEPT = sorted(p.name.removesuffix(".log.jsonl.gz") for p in L.DATA.glob("*.log.jsonl.gz"))
MIN_SHARE = 0.99


def _why(name: str, result) -> str:
    return (f"{name}: {result.agreeing}/{result.steps} steps agree ({100 * result.share:.1f} %); first divergence "
            f"at step {result.first_divergence}: {result.detail}")


def test_the_kept_logs_are_the_cases():
    assert KEPT == sorted(c.name for c in L.CASES)
    for case in L.CASES:
        assert (L.DATA / f"{case.name}.trace.json").exists(), case.name


@pytest.mark.parametrize("name", KEPT)
def test_every_step_of_a_kept_log_agrees_with_the_engine(name, tmp_path):
    case = L.CASE[name]
    trace, log = L.kept(name, tmp_path)
    result = L.compare(trace, log, case.driver_flags(), name)
    assert result.steps >= 500, name
    assert result.share >= MIN_SHARE, _why(name, result)
    assert result.free_blocks_agreeing / result.steps >= MIN_SHARE, (
        f"{name}: free blocks agree on {result.free_blocks_agreeing}/{result.steps} steps")
    if case.radix:  # the tree's evictable and protected tokens, step by step
        assert result.tree_agreeing / result.steps >= MIN_SHARE, (
            f"{name}: evictable and protected tokens agree on {result.tree_agreeing}/{result.steps} steps")
    else:
        assert result.tree_agreeing is None, name


# SGLang 0.5.23's prompt truncation (two raw cuts in one pass, fixed-length requests): docs/semantics.md
EXPECTED_VIOLATIONS = {"ignore_eos_mixed_priority_p4": ("prompt_fully_computed", 569)}


@pytest.mark.parametrize("name", KEPT)
def test_check_log_streams_a_kept_log_and_agrees(name, tmp_path):
    """What `batchcheck check-log POLICY LOG --arrivals TRACE --conformance` does: the streaming path (fast-forward
    on), with the policy's default invariants."""
    case = L.CASE[name]
    trace, log = L.kept(name, tmp_path)
    result = L.check_log(trace, log, case.driver_flags(), name)
    assert result.conformance is not None
    assert result.conformance.share >= MIN_SHARE, _why(name, result.conformance)
    assert result.done == result.requests, name
    v = result.violation
    if name in EXPECTED_VIOLATIONS:  # a real SGLang bug in the log, which check-log must name
        assert (v.invariant, v.step) == EXPECTED_VIOLATIONS[name], name
        return
    assert v is None, f"{name}: {v.invariant} violated at step {v.step} (log line {v.line}):\n" + "\n".join(v.context)


def test_the_kept_logs_cover_the_rules():
    """Page sizes 1, 4 and 16; fcfs and lof; priority scheduling with preemption; mixed chunk; chunking off; aborts;
    retractions under KV pressure; each log at least 500 steps; the normal loop, no ignore_eos flag; the radix cache
    off, and on in at least three (shared prefixes hit, the tree evicted, lpm and dfs-weight, retractions)."""
    stats, flags = {}, {}
    for case in L.CASES:
        records = [json.loads(line) for line in gzip.decompress(
            (L.DATA / f"{case.name}.log.jsonl.gz").read_bytes()).decode().splitlines() if line.strip()]
        stats[case.name] = {"steps": len(records), "retracted": sum(len(r["retracted"]) for r in records),
                            "preempted": sum(len(r["preempted"]) for r in records),
                            "aborted": sum(len(r["aborted"]) for r in records)}
        fl = case.driver_flags()
        flags[case.name] = {fl[i]: fl[i + 1] if i + 1 < len(fl) else None for i in range(len(fl))
                            if fl[i].startswith("--")}
        assert ("--disable-radix-cache" in fl) != case.radix, case.name
        assert "--overlap" not in fl and "--ignore-eos" not in fl, case.name
        if case.radix:
            evictable = [r["evictable_tokens"] for r in records]
            stats[case.name]["evictions"] = sum(b < a for a, b in zip(evictable, evictable[1:]))
            rows_by_id = {r["id"]: r for r in json.loads((L.DATA / f"{case.name}.trace.json").read_text())}
            first_chunk: dict[str, int] = {}
            for r in records:
                for rid, n in r["scheduled"].items():
                    first_chunk.setdefault(rid, n)
            stats[case.name]["hits"] = sum(n < rows_by_id[rid]["prompt_tokens"] and n < 256
                                           for rid, n in first_chunk.items())
        rows = json.loads((L.DATA / f"{case.name}.trace.json").read_text())
        assert 120 <= len(rows) <= 200, case.name
        assert all(20 <= r["prompt_tokens"] <= 400 and 4 <= r["output_tokens"] <= 120 for r in rows), case.name
        if "--enable-priority-scheduling" in fl:
            assert all("priority" in r for r in rows), case.name
    assert len(stats) >= 7
    assert all(s["steps"] >= 500 for s in stats.values()), stats
    assert sum(s["retracted"] > 0 for s in stats.values()) >= 3, stats
    assert sum(s["aborted"] > 0 for s in stats.values()) >= 2, stats
    assert {f["--page-size"] for f in flags.values()} >= {"1", "4", "16"}
    assert {f.get("--schedule-policy", "fcfs") for f in flags.values()} >= {"fcfs", "lof"}
    assert any("--enable-mixed-chunk" in f for f in flags.values())
    assert any(f.get("--chunked-prefill-size") == "-1" for f in flags.values())
    preempting = [n for n, f in flags.items() if "--enable-priority-scheduling" in f
                  and "--disable-priority-preemption" not in f]
    assert preempting and any(stats[n]["preempted"] > 0 for n in preempting), stats
    radix = [c.name for c in L.CASES if c.radix]
    assert len(radix) >= 3, radix
    assert all(stats[n]["hits"] > 0 and stats[n]["evictions"] > 0 for n in radix), stats
    assert any(stats[n]["retracted"] > 0 for n in radix), stats
    assert {flags[n].get("--schedule-policy", "fcfs") for n in radix} >= {"lpm", "dfs-weight"}


def test_the_imported_policies_follow_the_sglang_rules():
    for case in L.CASES:
        policy = L.policy_for(case.driver_flags(), case.name)
        assert policy.scheduler.value == "sglang"
        fl = case.driver_flags()
        page = int(fl[fl.index("--page-size") + 1])
        assert policy.kv.block_size == page
        assert policy.kv.num_blocks == int(fl[fl.index("--pool-tokens") + 1]) // page
        assert policy.sglang.schedule_policy.value == (fl[fl.index("--schedule-policy") + 1]
                                                       if "--schedule-policy" in fl else "fcfs")


@pytest.mark.skipif(venv_python() is None, reason="the SGLang scheduler venv is absent (tools/sglang_setup.sh; "
                    "BATCHCHECK_SGLANG_VENV): the kept logs are compared all the same")
def test_the_real_scheduler_still_writes_the_kept_logs(tmp_path):
    """Driven afresh (one driver process, ~30 s of SGLang's import), every case writes its kept log byte for byte."""
    paths = L.drive_cases(L.CASES, tmp_path)
    for case in L.CASES:
        trace, log = paths[case.name]
        assert json.loads(trace.read_text()) == json.loads((L.DATA / f"{case.name}.trace.json").read_text())
        assert log.read_bytes() == gzip.decompress((L.DATA / f"{case.name}.log.jsonl.gz").read_bytes()), case.name


def test_the_driver_flags_become_the_import_arguments():
    assert L.import_args(["--page-size", "4", "--pool-tokens", "1600", "--max-running-requests", "6",
                          "--chunked-prefill-size", "-1", "--enable-priority-scheduling",
                          "--retract-decode-steps", "10",
                          "--max-context-len", "4096", "--max-steps", "900", "--disable-radix-cache", "--quiet"]) == [
        "--context-length", "4096", "--page-size", "4", "--max-total-tokens", "1600", "--max-running-requests", "6",
        "--chunked-prefill-size", "-1", "--enable-priority-scheduling", "SGLANG_RETRACT_DECODE_STEPS=10",
        "--disable-radix-cache", "--disable-overlap-schedule"]
    for flags in (["--overlap"], ["--ignore-eos"], ["--req-pool-size", "8"]):
        with pytest.raises(ValueError, match="no import argument for the driver flag"):
            L.import_args(flags)


def test_the_command_line_imports_and_checks_a_kept_log(tmp_path, capsys):
    """The user's path: `batchcheck import sglang --rules sglang ... --out P`, then `batchcheck check-log P LOG
    --arrivals TRACE --conformance` (a page-4 log with priority preemptions and aborts)."""
    from checker.cli import main

    name = "priority_low_first_p4"
    trace, log = L.kept(name, tmp_path)
    policy = tmp_path / f"{name}.yaml"
    assert main(["import", "sglang", "--rules", "sglang", "--out", str(policy),
                 *L.import_args(L.CASE[name].driver_flags())]) == 0
    capsys.readouterr()
    code = main(["check-log", str(policy), str(log), "--arrivals", str(trace), "--conformance"])
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.startswith("conformance with the engine under ")]
    assert len(lines) == 1, out
    agreeing, steps = map(int, lines[0].split(": ")[1].split(" steps agree")[0].split("/"))
    assert steps >= 500 and agreeing / steps >= MIN_SHARE, out
    assert "VIOLATED" not in out, out
    assert code in (0, 1) and (code == 0) == (agreeing == steps), out
