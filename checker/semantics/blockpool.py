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

from typing import TYPE_CHECKING

from checker.requests import GREEDY_OUTPUT_TOKEN, PromptContent

if TYPE_CHECKING:
    from checker.semantics.state import Request

NO_PARENT = -1
Key = tuple  # the tokens of one block, as maximal runs (first id, count) of consecutive ids, or ("own", rid, k)


def block_tokens(content: PromptContent, prompt_len: int, k: int, block_size: int) -> Key:
    """The tokens of block k of a sequence whose prompt is ``content`` followed by output tokens, as the
    maximal runs of consecutive ids (a canonical form: equal tokens give equal keys)."""
    lo, hi = k * block_size, (k + 1) * block_size
    runs: list[list[int]] = []
    pos = 0
    for first, n in content:
        a, b = max(lo, pos), min(hi, pos + n)
        if a < b:
            _add_run(runs, first + a - pos, b - a)
        pos += n
        if pos >= hi:
            break
    for _ in range(max(lo, prompt_len), hi):
        _add_run(runs, GREEDY_OUTPUT_TOKEN, 1)
    return tuple((a, n) for a, n in runs)


def _add_run(runs: list[list[int]], first: int, n: int) -> None:
    if runs and runs[-1][0] + runs[-1][1] == first:
        runs[-1][1] += n
    else:
        runs.append([first, n])


class BlockPool:
    """The pool of ``num_blocks`` usable blocks with block identity. Ask-then-act: ``hit`` and
    ``num_evictable`` ask; ``adopt``, ``take``, ``cache`` and ``release`` act."""

    __slots__ = ("block_size", "num_blocks", "uncached_free", "lru", "refs", "hash_of", "cached", "chains",
                 "next_id", "evictions")

    def __init__(self, num_blocks: int, block_size: int):
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.uncached_free = num_blocks  # free blocks without a hash (interchangeable)
        self.lru: dict[int, None] = {}  # cached free blocks, least recently freed first
        self.refs: dict[int, int] = {}  # held block -> reference count (>= 1)
        self.hash_of: dict[int, int] = {}  # cached block (held or free) -> its chain
        self.cached: dict[int, dict[int, None]] = {}  # chain -> its cached blocks, first cached first
        self.chains: dict[tuple[int, Key], int] = {}  # (parent chain, block tokens) -> chain
        self.next_id = 0  # block ids are handed out fresh; a free uncached block has no identity
        self.evictions = 0  # cached blocks whose hash was dropped to reuse them

    def copy(self) -> BlockPool:
        c = BlockPool.__new__(BlockPool)
        c.block_size, c.num_blocks, c.uncached_free = self.block_size, self.num_blocks, self.uncached_free
        c.lru, c.refs, c.hash_of = dict(self.lru), dict(self.refs), dict(self.hash_of)
        c.cached = {h: dict(blocks) for h, blocks in self.cached.items()}
        c.chains, c.next_id, c.evictions = self.chains, self.next_id, self.evictions  # chains: append-only, shared
        return c

    @property
    def num_free(self) -> int:
        """Free blocks, cached free blocks included (vLLM get_num_free_blocks)."""
        return self.uncached_free + len(self.lru)

    # ------------------------------------------------------------------------------------- chains
    def chain(self, r: Request, n: int) -> list[int]:
        """The chains of the request's first n full blocks (extended as its tokens grow)."""
        chain = r.chain
        size = self.block_size
        content = r.spec.content
        while len(chain) < n:
            k = len(chain)
            key = ("own", r.rid, k) if content is None else block_tokens(content, r.prompt_len, k, size)
            parent = chain[-1] if chain else NO_PARENT
            chain.append(self.chains.setdefault((parent, key), len(self.chains)))
        return chain

    # ------------------------------------------------------------------------------------- ask
    def hit(self, r: Request) -> list[int]:
        """The cached blocks a request with nothing computed would adopt: the longest cached prefix of
        its full blocks, at most (num_tokens - 1) // block_size of them."""
        limit = (r.prompt_len + r.num_generated - 1) // self.block_size
        if limit <= 0:
            return []
        found = []
        cached = self.cached
        for h in self.chain(r, limit):
            blocks = cached.get(h)
            if not blocks:
                break
            found.append(next(iter(blocks)))
        return found

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
        for _ in range(n):
            if self.uncached_free:
                self.uncached_free -= 1
                b = self.next_id
                self.next_id += 1
            else:
                b = next(iter(self.lru))
                del self.lru[b]
                self._evict(b)
            refs[b] = 1
            ids.append(b)

    def _evict(self, b: int) -> None:
        h = self.hash_of.pop(b)
        blocks = self.cached[h]
        del blocks[b]
        if not blocks:
            del self.cached[h]
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
