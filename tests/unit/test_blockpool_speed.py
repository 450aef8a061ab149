"""The block pool's fast paths equal their definitions: chains interned per run of consecutive token ids
(with the memo of runs seen before, and the cursor into each request's content) equal block-by-block interning
with block_tokens, table order included;
takes of many uncached blocks, and takes that compact the LRU dict, leave the pool as one-at-a-time takes."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from checker.requests import RequestSpec, content_from_hash_ids, content_from_prefix_group
from checker.semantics.blockpool import LRU_COMPACT_EVERY, NO_PARENT, BlockPool, block_tokens
from checker.semantics.state import Request


def chain_by_definition(table: dict, r: Request, n: int, size: int, chained: bool) -> list[int]:
    """BlockPool.chain as first written: block k's key from block_tokens (or ("own", rid, k)), one at a time."""
    chain = r.chain
    content = r.spec.content
    while len(chain) < n:
        k = len(chain)
        key = ("own", r.rid, k) if content is None else block_tokens(content, r.prompt_len, k, size)
        parent = chain[-1] if chain and chained else NO_PARENT
        chain.append(table.setdefault((parent, key), len(table)))
    return chain


@st.composite
def contents(draw, rid: int):
    prompt = draw(st.integers(1, 120))
    kind = draw(st.sampled_from(["own", "group", "hash", "runs"]))
    if kind == "own":
        return prompt, None
    if kind == "group":
        return prompt, content_from_prefix_group(draw(st.integers(0, 2)), prompt)
    if kind == "hash":
        block = draw(st.sampled_from([1, 3, 4, 8, 16]))
        ids = draw(st.lists(st.integers(0, 6), min_size=-(-prompt // block), max_size=-(-prompt // block), unique=True)
                   if -(-prompt // block) <= 7 else st.just(list(range(100, 100 + -(-prompt // block)))))
        return prompt, content_from_hash_ids(ids, block, prompt, rid)
    runs = draw(st.lists(st.tuples(st.sampled_from([0, 5, 7, 8, 16, 100, 116, 1000]), st.integers(0, 40)),
                         min_size=1, max_size=6))  # contiguous ids across runs, empty runs, ids near the output id
    return prompt, tuple(runs)


@settings(max_examples=300, deadline=None, database=None, derandomize=True)
@given(st.sampled_from([1, 2, 3, 4, 16]), st.booleans(), st.data())
def test_chains_equal_block_by_block_interning(size, chained, data):
    pool = BlockPool(64, size, chained)
    table: dict = {}
    pairs = []
    for rid in range(data.draw(st.integers(1, 8))):
        prompt, content = data.draw(contents(rid))
        spec = RequestSpec(rid=rid, arrival_us=0, prompt_len=prompt, output_len=1, max_output=1, content=content)
        pairs.append((Request(spec), Request(spec)))
    for _ in range(data.draw(st.integers(1, 30))):
        fast, slow = data.draw(st.sampled_from(pairs))
        n = data.draw(st.integers(0, (fast.prompt_len + 40) // size + 1))  # past the prompt: output blocks too
        assert pool.chain(fast, n) == chain_by_definition(table, slow, n, size, chained)
    assert list(pool.chains.items()) == list(table.items())


@settings(max_examples=200, deadline=None, database=None, derandomize=True)
@given(st.sampled_from([1, 2, 4, 16]), st.data())
def test_chain_cursors_are_only_hints(size, data):
    """BlockPool.chain resumes its walk of a request's content where the last call stopped (Chains.cursors, by
    rid): requests that share a rid with other contents, and chains started again from the first block, give
    the chains of block-by-block interning all the same, and BlockPool._key (which reads from the cursor too, for
    fast-forward's known_chain) gives block_tokens's keys."""
    pool = BlockPool(64, size)
    table: dict = {}
    specs = []
    for _ in range(data.draw(st.integers(1, 4))):
        prompt, content = data.draw(contents(0))  # one rid for all of them
        specs.append(RequestSpec(rid=0, arrival_us=0, prompt_len=prompt, output_len=1, max_output=1, content=content))
    live = [(Request(spec), Request(spec)) for spec in specs]
    for _ in range(data.draw(st.integers(1, 30))):
        j = data.draw(st.integers(0, len(live) - 1))
        if data.draw(st.integers(0, 4)) == 0:  # the same spec, its chain started again
            live[j] = Request(specs[j]), Request(specs[j])
        fast, slow = live[j]
        n = data.draw(st.integers(0, (fast.prompt_len + 40) // size + 1))
        assert pool.chain(fast, n) == chain_by_definition(table, slow, n, size, True)
        k = data.draw(st.integers(0, (fast.prompt_len + 40) // size + 1))  # a key read from the cursor (known_chain)
        content = fast.spec.content
        key = ("own", 0, k) if content is None else block_tokens(content, fast.prompt_len, k, size)
        assert pool._key(fast, k) == key
    assert list(pool.chains.items()) == list(table.items())


def take_one_at_a_time(pool: BlockPool, r: Request, n: int) -> None:
    for _ in range(n):
        if pool.uncached_free > 0 or not pool.lru:
            pool.uncached_free -= 1
            b = pool.next_id
            pool.next_id += 1
        else:
            b = next(iter(pool.lru))
            del pool.lru[b]
            pool._evict(b)
        pool.refs[b] = 1
        r.block_ids.append(b)


def state(pool: BlockPool, requests: list[Request]) -> tuple:
    return (pool.uncached_free, pool.next_id, pool.evictions, list(pool.lru), list(pool.refs.items()),
            list(pool.hash_of.items()), [(h, list(b)) for h, b in pool.cached.items()],
            [(r.block_ids, r.num_cached_blocks) for r in requests])


@settings(max_examples=100, deadline=None, database=None, derandomize=True)
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 40)), min_size=1, max_size=120))
def test_takes_equal_one_block_at_a_time(ops):
    """Many requests cycling through a small pool (so that takes evict, past LRU_COMPACT_EVERY evictions)."""
    size = 4
    pools = BlockPool(48, size), BlockPool(48, size)
    specs = [RequestSpec(rid=i, arrival_us=0, prompt_len=200, output_len=1, max_output=1,
                         content=content_from_prefix_group(i % 3, 200)) for i in range(6)]
    tables = [Request(s) for s in specs], [Request(s) for s in specs]
    for i, n in ops:
        for pool, reqs, take in zip(pools, tables, (BlockPool.take, take_one_at_a_time)):
            r = reqs[i]
            if r.block_ids and n % 3 == 0:
                pool.release(r)
                r.blocks = 0
                continue
            take(pool, r, min(n, pool.num_free, 50 - len(r.block_ids)))
            pool.cache(r, len(r.block_ids) * size)
    assert state(pools[0], tables[0]) == state(pools[1], tables[1])


def test_lru_compaction_happens_and_keeps_the_order():
    pool = BlockPool(8, 1)
    spec = RequestSpec(rid=0, arrival_us=0, prompt_len=10**6, output_len=1, max_output=1)
    r = Request(spec)
    evicted = 0
    while evicted <= 2 * LRU_COMPACT_EVERY:
        pool.take(r, 8 - len(r.block_ids))
        pool.cache(r, len(r.block_ids))
        before = list(reversed(r.block_ids))
        pool.release(r)
        assert list(pool.lru) == before
        r.chain = []  # new tokens next time, so the cached blocks are evicted, not hit
        evicted = pool.evictions
    assert pool.evictions > LRU_COMPACT_EVERY


def cache_one_at_a_time(pool: BlockPool, r: Request, num_tokens: int) -> None:
    """BlockPool.cache as first written: one block at a time (its bulk path must give the same dicts in the
    same order)."""
    full = num_tokens // pool.block_size
    start = r.num_cached_blocks
    if full <= start:
        return
    chain = chain_by_definition(pool.chains, r, full, pool.block_size, pool.chained)
    for i in range(start, full):
        b, h = r.block_ids[i], chain[i]
        pool.hash_of[b] = h
        pool.cached.setdefault(h, {})[b] = None
    if not pool.chained:
        truth = pool.true_chain(r, full)
        for i in range(start, full):
            pool.truth[r.block_ids[i]] = truth[i]
    r.num_cached_blocks = full


def release_one_at_a_time(pool: BlockPool, r: Request) -> None:
    """BlockPool.release as first written: tail first, one block at a time."""
    for b in reversed(r.block_ids):
        count = pool.refs[b] - 1
        if count:
            pool.refs[b] = count
            continue
        del pool.refs[b]
        if b in pool.hash_of:
            pool.lru[b] = None
        else:
            pool.uncached_free += 1
    r.block_ids = []
    r.num_cached_blocks = 0


def full_state(pool: BlockPool, requests: list[Request]) -> tuple:
    return state(pool, requests) + (list(pool.chains.items()), list(pool.truth.items()),
                                    [list(r.chain) for r in requests])


@settings(max_examples=300, deadline=None, database=None, derandomize=True)
@given(st.sampled_from([1, 2, 4]), st.booleans(), st.integers(6, 40), st.data())
def test_bulk_takes_caches_releases_equal_one_block_at_a_time(size, chained, num_blocks, data):
    """Requests that share prefixes (hits adopted, so blocks shared and their counts above 1), own tokens (chains
    interned in bulk), unchained hashes (one hash naming several blocks), a small pool (takes evict several cached
    blocks at once): take, cache, release and chain in bulk leave the pool, its tables and every block table as
    their one-block-at-a-time definitions do."""
    pools = BlockPool(num_blocks, size, chained), BlockPool(num_blocks, size, chained)
    specs = []
    for rid in range(data.draw(st.integers(1, 6))):
        prompt, content = data.draw(contents(rid))
        specs.append(RequestSpec(rid=rid, arrival_us=0, prompt_len=prompt, output_len=1, max_output=1,
                                 content=content))
    tables = [Request(s) for s in specs], [Request(s) for s in specs]
    ops = data.draw(st.lists(st.tuples(st.integers(0, len(specs) - 1), st.integers(0, 60)), min_size=1, max_size=60))
    for i, n in ops:
        for pool, reqs, fast in zip(pools, tables, (True, False)):
            r = reqs[i]
            if r.block_ids and n % 4 == 0:
                (pool.release if fast else (lambda q, p=pool: release_one_at_a_time(p, q)))(r)
                continue
            if not r.block_ids and n % 2:  # admitted: adopt its hit first, as kv.adopt does
                hit = pool.hit(r) if fast else pool.cached_prefix(
                    chain_by_definition(pool.chains, r, pool.hit_limit(r), size, chained),
                    max(0, pool.hit_limit(r)))[0]
                if hit:
                    pool.adopt(r, hit)
            room = r.prompt_len // size + 2 - len(r.block_ids)
            take = min(n % 7 + (n // 7) * 3, pool.num_free, max(0, room))
            if fast:
                pool.take(r, take)
                pool.cache(r, min(len(r.block_ids) * size, r.prompt_len + size))
            else:
                take_one_at_a_time(pool, r, take)
                cache_one_at_a_time(pool, r, min(len(r.block_ids) * size, r.prompt_len + size))
    assert full_state(pools[0], tables[0]) == full_state(pools[1], tables[1])
