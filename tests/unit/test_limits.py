"""A limit that N request slots cannot reach (checker/semantics/limits.py): batch.max_num_seqs above N + 1 behaves as
N + 1 with N requests, so diff decides a change of it on OLD alone and says that no run reaches it (issue 19: the
default diff of a one-knob change within 2 min)."""

from __future__ import annotations

import random
from pathlib import Path

import yaml

from checker.api import run_diff
from checker.diff.compare import Change, Pair
from checker.exitcodes import ExitCode
from checker.inputfiles import load_policy
from checker.policy import Policy
from checker.requests import RequestSpec
from checker.semantics.limits import as_seen_by
from checker.verify.replay import replay_fixed_clock
from tests.helpers import POLICIES

ROOT = Path(__file__).resolve().parents[2]
V1 = POLICIES / "vllm_v1.yaml"

# Every line of the step semantics, its encoding, the engine, the proofs and the invariants that reads the field.
# Each compares it with a count of requests (or is SGLang's step token bound, which as_seen_by leaves alone): a new
# reader must be checked against limits.py's argument before it is added here.
READERS = {
    "checker/engine.py": ["max_seqs = policy.batch.max_num_seqs",
                          "running, max_seqs = len(s.running), s.policy.batch.max_num_seqs"],
    "checker/semantics/step.py": ["max_seqs = s.policy.batch.max_num_seqs"] * 3 + [
        "if len(s.running) > p.batch.max_num_seqs:",
        'problems.append(f"{len(s.running)} running > max_num_seqs={p.batch.max_num_seqs}")'],
    "checker/semantics/sglang.py": ["max_running = p.batch.max_num_seqs"],
    "checker/smt/sglang.py": ["max_running = p.batch.max_num_seqs"],  # the same rule, encoded (max_running - nb)
    "checker/smt/encode.py": [
        "fits_load = o.and_(self.running < p.batch.max_num_seqs, self.can_start_load(cur, ext))",
        "fits = o.and_(n > 0, self.running < p.batch.max_num_seqs, fits_kv)",
        "room = o.and_(self.budget > 0, True if inversion else self.running < p.batch.max_num_seqs)",
        "seq_full = False if inversion else o.and_(may_admit, self.running >= p.batch.max_num_seqs)"],
    "checker/verify/induction.py": ['out = [("seq_cap", running <= policy.batch.max_num_seqs)]'],
    "checker/verify/anyn.py": ["return run <= policy.batch.max_num_seqs"],
    "checker/verify/anyn_verify.py": ['f"{policy.batch.max_num_seqs}, token budget {policy.batch.max_num_batched_tokens:,}")'],
    "invariants/catalogue.py": ["return running <= ctx.policy.batch.max_num_seqs",
                                "return o.or_(running >= p.batch.max_num_seqs, o.not_(_any_slot(o, ctx, idle_for)))",
                                "return o.and_(running < ctx.policy.batch.max_num_seqs, _someone_waits(o, ctx, t))"],
}


def _readers() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for folder in ("checker/semantics", "checker/smt", "checker/verify", "invariants"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            _lines(path, found)
    _lines(ROOT / "checker" / "engine.py", found)
    return found


def _lines(path: Path, found: dict[str, list[str]]) -> None:
    lines = [line.strip() for line in path.read_text().splitlines()
             if "batch.max_num_seqs" in line and not line.strip().startswith(("#", '"', "'"))]
    rel = str(path.relative_to(ROOT))
    if lines and rel != "checker/semantics/limits.py":
        found[rel] = lines


def test_every_reader_of_max_num_seqs_compares_it_with_a_count_of_requests():
    assert _readers() == READERS


def _halved(value: int) -> Policy:
    doc = yaml.safe_load(V1.read_text())
    doc["batch"]["max_num_seqs"] = value
    return Policy.model_validate(doc)


def test_a_limit_above_the_slots_is_lowered_to_slots_plus_one_and_one_within_reach_is_kept():
    old = load_policy(V1)
    assert as_seen_by(old, 3).batch.max_num_seqs == 4
    assert as_seen_by(_halved(4), 3) == _halved(4) and as_seen_by(_halved(2), 3).batch.max_num_seqs == 2
    assert Pair(old, _halved(128), None, None).same_within(3)
    assert not Pair(old, _halved(3), None, None).same_within(3)  # 3 running requests reach a cap of 3


def test_the_engine_runs_the_same_steps_under_the_lowered_limit():
    rng = random.Random(7)
    policy = _halved(256)
    seen = as_seen_by(policy, 3)
    for _ in range(40):
        specs = []
        for rid in range(3):
            out = rng.randint(1, 10)
            specs.append(RequestSpec(rid, rng.choice([0, 0, 10_000, 20_000]), rng.randint(1, 16_000), out,
                                     rng.randint(out, 10), priority=rng.randint(0, 1)))
        a, b = (replay_fixed_clock(p, specs, 8, 10_000) for p in (policy, seen))
        assert a.frames == b.frames and a.decisions == b.decisions


def test_a_diff_of_an_unreached_limit_is_decided_on_old_alone_and_says_so():
    report = run_diff(V1, _halved(128), invariants=["seq_cap", "no_deadlock"], requests=2, depth=2, timeout_s=60,
                      out_dir=None, audit=False)
    seq_cap, deadlock = report.properties
    assert (seq_cap.change, deadlock.change) == (Change.EQUIVALENT, Change.EQUIVALENT)
    assert seq_cap.old_verdict == seq_cap.new_verdict == "PROVED"
    assert deadlock.strength == ("the same runs with 2 request slots: the rules differ only in limits no run of 2 "
                                 "requests reaches (HOLDS_UP_TO on both, within 2 requests, 2 iterations)")
    assert report.exit_code is ExitCode.INCONCLUSIVE  # no row saw the change: not a green gate
    lines = report.text().splitlines()
    assert lines[0] == ("diff vllm_v1 -> vllm_v1 (new): the change is not reached within the bounds: no row of 2 "
                        "properties saw it (see unreached:)  (exit 3)")
    assert lines[1] == "changed: batch.max_num_seqs: 256 -> 128"
    assert lines[2].startswith("unreached: with 2 request slots no run reaches the changed limits")


def test_a_limit_within_reach_is_checked_on_both_sides():
    report = run_diff(V1, _halved(1), invariants=["no_deadlock"], requests=2, depth=2, timeout_s=60, out_dir=None,
                      audit=False)
    (deadlock,) = report.properties
    assert deadlock.strength.startswith("checked within 2 requests") and report.unreached is None
