"""SGLang's radix cache (policy `sglang.radix_cache: true`; checker/semantics/radix.py and its wiring in
checker/semantics/sglang.py), traced by hand from SGLang 0.5.23's code (docs/semantics.md, "SGLang's radix cache").
The kept radix logs of tests/data/sglang/ pin the whole against the real scheduler (test_sglang_conformance)."""

from __future__ import annotations

import pytest

from checker.cli import main
from checker.policy import Policy
from checker.requests import RequestSpec
from checker.semantics import sglang
from checker.semantics.radix import Tree
from checker.semantics.state import SchedulerState, Status
from checker.semantics.step import step


def policy(**over) -> Policy:
    data = {"scheduler": "sglang", "max_model_len": 4096, "kv": {"block_size": 4, "num_blocks": 100},
            "batch": {"max_num_seqs": 8, "max_num_batched_tokens": 256, "phase_mode": "prefill_first"},
            "preemption": {"victim": "fewest_generated"}, "sglang": {"radix_cache": True}}
    for key, value in over.items():
        data[key] = {**data.get(key, {}), **value} if isinstance(value, dict) else value
    return Policy.model_validate(data)


def group(rid: int, prompt: int, output: int, g: int, arrival_step: int = 0) -> RequestSpec:
    return RequestSpec(rid=rid, arrival_us=arrival_step * 1000, prompt_len=prompt, output_len=output,
                       max_output=output, content=((g * 1_000_000, prompt),))


def run(pol: Policy, specs: list[RequestSpec], steps: int) -> tuple[SchedulerState, list]:
    s = SchedulerState(pol, specs)
    decisions = []
    for k in range(steps):
        arrivals = [r for r in s.requests if r.arrival_us == k * 1000 and r.status is Status.PENDING]
        decisions.append(step(s, arrivals, [], k * 1000))
        check_accounting(s)
    return s, decisions


def check_accounting(s: SchedulerState) -> None:
    """SGLang's memory identity in the engine's terms: the pages in use are the requests' own plus the tree's
    protected ones, and the evictable ones fit in what is free."""
    tree, page = s.sglang.tree, s.policy.kv.block_size
    assert s.kv_used * page == tree.protected + page * sum(r.blocks for r in s.requests)
    assert tree.evictable <= (s.policy.kv.num_blocks - s.kv_used) * page


# ----------------------------------------------------------------------------------------- the tree
def test_match_is_page_aligned_splits_and_stamps_the_path():
    t = Tree(4)
    leaf, dup, new = t.insert(tuple(range(10)), 10, 0)
    assert (len(leaf.key), dup, new, t.evictable) == (8, 0, 8, 8)  # 10 tokens: two whole pages
    n, node = t.match(tuple(range(6)) + (99, 99))
    assert n == 4 and len(node.key) == 4 and len(leaf.key) == 4 and leaf.parent is node  # split at the page
    assert node.time > leaf.time - 1  # the matched node was stamped after the split
    assert t.match((0, 1, 2))[0] == 0  # shorter than a page: no match (and no stamp)


def test_insert_frees_duplicates_beyond_the_protected_prefix():
    t = Tree(2)
    t.insert((1, 2, 3, 4, 5, 6), 6, 0)
    _, dup, new = t.insert((1, 2, 3, 4, 7, 8), 6, 2)  # its first page was its own locked prefix
    assert (dup, new) == (2, 2)  # page (3, 4) was the tree's already: the request's copy is a duplicate


def test_locks_move_tokens_between_evictable_and_protected_and_eviction_takes_lru_leaves():
    t = Tree(1)
    a = t.insert((1, 2, 3), 3, 0)[0]
    b = t.insert((1, 2, 9), 3, 0)[0]  # splits (1, 2) off: a and b are leaves under it
    t.lock(b)
    assert (t.evictable, t.protected) == (1, 3)
    assert t.evict(1) == 1 and a.parent is None  # a: the only unlocked leaf
    t.unlock(b)
    t.match((1, 2, 9))  # b and its parent stamped now
    assert (t.evictable, t.protected) == (3, 0)
    assert t.evict(2) == 3  # b, then its parent (a leaf now): whole nodes
    assert t.size() == 0


def test_dfs_weight_visits_the_heaviest_subtree_first_and_a_nodes_own_requests_after_it():
    t = Tree(1)
    x = t.insert((1, 1), 2, 0)[0]
    y = t.insert((2, 2), 2, 0)[0]
    # requests ending at x (one), at y (two), at the root (one): y's subtree first, the root's own last
    assert t.dfs_weight_order([x, t.root, y, y]) == [2, 3, 0, 1]


def test_copy_and_snapshot_follow_the_tree():
    t = Tree(1)
    t.insert((1, 2), 2, 0)
    t.insert((3, 4), 2, 0)
    c, by_id = t.copy()
    assert c.snapshot() == t.snapshot() and set(by_id) == {0, 1, 2}
    c.match((3, 4))
    assert c.snapshot() == t.snapshot()  # (3, 4) was the newer leaf already: the same order
    c.match((1, 2))
    assert c.snapshot() != t.snapshot()  # now (1, 2) is: the access order is part of the state
    assert t.evict(1) == 2 and c.evict(1) == 2
    assert [tuple(n.key) for n in t.root.children.values()] == [(3, 4)]
    assert [tuple(n.key) for n in c.root.children.values()] == [(1, 2)]


# ----------------------------------------------------------------------------------------- the rules
def test_a_second_request_of_a_group_starts_from_the_cached_prefix():
    pol = policy()
    s, ds = run(pol, [group(0, 40, 2, 7), group(1, 60, 2, 7, arrival_step=3)], 8)
    assert dict(ds[0].scheduled) == {0: 40}
    assert dict(ds[3].scheduled) == {1: 60 - 40}  # request 0 cached 40 tokens (10 pages) at its first output
    assert all(r.status is Status.FINISHED for r in s.requests)
    tree = s.sglang.tree
    # request 1 ended with 60 + 2 - 1 = 61 tokens of KV: its 15 whole pages (group 7's first 60 tokens, request 0's
    # 40 among them) stay in the tree, unlocked; the partial page was freed
    assert (tree.evictable, tree.protected) == (60, 0)


def test_lpm_sorts_by_cached_prefix_and_falls_back_to_fcfs_above_128_waiting():
    pol = policy(sglang={"radix_cache": True, "schedule_policy": "lpm"})
    s = SchedulerState(pol, [group(0, 40, 1, 7), group(1, 40, 1, 8), group(2, 40, 1, 7)])
    g = s.sglang
    s.waiting = list(s.requests)
    g.tree.insert(sglang.prompt_tokens(s, s.requests[2]), 40, 0)  # group 7 is cached
    sglang._sort_queue(s, g)
    assert [r.rid for r in s.waiting] == [0, 2, 1]  # the two cached ones first, stable among them
    s.waiting = [s.requests[1], s.requests[0]] * 65  # 130 waiting: fcfs, no matching at all
    before = g.tree.snapshot()
    sglang._sort_queue(s, g)
    assert [r.rid for r in s.waiting[:2]] == [1, 0]
    assert g.tree.snapshot() != before  # ... but the waiting-prefix refresh (every 32nd call) touched the tree


def test_lpm_deprioritizes_a_request_sharing_32_tokens_with_an_earlier_uncached_one():
    pol = policy(sglang={"radix_cache": True, "schedule_policy": "lpm"})
    s = SchedulerState(pol, [group(0, 40, 1, 7), group(1, 40, 1, 7), group(2, 40, 1, 8)])
    s.waiting = list(s.requests)
    sglang._sort_queue(s, s.sglang)
    assert [r.rid for r in s.waiting] == [0, 2, 1]  # 1 shares 40 tokens with 0 in this pass: last


def test_retraction_releases_without_caching_and_evicts_for_the_rest():
    pol = policy(kv={"block_size": 1, "num_blocks": 200}, sglang={"radix_cache": True, "init_new_token_ratio": 0.05})
    specs = [group(i, 30, 60, 10 + i, arrival_step=0) for i in range(3)]
    s = SchedulerState(pol, specs)
    retracted = None
    for k in range(300):
        d = step(s, [r for r in s.requests if r.status is Status.PENDING] if k == 0 else [], [], k * 1000)
        check_accounting(s)
        if d.preempted and retracted is None:
            retracted = d.preempted[0]
            g = s.sglang
            assert retracted not in g.node and retracted not in g.protected  # released: no lock, no protected prefix
            assert (pol.kv.num_blocks - s.kv_used) - g.tree.evictable >= 2 * 20  # evicted down to 2 x 20 available
    assert retracted is not None, "three 90-token requests in a 200-token pool: a retraction"
    assert all(r.status is Status.FINISHED for r in s.requests)


def test_the_cache_off_keeps_the_rules_without_a_tree():
    s = SchedulerState(policy(sglang={"radix_cache": False}), [group(0, 40, 2, 7)])
    assert s.sglang.tree is None


def test_lpm_without_the_cache_is_refused():
    with pytest.raises(Exception) as err:
        policy(sglang={"radix_cache": False, "schedule_policy": "dfs-weight"})
    assert "schedule_policy=dfs-weight (expected fcfs or lof when radix_cache is false" in str(err.value)


# ----------------------------------------------------------------------------------------- checks
def test_the_liveness_explorer_refuses_the_radix_cache_by_name(tmp_path, capsys):
    path = tmp_path / "radix.yaml"
    path.write_text(policy().model_dump_json())
    code = main(["verify", str(path), "--liveness", "--requests", "1"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "sglang.radix_cache=True (expected false for the liveness explorer" in err


def test_verify_searches_a_radix_policy_explicitly(tmp_path, capsys):
    path = tmp_path / "radix.yaml"
    path.write_text(policy(kv={"block_size": 2, "num_blocks": 12}, max_model_len=24).model_dump_json())
    code = main(["verify", str(path), "--requests", "2", "--depth", "3", "--prompt-range", "2:4",
                 "--output-range", "1:2", "--no-cancellations", "--invariant", "sglang_memory_identity",
                 "--invariant", "request_conservation", "--timeout", "60"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert out.count("HOLDS_UP_TO") == 2, out
    assert "prompt identities {own tokens, prefix group 0, prefix group 1" in out  # the tree reads the tokens


def test_check_log_on_a_radix_log_leaves_out_what_a_record_cannot_show(tmp_path, capsys):
    """The CLI path on a kept radix log: the per-request invariants are left out with a note, naming one is
    refused (exit 2), and --conformance agrees."""
    from tests import sglang_logs as L

    name = "radix_lpm_p4"
    trace, log = L.kept(name, tmp_path)
    policy_file = tmp_path / f"{name}.yaml"
    assert main(["import", "sglang", "--rules", "sglang", "--out", str(policy_file),
                 *L.import_args(L.CASE[name].driver_flags())]) == 0
    capsys.readouterr()
    assert main(["check-log", str(policy_file), str(log), "--arrivals", str(trace), "--conformance"]) == 0
    out = capsys.readouterr().out
    assert "not checked under SGLang's radix cache: request_conservation, cancellation_releases, " \
           "prompt_fully_computed" in out, out
    assert "100.0 %" in out, out
    code = main(["check-log", str(policy_file), str(log), "--arrivals", str(trace), "--invariant",
                 "prompt_fully_computed"])
    err = capsys.readouterr().err
    assert code == 2 and "--invariant='prompt_fully_computed' (expected an invariant a log can show under a policy " \
                         "with sglang.radix_cache true" in err, err


# ----------------------------------------------------------------------------------------- robustness
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@st.composite
def radix_runs(draw):
    page = draw(st.sampled_from([1, 2, 4]))
    pages = draw(st.integers(24, 80))
    chunk = draw(st.sampled_from([16, 32, 64]))
    priority = draw(st.booleans())
    data = {"max_model_len": 256, "kv": {"block_size": page, "num_blocks": pages},
            "batch": {"max_num_seqs": draw(st.integers(2, 6)), "max_num_batched_tokens": chunk},
            "sglang": {"radix_cache": True, "schedule_policy": draw(st.sampled_from(["fcfs", "lof", "lpm",
                                                                                     "dfs-weight"])),
                       "mixed_chunk": draw(st.booleans()), "init_new_token_ratio": draw(st.sampled_from([0.1, 0.7]))}}
    if priority:
        data["queue"] = {"order": "priority", "priority_polarity": "higher_first"}
        data["preemption"] = {"victim": "fewest_generated", "triggers": ["kv_growth_fails", "priority_inversion"],
                              "priority_inversion_threshold": 1}
    pol = policy(**data)
    specs = []
    for rid in range(draw(st.integers(1, 7))):
        prompt = draw(st.integers(1, 40))
        output = draw(st.integers(1, 12))
        g = draw(st.sampled_from([None, 0, 1]))
        cancel = draw(st.sampled_from([None, None, None, 3, 9]))
        specs.append(RequestSpec(rid=rid, arrival_us=draw(st.integers(0, 6)) * 1000, prompt_len=prompt,
                                 output_len=output, max_output=output, priority=draw(st.sampled_from([0, 5])),
                                 cancel_us=None if cancel is None else cancel * 1000,
                                 content=None if g is None else ((g * 1_000_000, prompt),)))
    specs.sort(key=lambda x: x.arrival_us)
    return pol, [RequestSpec(**{**{f: getattr(x, f) for f in x.__dataclass_fields__}, "rid": i})
                 for i, x in enumerate(specs)]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(run_=radix_runs())
def test_random_radix_runs_keep_the_memory_identity_and_end(run_):
    from checker.verify.replay import first_violation, replay_fixed_clock
    from invariants.catalogue import CATALOGUE

    pol, specs = run_
    replay = replay_fixed_clock(pol, specs, 400, 1000)
    for name in ("sglang_memory_identity", "request_conservation", "kv_never_overcommitted"):
        inv = CATALOGUE[name]
        assert first_violation(inv, inv.defaults, replay) is None, name
    assert all(r.status in (Status.FINISHED, Status.CANCELLED, Status.REJECTED) for r in replay.state.requests)
    tree = replay.state.sglang.tree
    assert tree.protected == 0 and not replay.state.sglang.node  # everything ended: nothing locked
