"""check-log's streaming checker is pinned to the whole-frame reference path (checker/checklog.py): for every
catalogue invariant, alone and together, the same first violation (invariant, step, log line, context) and
the same notes; and the engine in lockstep (with and without fast-forward) gives the same conformance as
recording every decision. The logs: engine logs of several policies, each mutated to break invariants, and
two real vLLM logs (tests/data/checklog), mutated too."""

from __future__ import annotations

import gzip
import json
import random

import pytest

from checker import checklog as cl
from checker.inputfiles import apply_overrides, load_policy
from checker.verify.run import parse_invariant
from invariants.catalogue import CATALOGUE
from tests.helpers import POLICIES, ROOT

DATA = ROOT / "tests" / "data" / "checklog"

# every catalogue invariant, at its defaults and with other parameters (tenant_fairness: short logs only)
SPECS = ["kv_never_overcommitted", "kv_never_overcommitted:headroom=3", "token_budget", "seq_cap",
         "request_conservation", "cancellation_releases", "cancellation_releases:steps=3", "decode_progress",
         "decode_progress:gap=3", "bounded_starvation", "bounded_starvation:steps=2",
         "bounded_starvation:steps=40", "no_deadlock",
         "no_deadlock:steps=1", "no_deadlock:steps=3", "bounded_preemptions", "bounded_preemptions:times=0",
         "work_conserving", "priority_inversion", "priority_inversion:bound=1", "degradation_order",
         "degradation_order:gap=2,protected=1", "block_pool_conservation", "no_referenced_block_reused",
         "hit_only_on_identical_chain", "scheduled_requests_run", "finished_releases", "finished_releases:steps=3",
         "no_hold_and_wait", "no_hold_and_wait:steps=2", "prompt_fully_computed", "sglang_memory_identity",
         "bounded_preemptions_per_step", "bounded_preemptions_per_step:p=0", "preemption_frees_capacity",
         "lookahead_fits"]

POLICY_CASES = {
    "vllm_small_pool": ("broken/vllm_v1_small_pool.yaml", []),
    "vllm_v1": ("vllm_v1.yaml", ["kv.num_blocks=40"]),
    "strict_priority": ("strict_priority.yaml", ["kv.num_blocks=40"]),
    "sarathi": ("sarathi_serve.yaml", ["kv.num_blocks=40"]),
    "v0_no_chunking": ("vllm_v0_no_chunking.yaml", ["kv.num_blocks=48"]),
    "three_seqs": ("vllm_v1.yaml", ["kv.num_blocks=60", "batch.max_num_seqs=3"]),  # seq_storm breaks seq_cap
}


def test_the_specs_cover_the_catalogue():
    assert {s.partition(":")[0] for s in SPECS} | {"tenant_fairness"} >= set(CATALOGUE)


def random_rows(seed: int, n: int = 14) -> list[dict]:
    rng = random.Random(seed)
    rows, step = [], 0
    for i in range(n):
        step += rng.choice([0, 1, 1, 2, 4])
        row = {"id": f"r{i}", "arrival_step": step, "prompt_tokens": rng.randint(10, 200),
               "output_tokens": rng.randint(3, 40), "priority": rng.randint(0, 3)}
        if rng.random() < 0.15:
            row["abort_step"] = step + rng.randint(0, 25)
        rows.append(row)
    return rows


def _busy(lines: list[dict]) -> int:
    """A step in the middle of the log with at least two requests scheduled."""
    busy = [k for k, line in enumerate(lines) if len(line["scheduled"]) >= 2]
    return busy[len(busy) // 2] if busy else len(lines) // 2


def _drop(lines: list[dict], rid: str) -> None:
    for line in lines:
        line["scheduled"].pop(rid, None)
        for key in ("preempted", "finished", "aborted"):
            line[key] = [x for x in line[key] if x != rid]


def m_over_budget(lines, rows):
    k = _busy(lines)
    lines[k]["scheduled"][next(iter(lines[k]["scheduled"]))] = 10**5


def m_kv_negative(lines, rows):
    lines[_busy(lines)]["free_blocks"] = -3


def m_free_off_by_one(lines, rows):
    lines[_busy(lines) + 1]["free_blocks"] += 1


def m_seq_storm(lines, rows):
    k = _busy(lines)
    arrived = [r["id"] for r in rows if r["arrival_step"] <= lines[k]["step"]]
    for rid in arrived:
        lines[k]["scheduled"].setdefault(rid, 1)


def m_preempt_thrice(lines, rows):
    k = _busy(lines)
    rid = next(iter(lines[k]["scheduled"]))
    for j in (k, k + 2, k + 4):
        if j < len(lines):
            lines[j]["scheduled"].pop(rid, None)
            lines[j]["preempted"].append(rid)


def m_finish_before_arrival(lines, rows):
    last = max(rows, key=lambda r: r["arrival_step"])["id"]
    _drop(lines, last)
    lines[0]["finished"].append(last)


def m_abort_before_arrival(lines, rows):
    last = max(rows, key=lambda r: r["arrival_step"])["id"]
    _drop(lines, last)
    lines[0]["aborted"].append(last)


def m_stall(lines, rows):
    k = _busy(lines)
    rid = next((x for x, n in lines[k]["scheduled"].items() if n == 1), next(iter(lines[k]["scheduled"])))
    for j in range(k + 1, min(k + 5, len(lines))):
        lines[j]["scheduled"].pop(rid, None)


def m_idle(lines, rows):
    k = _busy(lines)
    for j in (k, k + 1, k + 2):
        if j < len(lines):
            lines[j]["scheduled"] = {}


def m_late_start(lines, rows):
    del lines[:7]


def m_counts(lines, rows):
    for j in range(3, min(10, len(lines))):
        lines[j]["running"] += 1


def m_reschedule_finished(lines, rows):
    done = next(((k, line["finished"][0]) for k, line in enumerate(lines) if line["finished"]), None)
    if done is not None and done[0] + 2 < len(lines):
        lines[done[0] + 2]["scheduled"][done[1]] = 5


def m_abort_leak(lines, rows):
    """The first aborted request's blocks are never freed: free_blocks stays 3 lower from its abort on."""
    k = next((k for k, line in enumerate(lines) if line["aborted"]), None)
    for line in lines[k:] if k is not None else ():
        line["free_blocks"] = max(line["free_blocks"] - 3, 0)


def m_schedule_preempted(lines, rows):
    k = _busy(lines)
    lines[k]["preempted"].append(next(iter(lines[k]["scheduled"])))


def m_schedule_aborted(lines, rows):
    k = next((k for k, line in enumerate(lines) if line["aborted"]), None)
    if k is not None:
        lines[k]["scheduled"][lines[k]["aborted"][0]] = 4


MUTATIONS = {f.__name__[2:]: f for f in (m_over_budget, m_kv_negative, m_free_off_by_one, m_seq_storm,
                                         m_preempt_thrice, m_finish_before_arrival, m_abort_before_arrival,
                                         m_stall, m_idle, m_late_start, m_counts, m_reschedule_finished,
                                         m_abort_leak, m_schedule_preempted, m_schedule_aborted)}


def write_log(tmp_path, rows, lines, name="log"):
    arrivals = tmp_path / f"{name}.arrivals.json"
    arrivals.write_text(json.dumps(rows))
    log = tmp_path / f"{name}.jsonl"
    log.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return arrivals, log


def assert_same(policy, arrivals, steps, specs):
    """Each spec alone, then all together: the streaming verdict is the reference's."""
    for group in [[s] for s in specs] + [specs]:
        chosen = [parse_invariant(s) for s in group]
        violation, notes = cl.check_log(policy, arrivals, steps, chosen)
        got = cl.check_stream(policy, arrivals, iter(steps), chosen)
        assert got.violation == violation, group
        assert (got.notes, got.notes_total) == (notes[:cl.MAX_NOTES], len(notes)), group
        assert got.steps == len(steps)


def engine_case(tmp_path, policy_case, mutation, seed=3):
    path, overrides = POLICY_CASES[policy_case]
    policy = apply_overrides(load_policy(POLICIES / path), overrides)
    rows = random_rows(seed)
    arrivals_path, _ = write_log(tmp_path, rows, [])
    lines = cl.engine_log(policy, cl.load_arrivals(arrivals_path), 90)
    if mutation:
        MUTATIONS[mutation](lines, rows)
    arrivals_path, log = write_log(tmp_path, rows, lines)
    arrivals = cl.load_arrivals(arrivals_path)
    return policy, arrivals, cl.load_log(log, arrivals)


@pytest.mark.parametrize("policy_case", sorted(POLICY_CASES))
@pytest.mark.parametrize("mutation", [None, *MUTATIONS])
def test_engine_logs_give_the_reference_verdicts(tmp_path, policy_case, mutation):
    policy, arrivals, steps = engine_case(tmp_path, policy_case, mutation)
    assert_same(policy, arrivals, steps, SPECS)


@pytest.mark.parametrize("mutation", [None, "over_budget", "idle", "stall"])
def test_tenant_fairness_reads_the_whole_history_and_agrees(tmp_path, mutation):
    policy, arrivals, steps = engine_case(tmp_path, "vllm_small_pool", mutation)
    assert_same(policy, arrivals, steps[:25], ["tenant_fairness", "tenant_fairness:bound=10,tenants=1",
                                               "seq_cap", "decode_progress:gap=2"])


def real_case(tmp_path, name, mutation=None):
    policy = load_policy(DATA / f"vllm_{name}.yaml")
    rows = json.loads((DATA / "arrivals.json").read_text())
    lines = [json.loads(line) for line in gzip.decompress((DATA / f"vllm_{name}.log.jsonl.gz").read_bytes()).splitlines()]
    if mutation:
        MUTATIONS[mutation](lines, rows)
    arrivals_path, log = write_log(tmp_path, rows, lines, name)
    arrivals = cl.load_arrivals(arrivals_path)
    return policy, arrivals, cl.load_log(log, arrivals)


@pytest.mark.parametrize("name", ["fcfs", "priority"])
@pytest.mark.parametrize("mutation", [None, "over_budget", "free_off_by_one", "preempt_thrice", "stall", "idle",
                                      "finish_before_arrival", "late_start"])
def test_real_vllm_logs_give_the_reference_verdicts(tmp_path, name, mutation):
    policy, arrivals, steps = real_case(tmp_path, name, mutation)
    # priority_inversion's whole-frame reference costs ~5 s on these logs (pairs of 48 requests, every step):
    # on the unmutated logs only (the engine logs check it under every mutation)
    assert_same(policy, arrivals, steps, [s for s in SPECS if mutation is None or not s.startswith("priority_")])


def assert_same_conformance(policy, arrivals, steps):
    reference = cl.conformance(policy, arrivals, steps)
    for fast_forward in (True, False):
        lockstep = cl.Lockstep(policy, arrivals, fast_forward)
        for entry in steps:
            lockstep.feed(entry)
        assert lockstep.result() == reference, fast_forward
    return reference


@pytest.mark.parametrize("policy_case", sorted(POLICY_CASES))
@pytest.mark.parametrize("mutation", [None, "over_budget", "preempt_thrice", "stall", "late_start", "idle"])
def test_lockstep_conformance_is_the_recorded_replays(tmp_path, policy_case, mutation):
    policy, arrivals, steps = engine_case(tmp_path, policy_case, mutation, seed=11)
    reference = assert_same_conformance(policy, arrivals, steps)
    assert (reference.first_divergence is None) == (mutation in (None, "late_start"))


@pytest.mark.parametrize("name", ["fcfs", "priority"])
@pytest.mark.parametrize("mutation", [None, "stall", "preempt_thrice"])
def test_lockstep_conformance_on_real_logs(tmp_path, name, mutation):
    policy, arrivals, steps = real_case(tmp_path, name, mutation)
    reference = assert_same_conformance(policy, arrivals, steps)
    if mutation is None:
        assert reference.agreeing == reference.steps


@pytest.mark.parametrize("case", [("vllm_v1.yaml", []), ("connector/vllm_v1_decode_node.yaml", []),
                                  ("connector/vllm_v1_decode_node.yaml", ["connector.kind=both"])])
def test_request_conservation_reads_only_what_its_memo_key_says(case):
    """check-log remembers request_conservation's verdicts by conservation_reads of each request and the KV in use
    less the others' blocks: the predicate, on random restricted frames, gives the same verdict on two frames that
    agree on those and differ in everything else (statuses out of range, negative blocks and held states of
    each connector role included)."""
    path, overrides = case
    policy = apply_overrides(load_policy(POLICIES / path), overrides)
    check = CATALOGUE["request_conservation"].check
    rng = random.Random(7)

    def verdict(slots, rest):
        kv = rest + sum(s["blocks"] for s in slots)
        frame = cl._frame(tuple(slots), (0,) * len(slots), (False,) * len(slots), (False,) * len(slots), kv, 0)
        return bool(check(cl.IntOps, cl._context(policy, (), cl._Frames(0, [frame])), 0))

    def slot(status, sign, no_swap, no_release):
        s = {f: rng.randint(0, 50) for f in cl.FIELDS}
        s.update(status=status, blocks=sign * rng.randint(1, 9), swapped_blocks=0 if no_swap else rng.randint(1, 9),
                 release_step=-1 if no_release else rng.randint(0, 9))
        return s

    verdicts = []
    for _ in range(3000):
        reads = [(rng.randint(-1, 8), rng.choice((-1, 0, 1, 1)), rng.random() < 0.8, rng.random() < 0.7)
                 for _ in range(rng.randint(0, 3))]
        rest = rng.choice((0, 0, 0, -1, 2))
        one, two = [slot(*r) for r in reads], [slot(*r) for r in reads]
        assert [cl.conservation_reads(s) for s in one] == [cl.conservation_reads(s) for s in two] == reads
        verdicts.append(verdict(one, rest))
        assert verdict(two, rest) == verdicts[-1], (reads, rest)
    assert 300 < sum(verdicts) < 2700  # both verdicts, often


@pytest.mark.parametrize("name", ["fcfs", "priority"])
@pytest.mark.parametrize("mutation", [None, "preempt_thrice", "schedule_preempted", "reschedule_finished"])
def test_the_running_set_is_the_running_statuses(tmp_path, name, mutation):
    """seq_cap's and scheduled_requests_run's memo keys read Observed.running for the statuses: at every step it
    is exactly the requests whose status is RUNNING."""
    policy, arrivals, steps = real_case(tmp_path, name, mutation)
    obs = cl.Observed(policy, arrivals)
    for entry in steps:
        obs.apply(entry)
        assert obs.running == {r for r, s in enumerate(obs.slots) if s["status"] == cl.RUNNING}, entry.step


def stretch_kinds(lockstep):
    """Count the stretches that end with a finishing step and the arrivals that join one (wrapping _stretch)."""
    kinds = {"finishing": 0, "joined": 0}
    plan = lockstep._stretch

    def counting(start):
        arrived = lockstep.clock.ai
        plan(start)
        kinds["finishing"] += bool(lockstep.quiet_finished) and lockstep.quiet_until > start
        kinds["joined"] += lockstep.clock.ai - arrived
    lockstep._stretch = counting
    return kinds


@pytest.mark.parametrize("name", ["fcfs", "priority"])
def test_lockstep_stretches_decide_each_step_as_plain_stepping(tmp_path, name):
    """The fast-forward's stretches (arrivals joining behind the queue's head, a last step that finishes
    requests) give every step the decision plain stepping gives it: the same scheduled tokens in the same
    order, the same preempted and finished requests."""
    policy, arrivals, steps = real_case(tmp_path, name)
    fast, plain = cl.Lockstep(policy, arrivals), cl.Lockstep(policy, arrivals, fast_forward=False)
    kinds = stretch_kinds(fast)
    for entry in steps:
        ours, theirs = fast.engine(entry.step), plain.engine(entry.step)
        assert (list(ours[0].items()), ours[1], ours[2]) == (list(theirs[0].items()), theirs[1], theirs[2]), entry.step
    assert fast.s.kv_used == plain.s.kv_used and fast.s.step == plain.s.step
    assert [(r.status, r.num_computed, r.num_generated, r.blocks) for r in fast.s.requests] == \
        [(r.status, r.num_computed, r.num_generated, r.blocks) for r in plain.s.requests]
    assert kinds["finishing"] > 0 and kinds["joined"] > 0, kinds  # both kinds occur on these logs


def test_the_fast_forward_covers_most_steps_of_a_decode_heavy_log(tmp_path):
    policy, arrivals, steps = real_case(tmp_path, "fcfs")
    lockstep = cl.Lockstep(policy, arrivals)
    stepped = 0
    for entry in steps:
        stepped += entry.step >= lockstep.quiet_until
        lockstep.feed(entry)
    assert lockstep.agreeing == len(steps) and stepped < 0.6 * len(steps)


def test_memory_does_not_grow_with_the_log(tmp_path):
    """What the checker keeps is bounded by the requests and the windows, not by the steps read."""
    policy, arrivals, steps = real_case(tmp_path, "fcfs")
    chosen = [parse_invariant(s) for s in ("request_conservation", "decode_progress:gap=3", "no_deadlock:steps=3",
                                           "cancellation_releases:steps=3", "degradation_order:gap=3,protected=5")]
    checker = cl.Incremental(policy, arrivals, chosen)
    for entry in steps:
        assert checker.step(entry) is None
    assert checker.frames == [] and len(checker.ring) == checker.window + 1 == 4
    assert all(len(h) <= checker.window + 1 for h in checker.obs.history.values())
    lean = cl.Incremental(policy, arrivals, [parse_invariant(s) for s in cl.CHECK_LOG_INVARIANTS[:4]])
    for entry in steps:
        lean.step(entry)
    assert lean.obs.keep is None and lean.obs.history == {} and len(lean.ring) == 0
    defaults = cl.Incremental(policy, arrivals, [parse_invariant(s) for s in cl.default_invariants(policy)])
    for entry in steps:
        defaults.step(entry)  # cancellation_releases is incremental too: no history, whatever its steps
    assert defaults.obs.keep is None and defaults.obs.history == {} and len(defaults.ring) == 0


def test_a_window_read_beyond_the_table_is_an_internal_error(tmp_path, monkeypatch):
    policy, arrivals, steps = engine_case(tmp_path, "vllm_small_pool", None)
    monkeypatch.setitem(cl.WINDOW, CATALOGUE["decode_progress"].check, (lambda p: 0, "running"))  # it reads 2 back
    checker = cl.Incremental(policy, arrivals, [parse_invariant("decode_progress:gap=2")])
    with pytest.raises(cl.InternalError, match="read frame"):
        for entry in steps:
            checker.step(entry)


def sequential_log(n: int) -> tuple[list[dict], list[dict]]:
    """Request i arrives at step 10 i, is prefilled (16 tokens) there, decodes 6 more tokens and finishes:
    one live request at a time, however many the arrivals file holds."""
    rows = [{"id": f"s{i}", "arrival_step": 10 * i, "prompt_tokens": 16, "output_tokens": 7} for i in range(n)]
    lines = []
    for k in range(10 * n):
        i, j = divmod(k, 10)
        live = j < 7
        lines.append({"step": k, "scheduled": {f"s{i}": 16 if j == 0 else 1} if live else {}, "preempted": [],
                      "finished": [f"s{i}"] if j == 6 else [], "aborted": [], "running": int(j < 6),
                      "waiting": 0, "free_blocks": 32 - (1 if j == 0 else 2) if j < 6 else 32})
    return rows, lines


def test_the_work_per_step_follows_the_events_not_the_requests(tmp_path, monkeypatch):
    """With one live request at a time, the requests the invariants look at per step (after the first,
    which checks every request once) do not grow with the arrivals file: 50 or 500 requests alike. (No
    remembered verdicts here, so that every step evaluates.)"""
    policy = load_policy(POLICIES / "broken" / "vllm_v1_small_pool.yaml")
    monkeypatch.setattr(cl, "MEMO_LIMIT", -1)
    looked_at = {}
    for n in (50, 500):
        rows, lines = sequential_log(n)
        arrivals_path, log = write_log(tmp_path, rows, lines, f"seq{n}")
        arrivals = cl.load_arrivals(arrivals_path)
        counted = [0]
        restricted = cl.Incremental._restricted

        def counting(self, rids, kv_used, counted=counted):
            if self.obs.t > 0:
                counted[0] += len(rids)
            return restricted(self, rids, kv_used)

        monkeypatch.setattr(cl.Incremental, "_restricted", counting)
        result = cl.check_stream(policy, arrivals, cl.stream_log(log, arrivals),
                                 [parse_invariant(s) for s in cl.CHECK_LOG_INVARIANTS + ("bounded_preemptions",)])
        assert result.violation is None and result.notes == [] and result.steps == 10 * n
        looked_at[n] = counted[0] / result.steps
        monkeypatch.setattr(cl.Incremental, "_restricted", restricted)
    # about one request per step for each invariant that reads the scheduled one (token_budget,
    # scheduled_requests_run) and a few more where statuses change: 2.3 with 50 or 500 requests
    assert looked_at[500] <= looked_at[50] * 1.05 and looked_at[50] < 3, looked_at
