"""The liveness explorer under SGLang's rules is the engine's step (checker/liveness/canon.py,
checker/semantics/sglang.py).

Merged states must have the same future: for SGLang policies (fixed ones that reach each rule, and generated ones)
and their request classes, breadth-first over the engine's own states (no reduction: request numbers, entry stamps,
fill lengths and batch order as the engine makes them, merged only when exactly equal), every state's key decodes to
a representative that encodes to it, and stepping the engine's state and the representative under every environment
choice gives the same decision (requests named by live position) and the same successor key, for many steps; the
successor keys are exactly the explorer's (Transition.successors, the memo included), and the states the graph's BFS
paths replay to on the engine have the graph's keys. The states met include a chunked request, retractions, the
out-of-memory abort, priority preemption, mixed chunk batches, aborted running requests and a decayed ratio.
"""

from __future__ import annotations

import random

import pytest

from checker.liveness.canon import Canon
from checker.liveness.explore import LivenessEnv, Transition, explore, live_positions
from checker.policy import Policy
from checker.semantics.state import Reason, Request, SchedulerState, Status
from checker.semantics.step import step
from checker.verify.explicit import fast_fingerprint
from tests.unit.test_liveness_cache import _engine_state


def sglang_policy(**over) -> Policy:
    """A small SGLang policy (pages of 4 tokens); ``over``: sections merged into the defaults."""
    data = {"scheduler": "sglang", "max_model_len": 64, "kv": {"block_size": 4, "num_blocks": 6},
            "batch": {"max_num_seqs": 2, "max_num_batched_tokens": 8, "phase_mode": "prefill_first"},
            "chunking": {"enabled": True}, "preemption": {"victim": "fewest_generated"},
            "sglang": {"max_prefill_tokens": 16, "new_token_ratio_decay_steps": 2}}
    for key, value in over.items():
        data[key] = {**data.get(key, {}), **value} if isinstance(value, dict) else value
    return Policy.model_validate(data)


PRIORITY = {"order": "priority", "priority_polarity": "higher_first"}
PREEMPT = {"triggers": ["kv_growth_fails", "priority_inversion"], "priority_inversion_threshold": 0}

# (policy, env): chunked prompts on a small pool (retractions, the out-of-memory abort), mixed chunk, aborts of running
# and chunked requests, lof, priority scheduling with priority preemption (fill lengths, running entries), the same
# with retraction by priority and lower-first values, no chunking, a queue timeout (ages in the key)
CASES = [
    (sglang_policy(kv={"num_blocks": 5}, sglang={"clip_max_new_tokens": 1}),
     LivenessEnv(3, (4, 10), (6, 8), arrivals_per_step=1)),
    (sglang_policy(sglang={"mixed_chunk": True, "clip_max_new_tokens": 1}, kv={"num_blocks": 5}),
     LivenessEnv(3, (4, 10), (2, 8), arrivals_per_step=1)),
    (sglang_policy(kv={"num_blocks": 7}), LivenessEnv(2, (6, 10), (2, 3), cancellations=True)),
    (sglang_policy(sglang={"schedule_policy": "lof"}, batch={"max_num_seqs": 1}),
     LivenessEnv(3, (4,), (1, 3), arrivals_per_step=2)),
    (sglang_policy(queue=PRIORITY, preemption=PREEMPT, batch={"max_num_seqs": 1}),
     LivenessEnv(2, (4, 8), (2, 3), (0, 1))),
    (sglang_policy(queue={"order": "priority", "priority_polarity": "lower_first"},
                   preemption={**PREEMPT, "victim": "lowest_priority"}),
     LivenessEnv(3, (5,), (3, 6), (0, 2), arrivals_per_step=1)),
    (sglang_policy(chunking={"enabled": False}, batch={"max_num_batched_tokens": 80}, kv={"num_blocks": 5},
                   sglang={"max_prefill_tokens": 8, "clip_max_new_tokens": 1}),
     LivenessEnv(3, (4, 6), (5, 8), arrivals_per_step=1)),
    (sglang_policy(timeouts={"queue_timeout_ms": 20}, batch={"max_num_seqs": 1}, kv={"num_blocks": 7}),
     LivenessEnv(2, (4, 10), (1, 2), cancellations=True)),
]
IDS = ["chunked-retract", "mixed", "aborts", "lof", "priority-preempt", "retract-by-priority", "no-chunking",
       "timeout"]


def generated_case(seed: int) -> tuple[Policy, LivenessEnv]:
    """A random small SGLang policy and instance."""
    rng = random.Random(seed)
    page = rng.choice([2, 4, 8])
    chunking = rng.random() < 0.75
    priority = rng.random() < 0.5
    over: dict = {
        "kv": {"block_size": page, "num_blocks": rng.randint(3, 6)},
        "batch": {"max_num_seqs": rng.randint(1, 3),
                  "max_num_batched_tokens": rng.choice([page * 2, page * 3, 16]) if chunking else 64 + 16},
        "chunking": {"enabled": chunking},
        "sglang": {"schedule_policy": rng.choice(["fcfs", "lof"]), "mixed_chunk": rng.random() < 0.4,
                   "max_prefill_tokens": rng.choice([8, 16]),
                   "new_token_ratio_decay_steps": rng.choice([1, 2, 3]),
                   "init_new_token_ratio": rng.choice([0.3, 0.7, 1.0]),
                   "min_new_token_ratio_factor": rng.choice([0.0, 0.5, 1.0]),
                   "retract_decode_steps": rng.choice([0, 1, 20]), "clip_max_new_tokens": rng.choice([1, 4096])},
    }
    if priority:
        over["queue"] = {"order": "priority", "priority_polarity": rng.choice(["higher_first", "lower_first"])}
        triggers = ["kv_growth_fails"] + (["priority_inversion"] if rng.random() < 0.7 else [])
        over["preemption"] = {"triggers": triggers, "priority_inversion_threshold": rng.choice([0, 1]),
                              "victim": rng.choice(["fewest_generated", "lowest_priority"])}
    prompts = tuple(sorted(rng.sample([2, 3, page, page + 1, 2 * page, 3 * page - 1], 2)))
    env = LivenessEnv(rng.randint(2, 3), prompts, tuple(sorted(rng.sample([1, 2, 3, 4], 2))),
                      (0, 1) if priority else (0,), cancellations=rng.random() < 0.4, arrivals_per_step=1)
    return sglang_policy(**over), env


SEEDS = range(10)
DEPTH, PER_LAYER = 10, 40


def _choices(trans: Transition, key: tuple):
    arrivals, cancels = trans.choices(key)
    return [(a, c) for a in arrivals for c in cancels]


def _stepped(canon: Canon, s: SchedulerState, now: int, choice, names: dict[int, object]):
    """A copy of s after the choice's arrivals and cancels and one step, and its decision with the requests named
    by ``names`` (rid -> live position) and arrivals by ("new", k)."""
    c = s.copy()
    live = live_positions(c)
    first = len(c.requests)
    new = [Request(canon.spec(first + k, now, cid)) for k, cid in enumerate(choice[0])]
    c.requests += new
    d = step(c, new, [c.requests[live[i]] for i in choice[1]], now)

    def name(rid: int):
        return names[rid] if rid < first else ("new", rid - first)

    decision = (tuple((name(rid), n) for rid, n in d.scheduled), tuple(map(name, d.produced)),
                tuple(map(name, d.arrived)), tuple(map(name, d.admitted)), tuple(map(name, d.preempted)),
                tuple(map(name, d.finished)), tuple((name(rid), reason) for rid, reason in d.rejected),
                tuple(map(name, d.cancelled)), tuple(map(name, d.released)), d.num_prefill_tokens,
                d.num_decode_seqs, d.prefill_attention, d.decode_kv_tokens, d.kv_blocks_used, d.num_running,
                d.num_waiting)
    return c, d, decision


class Seen:
    """Which of SGLang's rules the states and steps met exercise."""

    def __init__(self):
        self.flags: set[str] = set()

    def state(self, s: SchedulerState) -> None:
        g = s.sglang
        if g.chunked is not None:
            self.flags.add("chunked")
        if g.aborting:
            self.flags.add("aborting")
        if g.batch_is_full:
            self.flags.add("batch_is_full")
        if g.ratio != s.policy.sglang.init_ratio:
            self.flags.add("ratio")
        if any(r.status is Status.WAITING and r.num_generated for r in s.requests):
            self.flags.add("requeued")

    def step(self, before: SchedulerState, after: SchedulerState, d) -> None:
        if d.preempted:
            self.flags.add("priority-preemption" if d.num_prefill_tokens else "retraction")
        if d.num_prefill_tokens and d.num_decode_seqs:
            self.flags.add("mixed")
        if any(r.reason is Reason.OUT_OF_MEMORY for r in after.requests):
            self.flags.add("out-of-memory")
        if any(rid < len(before.requests) and before.requests[rid].status is Status.RUNNING for rid in d.cancelled):
            self.flags.add("abort-running")


def _conforms(policy: Policy, env: LivenessEnv, depth: int = DEPTH, per_layer: int = PER_LAYER,
              least: int | None = None) -> Seen:
    """BFS over the engine's own states: key round trip, decisions and successor keys of engine and representative
    under every choice, and the explorer's successors."""
    canon = Canon(policy, env.step_us, env.priorities, env.tenants, env.classes())
    trans = Transition(canon, env)
    seen = Seen()
    layer = [SchedulerState(policy, [], num_tenants=env.tenants)]
    checked = 0
    for k in range(depth):
        now = k * env.step_us
        following = {}
        for s in layer:
            key = canon.encode(s, now)
            rep, rnow = canon.decode(key)
            assert canon.encode(rep, rnow) == key, key
            seen.state(s)
            names = {rid: i for i, rid in enumerate(live_positions(s))}
            successors = set()
            for choice in _choices(trans, key):
                c, d, decision = _stepped(canon, s, now, choice, names)
                rc, _, rdecision = _stepped(canon, rep, rnow, choice, {i: i for i in range(key[0])})
                succ = canon.encode(c, now + env.step_us)
                assert decision == rdecision, (k, key, choice)
                assert succ == canon.encode(rc, rnow + env.step_us), (k, key, choice)
                successors.add(succ)
                seen.step(s, c, d)
                seen.state(c)
                following.setdefault(fast_fingerprint(c), c)
            assert successors == set(trans.successors(key)), (k, key)
            checked += 1
        states = list(following.values())
        layer = states[::max(1, len(states) // per_layer)]  # a spread sample of the layer
    assert checked > (2 * depth if least is None else least)
    return seen


EXPECTED = {  # what each fixed case must exercise
    "chunked-retract": {"chunked", "retraction", "requeued", "ratio"},
    "mixed": {"chunked", "mixed", "retraction"},
    "aborts": {"chunked", "aborting", "abort-running"},
    "lof": {"batch_is_full"},
    "priority-preempt": {"priority-preemption", "requeued"},
    "retract-by-priority": {"retraction", "priority-preemption"},
    "no-chunking": {"retraction"},
    "timeout": {"chunked"},
}


@pytest.mark.parametrize("policy,env", CASES, ids=IDS)
def test_representatives_step_like_the_engines_own_states(policy, env, request):
    seen = _conforms(policy, env)
    missing = EXPECTED[request.node.callspec.id] - seen.flags
    assert not missing, (missing, seen.flags)


@pytest.mark.parametrize("seed", SEEDS)
def test_generated_policies_step_like_the_engine(seed):
    policy, env = generated_case(seed)
    _conforms(policy, env, depth=8, per_layer=25)


@pytest.mark.parametrize("case", range(len(CASES)), ids=IDS)
def test_the_states_the_graphs_paths_replay_to_have_its_keys_and_successors(case):
    policy, env = CASES[case]
    sg = explore(policy, env, max_states=3000, timeout_s=60)
    trans = Transition(sg.canon, sg.env)
    assert sg.states > 10
    for key in sg.keys:  # every key decodes to a state that encodes to it
        s, now = sg.canon.decode(key)
        assert sg.canon.encode(s, now) == key
    for node in range(0, sg.states, max(1, sg.states // 40)):
        s, now = _engine_state(sg, node)
        key = sg.canon.encode(s, now)
        assert key == sg.keys[node], node
        successors = set(trans.successors(key))
        engine = set()
        names = {rid: i for i, rid in enumerate(live_positions(s))}
        for choice in _choices(trans, key):
            c, _, _ = _stepped(sg.canon, s, now, choice, names)
            engine.add(sg.canon.encode(c, now + env.step_us))
        assert engine == successors, node
        assert successors == {sg.keys[v] for v in sg.graph.successors(node)} or not sg.complete


@pytest.mark.parametrize("case", [0, 2, 4], ids=[IDS[0], IDS[2], IDS[4]])
def test_memo_off_and_two_workers_give_the_same_graph(case):
    policy, env = CASES[case]
    a = explore(policy, env, max_states=2000)
    for other in (explore(policy, env, max_states=2000, memo=False), explore(policy, env, max_states=2000, workers=2)):
        assert a.keys == other.keys and list(a.graph.edges) == list(other.graph.edges)


def test_vllm_keys_have_no_sglang_section():
    """scheduler vllm: the key is as before (no SGLang fields; the running requests ranked by admission)."""
    from checker.api import load_policy
    from tests.helpers import POLICIES

    policy = load_policy(POLICIES / "vllm_v1.yaml")
    canon = Canon(policy, 10_000)
    assert not canon.sglang and not canon.sglang_rules
    s = SchedulerState(policy, [])
    assert canon.encode(s, 0) == (0, 0)


def test_hand_built_states_out_of_memory_and_marked_aborts_round_trip_and_step_alike():
    """States no small instance reaches from scratch (SGLang's arrival cap keeps every request within an empty
    pool): a lone running request whose next page is not free (retract_decode's out-of-memory abort), next to a
    waiting request retracted before (entry stamp and fill kept, a lower ratio) and a marked running abort."""
    policy = sglang_policy(kv={"num_blocks": 4}, queue=PRIORITY, preemption=PREEMPT)
    env = LivenessEnv(3, (4, 8), (2, 6), (0, 1), cancellations=True)
    canon = Canon(policy, env.step_us, env.priorities, env.tenants, env.classes())
    trans = Transition(canon, env)
    s = SchedulerState(policy, [canon.spec(0, 0, canon.class_id((8, 6, 6, 0, 0, None))),
                                canon.spec(1, 0, canon.class_id((4, 2, 2, 1, 0, None)))])
    a, b = s.requests
    a.status, a.num_computed, a.num_generated, a.blocks, a.admitted_seq = Status.RUNNING, 16, 9, 4, 3
    b.status, b.num_generated, b.admitted_seq = Status.WAITING, 1, 2
    s.running, s.waiting, s.kv_used, s.next_seq = [a], [b], 4, 4
    g = s.sglang
    g.entry, g.next_entry, g.fill, g.ratio, g.ran_batch = {0: 2, 1: 5}, 5, {0: 8, 1: 5}, 0.25, True
    for marked in (False, True):
        if marked:
            g.aborting = {0}
        key = canon.encode(s, 0)
        rep, rnow = canon.decode(key)
        assert canon.encode(rep, rnow) == key and rep.sglang.ratio == 0.25 and rep.sglang.fill == {0: 8, 1: 5}
        names = {0: 0, 1: 1}
        for choice in _choices(trans, key):
            c, d, decision = _stepped(canon, s, 0, choice, names)
            rc, _, rdecision = _stepped(canon, rep, rnow, choice, names)
            assert decision == rdecision and canon.encode(c, env.step_us) == canon.encode(rc, rnow + env.step_us)
        c, d, _ = _stepped(canon, s, 0, ((), ()), names)
        if marked:  # its row is computed first: it ends aborted, not out of memory
            assert a.rid in d.cancelled or c.requests[0].reason is Reason.OUT_OF_MEMORY
        else:
            assert c.requests[0].reason is Reason.OUT_OF_MEMORY and not d.scheduled


def test_each_part_of_the_sglang_section_tells_futures_apart():
    """Dropping a part of the SGLang state changes the future: two states that differ only there have different keys
    (and different steps)."""
    policy = sglang_policy(queue=PRIORITY, preemption=PREEMPT, batch={"max_num_seqs": 1})
    canon = Canon(policy, 10_000, (0, 1))
    base = SchedulerState(policy, [])
    keys = {canon.encode(base, 0)}
    for change in (lambda g: setattr(g, "batch_is_full", True), lambda g: setattr(g, "shrunk", True),
                   lambda g: setattr(g, "ran_batch", True), lambda g: setattr(g, "ratio", 0.5)):
        s = base.copy()
        change(s.sglang)
        keys.add(canon.encode(s, 0))
    assert len(keys) == 5


def _decisions_differ(policy: Policy, s: SchedulerState, change) -> None:
    """``change`` (on a copy of s) gives a state with another key and another step: the key must keep it."""
    canon = Canon(policy, 10_000, (0, 1))
    other = s.copy()
    change(other)
    assert canon.encode(s, 0) != canon.encode(other, 0)
    assert step(s.copy(), [], [], 0)[2:] != step(other, [], [], 0)[2:]


def _running(s: SchedulerState, r: Request, computed: int, generated: int, seq: int) -> None:
    r.status, r.num_computed, r.num_generated, r.admitted_seq = Status.RUNNING, computed, generated, seq
    r.blocks = -(-computed // s.policy.kv.block_size)
    s.running.append(r)
    s.kv_used += r.blocks


def test_batch_is_full_decides_whether_a_prefill_batch_is_tried():
    """Set (a prefill ran out of tokens earlier) and no request of the last batch ended: decode runs, the waiting
    request is not tried even though it now fits; cleared, it is admitted."""
    from checker.requests import RequestSpec
    from checker.semantics.sglang import enter_queue

    policy = sglang_policy(kv={"num_blocks": 8})
    s = SchedulerState(policy, [RequestSpec(0, 0, 4, 6, 6), RequestSpec(1, 0, 4, 2, 2)])
    a, b = s.requests
    _running(s, a, 5, 2, 1)
    b.status = Status.WAITING
    enter_queue(s, b)
    s.sglang.batch_is_full = True
    _decisions_differ(policy, s, lambda c: setattr(c.sglang, "batch_is_full", False))


def test_fill_lengths_decide_priority_preemption():
    """A waiting request of higher priority, the running slot taken: priority preemption counts its fill length
    (prompt + output at its last try; 0 when it has never been tried) against what the victim's reservation frees."""
    from checker.requests import RequestSpec
    from checker.semantics.sglang import enter_queue

    policy = sglang_policy(kv={"num_blocks": 4}, queue=PRIORITY, preemption=PREEMPT, batch={"max_num_seqs": 1})
    s = SchedulerState(policy, [RequestSpec(0, 0, 4, 8, 8, priority=0), RequestSpec(1, 0, 8, 2, 2, priority=1)])
    a, b = s.requests
    s.sglang.entry[0] = s.sglang.next_entry = 1
    _running(s, a, 6, 3, 1)
    b.status = Status.WAITING
    enter_queue(s, b)
    s.sglang.fill = {0: 4, 1: 8}  # b was tried before (it did not fit)
    _decisions_differ(policy, s, lambda c: c.sglang.fill.pop(1))


def test_an_unvalidated_sglang_policy_with_the_cache_or_a_connector_is_refused_by_the_field():
    from checker.errors import InputError

    policy = sglang_policy()
    kv = policy.kv.model_copy(update={"prefix_caching": policy.kv.prefix_caching.model_copy(update={"enabled": True})})
    for bad, field in ((policy.model_copy(update={"kv": kv}), "kv.prefix_caching.enabled"),
                       (policy.model_copy(update={"connector": policy.connector.model_copy(
                           update={"kind": "offload"})}), "connector.kind")):
        with pytest.raises(InputError) as exc:
            explore(bad, LivenessEnv(1, (4,), (1,)))
        assert str(exc.value).startswith(field), str(exc.value)


try:  # the engine's own generator of SGLang policies (checker.strategies), driven by Hypothesis
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from checker.strategies import small_sglang_policies
except ImportError:  # pragma: no cover - Hypothesis is a test dependency
    small_sglang_policies = None

if small_sglang_policies is not None:
    @settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(policy=small_sglang_policies(), data=st.data())
    def test_hypothesis_sglang_policies_step_like_the_engine(policy, data):
        page = policy.kv.block_size
        top = max(2, min(policy.max_model_len, policy.kv.num_blocks * page) - 7)  # under SGLang's arrival limit
        prompts = tuple(data.draw(st.lists(st.integers(1, top), min_size=1, max_size=2, unique=True)))
        outputs = tuple(data.draw(st.lists(st.integers(1, 6), min_size=1, max_size=2, unique=True)))
        reads_priority = policy.queue.uses_priority
        env = LivenessEnv(data.draw(st.integers(1, 3)), prompts, outputs, (0, 1) if reads_priority else (0,),
                          cancellations=data.draw(st.booleans()), arrivals_per_step=1)
        _conforms(policy, env, depth=6, per_layer=12, least=5)  # a tiny instance may have few states
