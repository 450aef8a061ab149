"""vLLM 0.33's rules that the engine gained with block identity, one scenario each, traced by hand from the
real code (vllm/v1/core/block_pool.py, kv_cache_manager.py, single_type_kv_cache_manager.py,
sched/scheduler.py; docs/prefix-caching.md). Block size 4 keeps the numbers small."""

from __future__ import annotations

from checker.policy import Policy
from checker.requests import RequestSpec, content_from_prefix_group
from checker.semantics.state import SchedulerState, Status
from checker.semantics.step import step

STEP_US = 1000


def policy(num_blocks: int = 16, budget: int = 64, caching: bool = True, **chunking) -> Policy:
    return Policy.model_validate({
        "max_model_len": 1000, "batch": {"max_num_seqs": 8, "max_num_batched_tokens": budget},
        "chunking": chunking, "kv": {"num_blocks": num_blocks, "block_size": 4, "prefix_caching": {"enabled": caching}}})


def request(rid: int, prompt: int, output: int = 2, arrival_step: int = 0, group: int | None = 7,
            priority: int = 0) -> RequestSpec:
    content = None if group is None else content_from_prefix_group(group, prompt)
    return RequestSpec(rid, arrival_step * STEP_US, prompt, output, output, priority, content=content)


def run(p: Policy, specs: list[RequestSpec], steps: int) -> tuple[SchedulerState, list]:
    s = SchedulerState(p, specs)
    decisions = []
    for k in range(steps):
        arrived = [r for r in s.requests if r.arrival_us == k * STEP_US]
        decisions.append(step(s, arrived, [], k * STEP_US))
    return s, decisions


def test_a_hit_is_capped_so_that_the_last_prompt_token_is_computed_again():
    # two identical 8-token prompts (2 full blocks): the second may reuse only (8 - 1) // 4 = 1 block
    s, ds = run(policy(), [request(0, 8), request(1, 8, arrival_step=3)], 5)
    assert ds[3].cache_hits == ((1, 4),)
    assert ds[3].scheduled == ((1, 4),)  # the chunk starts after the hit: 8 - 4 tokens


def test_a_request_admitted_later_in_the_same_step_hits_the_blocks_just_scheduled():
    # blocks are cached as soon as their tokens are scheduled (allocate_slots -> cache_blocks)
    s, ds = run(policy(), [request(0, 12), request(1, 13)], 1)
    assert ds[0].cache_hits == ((1, 12),)
    assert dict(ds[0].scheduled) == {0: 12, 1: 1}
    assert s.kv_used == 4  # three shared blocks counted once, plus request 1's block for its 13th token


def test_free_blocks_count_cached_free_blocks():
    s, ds = run(policy(), [request(0, 8, output=1)], 1)
    assert ds[0].finished == (0,)
    assert s.pool.num_cached_free() == 2 and ds[0].kv_blocks_free == 16  # freed blocks stay cached, and free


def test_the_tail_of_a_freed_sequence_is_evicted_first():
    # request 0 (3 blocks) finishes; its blocks join the LRU tail in reverse order: block 2, then 1, then 0.
    # A 13-block request with its own tokens then takes the 13 uncached blocks and one cached block: the
    # first in the LRU queue, request 0's last block. Blocks 0 and 1 stay cached: a later copy hits 2 blocks.
    p = policy(num_blocks=16, budget=64)
    specs = [request(0, 12, output=1), request(1, 52, output=1, arrival_step=1, group=None),
             request(2, 12, output=1, arrival_step=2)]
    s, ds = run(p, specs, 3)
    assert ds[1].scheduled == ((1, 52),) and s.pool.evictions == 1
    assert ds[2].cache_hits == ((2, 8),)


def test_a_preempted_request_resumes_from_its_own_cached_blocks():
    # 6 blocks: request 0 (8 tokens) and request 1 (12 tokens) take 5. At step 1 request 0's decode takes
    # the last free block, so request 1's growth preempts request 1 itself (FCFS: the tail). Its 3 full blocks
    # keep their hashes (LRU order: its last block first); request 0's next two blocks evict blocks 2 and 1,
    # so when request 0 finishes (step 11) request 1 resumes from its first block: a 4-token hit.
    p = policy(num_blocks=6, budget=64)
    specs = [request(0, 8, output=12, group=1), request(1, 12, output=8, group=2)]
    s, ds = run(p, specs, 13)
    assert ds[1].preempted == (1,) and ds[11].finished == (0,)
    assert s.pool.evictions == 4  # 2 of request 1 by request 0's growth, then 2 of request 0's by the resumption
    assert ds[12].cache_hits == ((1, 4),) and ds[12].scheduled == ((1, 9),)  # 13 tokens: 12 + 1 generated


def test_the_threshold_is_dropped_for_a_lone_request():
    # vLLM 0.33: long_prefill_token_threshold applies only when more than one request runs or waits
    p = policy(num_blocks=32, budget=64, long_prefill_token_threshold=16, threshold_when_alone=False)
    s, ds = run(p, [request(0, 40), request(1, 40, arrival_step=1, group=None)], 2)
    assert ds[0].scheduled == ((0, 40),)  # alone: the whole prompt
    assert ds[1].scheduled == ((0, 1), (1, 16))  # two requests: the cap applies to the newcomer
    old = policy(budget=64, long_prefill_token_threshold=16)
    assert run(old, [request(0, 40)], 1)[1][0].scheduled == ((0, 16),)  # vLLM before 0.33: always


def test_the_adaptive_threshold_is_floored_at_the_fair_share():
    p = policy(num_blocks=32, budget=64, long_prefill_token_threshold=8, threshold_when_alone=False, threshold_adaptive=True)
    s, ds = run(p, [request(0, 40, group=None), request(1, 40, group=None)], 1)
    assert dict(ds[0].scheduled) == {0: 32, 1: 32}  # max(8, 64 // 2)


def test_with_caching_off_nothing_is_shared():
    s, ds = run(policy(caching=False), [request(0, 12), request(1, 13)], 1)
    assert ds[0].cache_hits == () and s.pool is None and s.kv_used == 3 + 1 + 3 - 1 + 1
    assert all(r.status is Status.RUNNING for r in s.requests)


def test_a_hit_never_exceeds_the_cap_even_when_the_chain_is_longer():
    # a request whose 8 tokens (2 full blocks) were all cached, then freed without a new token (a victim
    # preempted after its chunk was allocated in the same step): its chain has 2 blocks, but the hit may
    # take only (8 - 1) // 4 = 1, as vLLM's find_longest_cache_hit islices the block hashes
    s = SchedulerState(policy(), [request(0, 8)])
    r = s.requests[0]
    s.pool.take(r, 2)
    s.pool.cache(r, 8)
    s.pool.release(r)
    assert len(r.chain) == 2
    assert len(s.pool.hit(r)) == 1
