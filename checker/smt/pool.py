"""The block pool with block identity (prefix caching) as a data-oblivious function, over ``Ops``.

It mirrors checker/semantics/blockpool.py for the instances the encoding accepts, exactly (no abstraction):

- ``records``: M block records (M = max(num_blocks, N * L), enough for every block that can exist at once:
  held blocks, over-committed ones included, plus cached free ones). A record has a hash (``chain``, -1: none),
  the order it was cached in (``cstamp``: a hash naming several blocks is hit on its first-cached one), its
  place in the LRU queue (``lstamp``: the least recently freed cached block is evicted first), its reference
  count (``ref``) and, with unchained hashes only, the true chain of the tokens it holds (``truth``). A record
  with ref 0 and no hash is an uncached free block (they are interchangeable, as in the engine).
- per slot a block table of L entries (record indices; entry k is meaningful for k < the slot's blocks) and
  how many of its first blocks are cached (``ncached``).
- one clock for both stamps, advanced by L + 1 per act, so stamps are distinct and ordered as the engine's acts.

"Take the k blocks at the head of the free queue" is a rank (the number of smaller keys) compared with k.

Chains. The accepted prompt identities (``IDENTITIES``) are a request's own tokens, or the token ids of
prefix group 1 or 2 from block 0, or of group 1 from its second block. With them a block's chain is a
function of the identity, the prompt length and the block index, computed as an integer ``code`` (equal
codes iff equal chains, exactly): a group block k is named by (identity, k, min(prompt, (k + 1) * block_size))
with chained hashes, and by its own tokens (group, first token's block, prompt tokens in it; or "output tokens
only", the same for every group request) without. Group 0 is not accepted: its token ids 0..7 contain the
id of every output token (GREEDY_OUTPUT_TOKEN = 7), so a prompt ending at token 6 has the same tokens as
one a token longer, which the codes do not model; a content outside the class is refused (InputError).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from checker.errors import InputError, Problem
from checker.requests import GREEDY_OUTPUT_TOKEN, TOKEN_ID_SPAN, PromptContent
from checker.smt.ops import Term, sum_terms

# identity code -> (prefix group, offset in blocks); 0 is the request's own tokens
IDENTITIES: tuple[tuple[int, int] | None, ...] = (None, (1, 0), (2, 0), (1, 1))
OWN = 0
OUTPUT_ONLY = 0  # unchained hashes: the hash of a block of output tokens only (the same for every group request)
NO_HASH = -1


def identity_name(code: int) -> str:
    ident = IDENTITIES[code]
    if ident is None:
        return "own tokens"
    group, offset = ident
    return f"prefix group {group}" + (" from its second block" if offset else "")


def identity_content(code: int, prompt_len: int, block_size: int) -> PromptContent | None:
    """The RequestSpec content of an identity (what a counterexample's requests carry)."""
    ident = IDENTITIES[code]
    if ident is None:
        return None
    group, offset = ident
    return ((group * TOKEN_ID_SPAN + offset * block_size, prompt_len),)


def identity_of(content: PromptContent | None, prompt_len: int, block_size: int, field: str = "content") -> int:
    """The identity code of a request's content, or InputError for a content outside the accepted class."""
    for code in range(len(IDENTITIES)):
        if identity_content(code, prompt_len, block_size) == (tuple(map(tuple, content)) if content else None):
            return code
    raise InputError(Problem(field, content, "for the Z3 encoding of the prefix cache: own tokens, or one run of "
                             "prefix group 1 or 2 from its first block, or of group 1 from its second block "
                             "(checker/smt/pool.py IDENTITIES)"))


@dataclass(frozen=True)
class Shape:
    """The fixed sizes of one pool encoding."""

    num_slots: int
    table: int  # L: block-table entries per slot
    records: int  # M
    block_size: int
    num_blocks: int
    chained: bool

    @property
    def kmax(self) -> int:
        return self.table + 2

    @property
    def width(self) -> int:
        return self.table * self.block_size + 2


def shape_for(num_slots: int, max_tokens: int, num_blocks: int, block_size: int, chained: bool) -> Shape:
    """``max_tokens``: the most tokens of KV one request can hold (its table has room for them)."""
    table = max(1, -(-max_tokens // block_size))
    return Shape(num_slots, table, max(num_blocks, num_slots * table), block_size, num_blocks, chained)


@dataclass
class PoolState:
    table: list[list[Term]]  # per slot, L record indices
    ncached: list[Term]  # per slot
    chain: list[Term]  # per record: hash code or NO_HASH
    truth: list[Term]  # per record: true chain code (unchained hashes only; else the hash)
    cstamp: list[Term]
    lstamp: list[Term]
    ref: list[Term]
    clock: Term
    overflow: Term = False  # a take found no record (never, for a correct M; conformance checks it)

    def copy(self) -> PoolState:
        return replace(self, table=[list(t) for t in self.table], ncached=list(self.ncached), chain=list(self.chain),
                       truth=list(self.truth), cstamp=list(self.cstamp), lstamp=list(self.lstamp), ref=list(self.ref))


def empty_pool(shape: Shape) -> PoolState:
    m, n, length = shape.records, shape.num_slots, shape.table
    return PoolState([[-1] * length for _ in range(n)], [0] * n, [NO_HASH] * m, [NO_HASH] * m, [0] * m, [0] * m,
                     [0] * m, 0)


POOL_FIELDS = ("chain", "truth", "cstamp", "lstamp", "ref")


# ----------------------------------------------------------------------------------------- chain codes
def _code(shape: Shape, kind: Term, k: Term, m: Term) -> Term:
    return 1 + (kind * shape.kmax + k) * shape.width + m


def own_code(shape: Shape, rid: Term, k: int) -> Term:
    return _code(shape, 3 + rid, k, 0)


def chained_code(o, shape: Shape, ident: Term, prompt: Term, rid: Term, k: int) -> Term:
    m = o.min(prompt, (k + 1) * shape.block_size)
    return o.ite(ident == OWN, own_code(shape, rid, k),
                 o.ite(ident == 1, _code(shape, 0, k, m), o.ite(ident == 2, _code(shape, 1, k, m),
                                                               _code(shape, 2, k, m))))


def unchained_code(o, shape: Shape, ident: Term, prompt: Term, rid: Term, k: int) -> Term:
    """The hash of block k when it covers the block's own tokens: (group, block of the group's ids, prompt
    tokens in the block), or OUTPUT_ONLY."""
    bs = shape.block_size
    m = o.min(o.max(prompt - k * bs, 0), bs)
    group_kind = o.ite(ident == 2, 1, 0)
    offset = o.ite(ident == 3, 1, 0)
    grp = o.ite(m == 0, OUTPUT_ONLY, _code(shape, group_kind, offset + k, m))
    return o.ite(ident == OWN, own_code(shape, rid, k), grp)


def hash_code(o, shape: Shape, ident: Term, prompt: Term, rid: Term, k: int) -> Term:
    f = chained_code if shape.chained else unchained_code
    return f(o, shape, ident, prompt, rid, k)


# ----------------------------------------------------------------------------------------- the acts
class Pool:
    """The acts of checker.semantics.blockpool on a PoolState, each guarded by a condition."""

    def __init__(self, o, shape: Shape, state: PoolState):
        self.o, self.shape, self.s = o, shape, state

    def copy(self) -> Pool:
        return Pool(self.o, self.shape, self.s.copy())

    def codes(self, ident: Term, prompt: Term, rid: Term) -> tuple[list[Term], list[Term]]:
        """A request's hash codes and true chain codes for entries 0..L-1 of its table."""
        o, shape = self.o, self.shape
        codes = [hash_code(o, shape, ident, prompt, rid, k) for k in range(shape.table)]
        truths = codes if shape.chained else [chained_code(o, shape, ident, prompt, rid, k) for k in range(shape.table)]
        return codes, truths

    # -- facts
    def is_free_cached(self, j: int) -> Term:
        return self.o.and_(self.s.ref[j] == 0, self.s.chain[j] >= 0)

    def is_empty(self, j: int) -> Term:
        return self.o.and_(self.s.ref[j] == 0, self.s.chain[j] < 0)

    def held(self) -> Term:
        return sum_terms([self.o.b2i(r > 0) for r in self.s.ref])

    def lru_count(self) -> Term:
        return sum_terms([self.o.b2i(self.is_free_cached(j)) for j in range(self.shape.records)])

    def entry(self, sel: list[Term], k: int) -> Term:
        return sum_terms([self.o.ite(sel[i], self.s.table[i][k], 0) for i in range(self.shape.num_slots)])

    # -- hit
    def hit(self, codes: list[Term], limit: Term) -> tuple[Term, list[list[Term]], Term]:
        """The longest cached prefix along ``codes`` (the selected request's hashes), at most ``limit`` blocks:
        (its length, chosen[k][j]: record j is the block adopted at entry k, how many of them are free)."""
        o, s, m = self.o, self.s, self.shape.records
        prefix: Term = True
        length: Term = 0
        chosen = []
        evictable: Term = 0
        for k, code in enumerate(codes):
            match = [s.chain[j] == code for j in range(m)]
            best: Term = -1
            for j in range(m):  # the first-cached block of the hash (the smallest cache stamp)
                best = o.ite(o.and_(match[j], o.or_(best < 0, s.cstamp[j] < best)), s.cstamp[j], best)
            prefix = o.and_(prefix, o.or_(*match), k < limit)
            length = length + o.b2i(prefix)
            row = [o.and_(prefix, match[j], s.cstamp[j] == best) for j in range(m)]
            evictable = evictable + sum_terms([o.b2i(o.and_(row[j], s.ref[j] == 0)) for j in range(m)])
            chosen.append(row)
        return length, chosen, evictable

    def adopt(self, sel: list[Term], chosen: list[list[Term]], length: Term, cond: Term) -> None:
        o, s, m = self.o, self.s, self.shape.records
        for j in range(m):
            s.ref[j] = s.ref[j] + o.ite(cond, sum_terms([o.b2i(row[j]) for row in chosen]), 0)
        for k, row in enumerate(chosen):
            rec = sum_terms([o.ite(row[j], j, 0) for j in range(m)])
            taken = o.or_(*row)
            for i in range(self.shape.num_slots):
                s.table[i][k] = o.ite(o.and_(cond, sel[i], taken), rec, s.table[i][k])
        for i in range(self.shape.num_slots):
            s.ncached[i] = o.ite(o.and_(cond, sel[i]), length, s.ncached[i])

    # -- take
    def take(self, sel: list[Term], start: Term, n: Term, cond: Term) -> None:
        """Append n blocks from the head of the free queue to the selected slot's table (entries start..):
        uncached free ones while the free count allows, then LRU evictions, then uncached ones again (an
        over-committed pool), as BlockPool.take."""
        o, s, shape = self.o, self.s, self.shape
        m = shape.records
        empty = [self.is_empty(j) for j in range(m)]
        lru = [self.is_free_cached(j) for j in range(m)]
        lru_n = sum_terms([o.b2i(x) for x in lru])
        uncached_free = shape.num_blocks - self.held() - lru_n
        fresh = o.min(n, o.max(0, uncached_free))
        victims = o.min(n - fresh, lru_n)
        extra = n - fresh - victims
        erank, count = [], 0
        for j in range(m):
            erank.append(count)
            count = count + o.b2i(empty[j])
        s.overflow = o.or_(s.overflow, o.and_(cond, fresh + extra > count))
        vrank = [sum_terms([o.b2i(o.and_(lru[q], s.lstamp[q] < s.lstamp[j])) for q in range(m) if q != j])
                 for j in range(m)]
        takes_empty = [o.and_(cond, empty[j], erank[j] < fresh + extra) for j in range(m)]
        takes_lru = [o.and_(cond, lru[j], vrank[j] < victims) for j in range(m)]
        pos = [o.ite(takes_empty[j], o.ite(erank[j] < fresh, start + erank[j], start + victims + erank[j]),
                     o.ite(takes_lru[j], start + fresh + vrank[j], -1)) for j in range(m)]
        for k in range(shape.table):
            rec = sum_terms([o.ite(pos[j] == k, j, 0) for j in range(m)])
            inside = o.and_(cond, start <= k, k < start + n)
            for i in range(shape.num_slots):
                s.table[i][k] = o.ite(o.and_(inside, sel[i]), rec, s.table[i][k])
        for j in range(m):
            taken = o.or_(takes_empty[j], takes_lru[j])
            s.ref[j] = o.ite(taken, 1, s.ref[j])
            s.chain[j] = o.ite(taken, NO_HASH, s.chain[j])

    # -- cache
    def cache(self, sel: list[Term], codes: list[Term], truths: list[Term], upto: Term, cond: Term) -> None:
        """Register the selected slot's full blocks among its first ``upto`` tokens (BlockPool.cache)."""
        o, s, shape = self.o, self.s, self.shape
        full = o.floor_div(upto, shape.block_size)
        start = sum_terms([o.ite(sel[i], s.ncached[i], 0) for i in range(shape.num_slots)])
        go = o.and_(cond, full > start)
        for k in range(shape.table):
            at_k = o.and_(go, start <= k, k < full)
            rec = self.entry(sel, k)
            for j in range(shape.records):
                here = o.and_(at_k, rec == j)
                s.chain[j] = o.ite(here, codes[k], s.chain[j])
                s.truth[j] = o.ite(here, truths[k], s.truth[j])
                s.cstamp[j] = o.ite(here, s.clock + k, s.cstamp[j])
        for i in range(shape.num_slots):
            s.ncached[i] = o.ite(o.and_(go, sel[i]), full, s.ncached[i])
        s.clock = s.clock + o.ite(go, shape.table + 1, 0)

    # -- release
    def release(self, holders: list[tuple[int, Term, Term, Term]]) -> None:
        """Free the tables of several slots, (slot, condition, its blocks, its act's rank) each, the ranks
        giving the engine's order of the acts: each table tail first; a block whose count drops to 0 joins the
        LRU tail if cached (at the last releaser's act, at its lowest entry), else the uncached free blocks."""
        o, s, shape = self.o, self.s, self.shape
        length = shape.table
        if not holders:
            return
        for j in range(shape.records):
            dec: Term = 0
            stamp: Term = -1
            for i, cond, blocks, rank in holders:
                hits = [o.and_(cond, k < blocks, s.table[i][k] == j) for k in range(length)]
                cnt = sum_terms([o.b2i(h) for h in hits])
                low: Term = 0
                for k in reversed(range(length)):
                    low = o.ite(hits[k], k, low)
                mine = s.clock + rank * (length + 1) + (length - low)
                stamp = o.ite(o.and_(cnt > 0, mine > stamp), mine, stamp)
                dec = dec + cnt
            freed = o.and_(dec > 0, s.ref[j] - dec == 0, s.chain[j] >= 0)
            s.lstamp[j] = o.ite(freed, stamp, s.lstamp[j])
            s.ref[j] = s.ref[j] - dec
        for i, cond, _, _ in holders:
            s.ncached[i] = o.ite(cond, 0, s.ncached[i])
        s.clock = s.clock + o.ite(o.or_(*(cond for _, cond, _, _ in holders)), len(holders) * (length + 1), 0)

    # -- what the cache invariants read (checker.semantics.blockpool.PoolFacts), recounted from the tables
    def facts(self, blocks: list[Term], true_codes: list[list[Term]]):
        from checker.semantics.blockpool import PoolFacts

        o, s, shape = self.o, self.s, self.shape
        m, length = shape.records, shape.table
        listed = [sum_terms([o.b2i(o.and_(k < blocks[i], s.table[i][k] == j))
                             for i in range(shape.num_slots) for k in range(length)]) for j in range(m)]
        held = sum_terms([o.b2i(x > 0) for x in listed])
        chain_errors: Term = 0
        for i in range(shape.num_slots):
            for k in range(length):
                val = sum_terms([o.ite(s.table[i][k] == j, s.truth[j] if not shape.chained else s.chain[j], 0)
                                 for j in range(m)])
                chain_errors = chain_errors + o.b2i(o.and_(k < s.ncached[i], val != true_codes[i][k]))
        return PoolFacts(held=held, free=shape.num_blocks - self.held(), shared=sum_terms(list(blocks)) - held,
                         cached=sum_terms([o.b2i(c >= 0) for c in s.chain]),
                         ref_errors=sum_terms([o.b2i(listed[j] != s.ref[j]) for j in range(m)]),
                         chain_errors=chain_errors)


# ----------------------------------------------------------------------------------------- the engine's pool
def _keys_of(table: dict, chain: int) -> list:
    """The keys (block tokens) along an interned chain, block 0 first (the interning table inverted)."""
    inverse = {v: k for k, v in table.items()}
    keys = []
    while chain != -1:
        parent, key = inverse[chain]
        keys.append(key)
        chain = parent
    return keys[::-1]


def _decode_keys(shape: Shape, keys: list, chained: bool) -> int:
    """The code of a chain (chained) or of a hash (its last key, unchained) from its block tokens."""
    bs = shape.block_size
    key = keys[-1]
    k = len(keys) - 1 if chained else None
    if key and key[0] == "own":
        return _code(shape, 3 + key[1], key[2], 0)
    if chained:
        first = keys[0][0][0]
        group, offset = first // TOKEN_ID_SPAN, (first % TOKEN_ID_SPAN) // bs
        kind = {(1, 0): 0, (2, 0): 1, (1, 1): 2}[(group, offset)]
        prompt_tokens = sum(n for kk in keys for a, n in kk if a != GREEDY_OUTPUT_TOKEN)
        return _code(shape, kind, k, prompt_tokens)
    runs = [(a, n) for a, n in key if a != GREEDY_OUTPUT_TOKEN]
    if not runs:
        return OUTPUT_ONLY
    a, n = runs[0]
    return _code(shape, a // TOKEN_ID_SPAN - 1, (a % TOKEN_ID_SPAN) // bs, n)


def engine_codes(shape: Shape, pool) -> tuple[dict[int, int], dict[int, int]]:
    """The engine pool's cached blocks -> hash code, and (unchained) -> true chain code."""
    chains = {h: _decode_keys(shape, _keys_of(pool.chains, h), shape.chained) for h in set(pool.hash_of.values())}
    hashes = {b: chains[h] for b, h in pool.hash_of.items()}
    truths = {}
    if not shape.chained:
        tc = {h: _decode_keys(shape, _keys_of(pool.true_chains, h), True) for h in set(pool.truth.values())}
        truths = {b: tc[h] for b, h in pool.truth.items()}
    return hashes, truths


def pool_from_engine(shape: Shape, pool, requests) -> PoolState:
    """The encoding's state for the engine's pool (records numbered by first appearance: the block tables in
    slot order, then the LRU queue)."""
    hashes, truths = engine_codes(shape, pool)
    index: dict[int, int] = {}
    for r in requests:
        for b in r.block_ids:
            index.setdefault(b, len(index))
    for b in pool.lru:
        index.setdefault(b, len(index))
    if len(index) > shape.records or any(len(r.block_ids) > shape.table for r in requests):
        raise InputError(Problem("kv", len(index), f"at most {shape.records} blocks and {shape.table} per request "
                                 "for this pool encoding"))
    st = empty_pool(shape)
    order = {b: i for i, b in enumerate(b for blocks in pool.cached.values() for b in blocks)}
    for b, j in index.items():
        st.chain[j] = hashes.get(b, NO_HASH)
        st.truth[j] = truths.get(b, st.chain[j])
        st.cstamp[j] = order.get(b, 0)
        st.ref[j] = pool.refs.get(b, 0)
    for pos, b in enumerate(pool.lru):
        st.lstamp[index[b]] = pos
    for i, r in enumerate(requests):
        for k, b in enumerate(r.block_ids):
            st.table[i][k] = index[b]
        st.ncached[i] = r.num_cached_blocks
    st.clock = len(order) + len(pool.lru) + 1
    return st


# ----------------------------------------------------------------------------------------- the canonical view
def canonical(tables: list[list[int]], ncached: list[int], lru: list[int], refs: dict[int, int],
              hashes: dict[int, int], truths: dict[int, int], cached_order: list[int]) -> dict[str, object]:
    """The pool as conformance compares it, independent of block numbering: blocks are named by first
    appearance in the tables (slot order), then in the LRU queue; per name its reference count, hash code and
    true chain code; the LRU queue in order; each hash's blocks in the order they were cached."""
    names: dict[int, int] = {}
    for t in tables:
        for b in t:
            names.setdefault(b, len(names))
    for b in lru:
        names.setdefault(b, len(names))
    out: dict[str, object] = {}
    for i, (t, c) in enumerate(zip(tables, ncached)):
        out[f"pool.table{i}"] = tuple(names[b] for b in t)
        out[f"pool.ncached{i}"] = c
    out["pool.lru"] = tuple(names[b] for b in lru)
    out["pool.blocks"] = tuple((names[b], refs.get(b, 0), hashes.get(b, NO_HASH), truths.get(b, hashes.get(b, NO_HASH)))
                               for b in sorted(names, key=names.get))
    by_hash: dict[int, list[int]] = {}
    for b in cached_order:
        if b in names:
            by_hash.setdefault(hashes[b], []).append(names[b])
    out["pool.cached_order"] = tuple(sorted(tuple(v) for v in by_hash.values() if len(v) > 1))
    out["pool.cached_count"] = len(hashes)
    return out


def canonical_of_engine(shape: Shape, pool, requests) -> dict[str, object]:
    hashes, truths = engine_codes(shape, pool)
    order = [b for blocks in pool.cached.values() for b in blocks]
    return canonical([list(r.block_ids) for r in requests], [r.num_cached_blocks for r in requests], list(pool.lru),
                     dict(pool.refs), hashes, truths if not shape.chained else {}, order)


def canonical_of_values(shape: Shape, st: PoolState, blocks: list[int]) -> dict[str, object]:
    """``st`` holds plain ints (IntOps, or a z3 model read back)."""
    m = shape.records
    tables = [[st.table[i][k] for k in range(blocks[i])] for i in range(shape.num_slots)]
    lru = sorted((j for j in range(m) if st.ref[j] == 0 and st.chain[j] >= 0), key=lambda j: st.lstamp[j])
    refs = {j: st.ref[j] for j in range(m) if st.ref[j] != 0}
    hashes = {j: st.chain[j] for j in range(m) if st.chain[j] >= 0}
    truths = {j: st.truth[j] for j in hashes} if not shape.chained else {}
    order = sorted(hashes, key=lambda j: st.cstamp[j])
    out = canonical(tables, list(st.ncached), lru, refs, hashes, truths, order)
    out["pool.overflow"] = bool(st.overflow)
    return out
