"""Block identity: the KV block pool with prefix caching, as vLLM's BlockPool and KVCacheManager keep it
(one full-attention group, hash blocks the size of KV blocks). docs/prefix-caching.md derives it from
vLLM 0.33's code.

- A full block of a request's tokens has a chained hash: (the hash of the block before it, the block's
  tokens). Chains are interned here into small ints, so equal chains are equal ints, exactly.
- A block is *held* (reference count >= 1) by the requests whose block tables list it, *cached free*
  (count 0, hashed: reusable by a hit until it is evicted), or *uncached free*.
- The free queue is the uncached free blocks first (vLLM prepends them: they are reused first, and which
  one is taken does not matter), then the cached free blocks in LRU order. Taking a block takes the
  head: an uncached one, else the least recently freed cached one, whose hash is dropped (evicted).
- A request's blocks are freed in reverse order, so the tail of a sequence is evicted before its head.
- A hit is the longest run of cached blocks along the request's chain, capped so that the last token is
  computed again ((num_tokens - 1) // block_size blocks); adopting it *touches* the blocks (count up,
  off the free queue).
- Blocks are cached as soon as their tokens are scheduled, so a request admitted later in the same step
  can hit them. A hash may name several blocks (two requests computed the same tokens); a hit takes the
  first one cached.

The free count includes cached free blocks, as vLLM's get_num_free_blocks does. The step reaches this
module only through checker.semantics.kv.
"""

from __future__ import annotations

from itertools import islice
from typing import TYPE_CHECKING, NamedTuple

from checker.requests import GREEDY_OUTPUT_TOKEN, PromptContent

if TYPE_CHECKING:
    from checker.semantics.state import Request

NO_PARENT = -1
# The LRU queue is a dict used as a queue (taken from the head, freed to the tail). A dict keeps the entries it
# deleted until it is resized, and finding its first key skips them: after many evictions ``next(iter(lru))``
# costs microseconds. Copying the dict every this many evictions drops them (order and contents unchanged).
LRU_COMPACT_EVERY = 256
Key = tuple  # the tokens of one block, as maximal runs (first id, count) of consecutive ids, or ("own", rid, k)


def block_tokens(content: PromptContent, prompt_len: int, k: int, block_size: int) -> Key:
    """The tokens of block k of a sequence whose prompt is ``content`` followed by output tokens, as the
    maximal runs of consecutive ids (a canonical form: equal tokens give equal keys)."""
    return _tokens_from(content, 0, 0, prompt_len, k * block_size, (k + 1) * block_size)


def _tokens_from(content: PromptContent, i: int, pos: int, prompt_len: int, lo: int, hi: int) -> Key:
    """block_tokens of the block [lo, hi), reading the content from run i on (which starts at token pos <= lo:
    the runs before it end at or before lo, so they add nothing)."""
    runs: list[list[int]] = []
    for j in range(i, len(content)):
        first, n = content[j]
        a, b = max(lo, pos), min(hi, pos + n)
        if a < b:
            _add_run(runs, first + a - pos, b - a)
        pos += n
        if pos >= hi:
            break
    outputs = hi - max(lo, prompt_len)
    if outputs > 0:  # the output tokens: only the first can extend a run (a run of one id never extends itself)
        _add_run(runs, GREEDY_OUTPUT_TOKEN, 1)
        runs.extend([GREEDY_OUTPUT_TOKEN, 1] for _ in range(outputs - 1))
    return tuple((a, n) for a, n in runs)


def _add_run(runs: list[list[int]], first: int, n: int) -> None:
    if runs and runs[-1][0] + runs[-1][1] == first:
        runs[-1][1] += n
    else:
        runs.append([first, n])


class Chains(dict):
    """(parent chain, block tokens) -> chain: a chain is its index in order of first use, so equal chains are
    equal ints. ``runs`` is a memo for BlockPool._run_chains (not part of the table: len() counts chains only)."""

    __slots__ = ("runs", "cursors")

    def __init__(self) -> None:
        super().__init__()
        self.runs: dict[tuple[int, int], list[int]] = {}  # (parent, first token id) -> chains of consecutive blocks
        # rid -> (content, i, pos): where BlockPool.chain stopped in that content, run i starting at token pos
        # (the runs before it end at or before pos). A hint, valid for any block starting at or after pos.
        self.cursors: dict[int, tuple[PromptContent, int, int]] = {}


class BlockPool:
    """The pool of ``num_blocks`` usable blocks with block identity. Ask-then-act: ``hit`` and
    ``num_evictable`` ask; ``adopt``, ``take``, ``cache`` and ``release`` act."""

    __slots__ = ("block_size", "num_blocks", "uncached_free", "lru", "refs", "hash_of", "cached", "chains",
                 "next_id", "evictions", "chained", "truth", "true_chains")

    def __init__(self, num_blocks: int, block_size: int, chained: bool = True):
        self.chained = chained  # False: a planted bug, a block's hash covers its own tokens only
        self.truth: dict[int, int] = {}  # unchained only: cached block -> the true chain of the tokens it holds
        self.true_chains: dict[tuple[int, Key], int] = {}  # unchained only: the true (chained) chains
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.uncached_free = num_blocks  # free blocks without a hash (interchangeable)
        self.lru: dict[int, None] = {}  # cached free blocks, least recently freed first
        self.refs: dict[int, int] = {}  # held block -> reference count (>= 1)
        self.hash_of: dict[int, int] = {}  # cached block (held or free) -> its chain
        self.cached: dict[int, dict[int, None]] = {}  # chain -> its cached blocks, first cached first
        self.chains = Chains()  # (parent chain, block tokens) -> chain
        self.next_id = 0  # block ids are handed out fresh; a free uncached block has no identity
        self.evictions = 0  # cached blocks whose hash was dropped to reuse them

    def copy(self) -> BlockPool:
        c = BlockPool.__new__(BlockPool)
        c.block_size, c.num_blocks, c.uncached_free = self.block_size, self.num_blocks, self.uncached_free
        c.lru, c.refs, c.hash_of = dict(self.lru), dict(self.refs), dict(self.hash_of)
        c.cached = {h: dict(blocks) for h, blocks in self.cached.items()}
        c.chains, c.next_id, c.evictions = self.chains, self.next_id, self.evictions  # chains: append-only, shared
        c.chained, c.truth, c.true_chains = self.chained, dict(self.truth), self.true_chains
        return c

    @property
    def num_free(self) -> int:
        """Free blocks, cached free blocks included (vLLM get_num_free_blocks)."""
        return self.uncached_free + len(self.lru)

    @property
    def num_used(self) -> int:
        """Blocks in use: the pool less its free blocks (a block several requests hold counted once)."""
        return self.num_blocks - self.uncached_free - len(self.lru)

    # ------------------------------------------------------------------------------------- chains
    def chain(self, r: Request, n: int) -> list[int]:
        """The chains (block hashes) of the request's first n full blocks, extended as its tokens grow.

        Block k's chain is ``chains.setdefault((parent, self._key(r, k)), len(chains))``, parent the chain of
        block k - 1 (NO_PARENT for block 0, or for every block when hashes are not chained), interned in
        block order. What follows computes exactly that, faster: a block inside one run of the content has the
        key ((first token, block_size),), so the blocks of a run are taken together (_run_chains), and the run
        is found by a cursor instead of block_tokens's scan from the prompt's start."""
        chain = r.chain
        k = len(chain)
        if k >= n:
            return chain
        chains = self.chains
        content = r.spec.content
        if content is None:
            rid = r.rid
            intern, append = chains.setdefault, chain.append
            if self.chained:
                parent = chain[-1] if chain else NO_PARENT
                for j in range(k, n):
                    parent = intern((parent, ("own", rid, j)), len(chains))
                    append(parent)
            else:
                for j in range(k, n):
                    append(intern((NO_PARENT, ("own", rid, j)), len(chains)))
            return chain
        size, prompt_len, chained = self.block_size, r.prompt_len, self.chained
        runs = len(content)
        cursors = chains.cursors
        cursor = cursors.get(r.rid)
        if cursor is not None and cursor[0] is content and cursor[2] <= k * size:
            i, pos = cursor[1], cursor[2]
        else:
            i, pos = 0, 0
        output_key = None
        while k < n:
            lo = k * size
            while i < runs and pos + content[i][1] <= lo:  # the run holding token lo
                pos += content[i][1]
                i += 1
            parent = chain[-1] if chain and chained else NO_PARENT
            if i < runs:
                first, m = content[i]
                inside = (min(pos + m, prompt_len) - lo) // size  # blocks from k on inside run i and the prompt
                if inside > 0:
                    count = min(inside, n - k)
                    chain.extend(self._run_chains(parent, first + lo - pos, count))
                    k += count
                    continue
                key = _tokens_from(content, i, pos, prompt_len, lo, lo + size)
            elif lo >= prompt_len:  # output tokens only: what _tokens_from gives for such a block
                if output_key is None:
                    output_key = ((GREEDY_OUTPUT_TOKEN, 1),) * size
                key = output_key
            else:
                key = _tokens_from(content, i, pos, prompt_len, lo, lo + size)
            chain.append(chains.setdefault((parent, key), len(chains)))
            k += 1
        cursors[r.rid] = (content, i, pos)
        return chain

    def _run_chains(self, parent: int, t0: int, count: int) -> list[int]:
        """The chains of ``count`` consecutive blocks whose tokens are the ids t0, t0 + 1, ... (keys
        ((t0 + j * block_size, block_size),)), the first one's parent ``parent``; interned in order as
        chain() would. The chains table keeps them by (parent, t0) (chains.runs), so a prefix seen before
        costs one lookup per run; every chain kept there is in the table already."""
        chains = self.chains
        memo = chains.runs
        known = memo.get((parent, t0))
        if known is None:
            known = memo[(parent, t0)] = []
        elif len(known) >= count:
            return known[:count]
        size = self.block_size
        j = len(known)
        if self.chained:
            p = known[-1] if known else parent
            while j < count:  # blocks chains has seen before
                h = chains.get((p, ((t0 + j * size, size),)))
                if h is None:
                    break
                known.append(h)
                p = h
                j += 1
            h = len(chains)
            for t in range(t0 + j * size, t0 + count * size, size):  # new chains: their children are new too
                chains[(p, ((t, size),))] = h
                known.append(h)
                p = h
                h += 1
        else:
            for t in range(t0 + j * size, t0 + count * size, size):
                known.append(chains.setdefault((NO_PARENT, ((t, size),)), len(chains)))
        return known[:count]

    def _key(self, r: Request, k: int) -> Key:
        """The key of block k: ("own", rid, k), or block_tokens(content, prompt_len, k, block_size) read from the
        request's cursor on (the runs before it end before the block, so they add nothing)."""
        content = r.spec.content
        if content is None:
            return ("own", r.rid, k)
        size = self.block_size
        lo = k * size
        cursor = self.chains.cursors.get(r.rid)
        if cursor is not None and cursor[0] is content and cursor[2] <= lo:
            i, pos = cursor[1], cursor[2]
        else:
            i, pos = 0, 0
        runs = len(content)
        while i < runs and pos + content[i][1] <= lo:
            pos += content[i][1]
            i += 1
        if i == runs and lo >= r.prompt_len:  # output tokens only
            return ((GREEDY_OUTPUT_TOKEN, 1),) * size
        return _tokens_from(content, i, pos, r.prompt_len, lo, lo + size)

    def true_chain(self, r: Request, n: int) -> list[int]:
        """The chains of the request's first n full blocks as chained hashes would name them (what the
        tokens are, whatever the hash says): the request's own chain when hashes are chained."""
        if self.chained:
            return self.chain(r, n)
        out: list[int] = []
        for k in range(n):
            parent = out[-1] if out else NO_PARENT
            out.append(self.true_chains.setdefault((parent, self._key(r, k)), len(self.true_chains)))
        return out

    # ------------------------------------------------------------------------------------- ask
    def hit(self, r: Request) -> list[int]:
        """The cached blocks a request with nothing computed would adopt: the longest cached prefix of
        its full blocks, at most (num_tokens - 1) // block_size of them."""
        limit = self.hit_limit(r)
        if limit <= 0:
            return []
        return self.cached_prefix(self.chain(r, limit), limit)[0]

    def hit_limit(self, r: Request) -> int:
        """The most blocks a hit may cover: the last token is always computed again (for its logits)."""
        return (r.prompt_len + r.num_generated - 1) // self.block_size

    def cached_prefix(self, chain: list[int], limit: int) -> tuple[list[int], int]:
        """The first cached block of each of the first ``limit`` chains, up to the first chain with none (the
        chain may be longer than the limit: a request freed before its last token was appended), and that
        chain, the one that would extend the prefix (-1 when all ``limit`` are cached)."""
        found: list[int] = []
        cached = self.cached
        for i in range(limit):
            blocks = cached.get(chain[i])
            if not blocks:
                return found, chain[i]
            found.append(next(iter(blocks)))
        return found, -1

    def known_chain(self, r: Request, k: int, parent: int) -> int | None:
        """Block k's chain, given its parent's, if the table has interned it already (None: a new chain, and
        so are its children); it interns nothing."""
        return self.chains.get((parent if self.chained else NO_PARENT, self._key(r, k)))

    def num_evictable(self, blocks: list[int]) -> int:
        """How many of these cached blocks are free (adopting them takes them off the free queue)."""
        refs = self.refs
        return sum(1 for b in blocks if b not in refs)

    # ------------------------------------------------------------------------------------- act
    def adopt(self, r: Request, blocks: list[int]) -> None:
        """Touch the hit blocks and make them the request's first blocks (they are cached already)."""
        refs, lru = self.refs, self.lru
        for b in blocks:
            count = refs.get(b, 0)
            if count == 0:
                del lru[b]
            refs[b] = count + 1
        r.block_ids = list(blocks)
        r.num_cached_blocks = len(blocks)

    def take(self, r: Request, n: int) -> None:
        """Append n blocks from the head of the free queue to the request's blocks, evicting cached ones."""
        ids = r.block_ids
        refs = self.refs
        if n > 1:  # the loop below, a part at a time: fresh ids from the uncached blocks, then LRU evictions
            fresh = min(n, max(0, self.uncached_free))
            if fresh:
                b = self.next_id
                taken = range(b, b + fresh)
                refs.update(dict.fromkeys(taken, 1))
                ids.extend(taken)
                self.next_id = b + fresh
                self.uncached_free -= fresh
                n -= fresh
            lru = self.lru
            if n > 0 and lru:
                victims = list(islice(lru, n))
                hash_of, cached, truth = self.hash_of, self.cached, self.truth
                for b in victims:
                    del lru[b]
                    h = hash_of.pop(b)
                    blocks = cached[h]
                    del blocks[b]
                    if not blocks:
                        del cached[h]
                    if truth:
                        truth.pop(b, None)
                refs.update(dict.fromkeys(victims, 1))
                ids.extend(victims)
                before = self.evictions
                self.evictions = before + len(victims)
                if self.evictions // LRU_COMPACT_EVERY > before // LRU_COMPACT_EVERY:
                    self.lru = dict(lru)
                n -= len(victims)
        for _ in range(n):
            if self.uncached_free > 0 or not self.lru:  # below 0 only when an admission over-committed the pool
                self.uncached_free -= 1
                b = self.next_id
                self.next_id += 1
            else:
                lru = self.lru
                b = next(iter(lru))
                del lru[b]
                self._evict(b)
                if not self.evictions % LRU_COMPACT_EVERY:
                    self.lru = dict(lru)  # the same blocks in the same order, without the deleted head entries
            refs[b] = 1
            ids.append(b)

    def _evict(self, b: int) -> None:
        h = self.hash_of.pop(b)
        blocks = self.cached[h]
        del blocks[b]
        if not blocks:
            del self.cached[h]
        if self.truth:
            self.truth.pop(b, None)
        self.evictions += 1

    def cache(self, r: Request, num_tokens: int) -> None:
        """Register the request's full blocks among its first num_tokens tokens (vLLM cache_blocks)."""
        full = num_tokens // self.block_size
        start = r.num_cached_blocks
        if full <= start:
            return
        chain = self.chain(r, full)
        ids = r.block_ids
        hash_of, cached = self.hash_of, self.cached
        for i in range(start, full):
            b = ids[i]
            h = chain[i]
            hash_of[b] = h
            blocks = cached.get(h)
            if blocks is None:
                cached[h] = {b: None}
            else:
                blocks[b] = None
        if not self.chained:
            truth = self.true_chain(r, full)
            for i in range(start, full):
                self.truth[ids[i]] = truth[i]
        r.num_cached_blocks = full

    def release(self, r: Request) -> None:
        """Free the request's blocks, tail first: cached ones join the LRU tail, the rest the head."""
        refs, hash_of, lru = self.refs, self.hash_of, self.lru
        for b in reversed(r.block_ids):
            count = refs[b] - 1
            if count:
                refs[b] = count
                continue
            del refs[b]
            if b in hash_of:
                lru[b] = None
            else:
                self.uncached_free += 1
        r.block_ids = []
        r.num_cached_blocks = 0

    # ------------------------------------------------------------------------------------- facts
    def num_held(self) -> int:
        """Distinct blocks some request holds (a shared block counted once)."""
        return len(self.refs)

    def num_cached_free(self) -> int:
        return len(self.lru)

    def facts(self, requests: list[Request]) -> PoolFacts:
        """What the cache invariants read, recounted from the block tables (not from the counters the pool
        keeps), so that a bookkeeping bug shows: O(blocks held), for checking, not for the hot path."""
        listed: dict[int, int] = {}
        chain_errors = 0
        for r in requests:
            for b in r.block_ids:
                listed[b] = listed.get(b, 0) + 1
            if r.num_cached_blocks:
                truth = self.true_chain(r, r.num_cached_blocks)
                for k in range(r.num_cached_blocks):
                    b = r.block_ids[k]
                    if self.truth.get(b, self.hash_of.get(b)) != truth[k]:
                        chain_errors += 1
        ref_errors = sum(1 for b, n in listed.items() if self.refs.get(b) != n or b in self.lru)
        ref_errors += sum(1 for b in self.refs if b not in listed)
        return PoolFacts(held=len(listed), free=self.num_free, shared=sum(listed.values()) - len(listed),
                         cached=len(self.hash_of), ref_errors=ref_errors, chain_errors=chain_errors)


class PoolFacts(NamedTuple):
    """The pool's state as the cache invariants see it (checker.frames carries it per step)."""

    held: int  # distinct blocks listed in some request's block table
    free: int  # free blocks, cached free included
    shared: int  # block-table entries beyond the first for a block (the blocks shared, counted again)
    cached: int  # blocks with a hash (held or free)
    ref_errors: int  # blocks whose reference count differs from the tables listing them, or listed yet free
    chain_errors: int  # table entries whose block holds other tokens than the request's chain says
