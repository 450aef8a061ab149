"""Paged KV accounting: ask-then-act pairs over the block pool and the swap space.

Without prefix caching the pool is counts (``s.kv_used``); with it, every call below goes through the
block pool with block identity (checker.semantics.blockpool, ``s.pool``) and ``s.kv_used`` is the pool
minus its free count (a block shared by several requests counted once).

A request computing ``t`` tokens of context needs ``ceil(t / block_size)`` blocks. Under full
reservation it holds the blocks of its whole possible context (prompt + max output, capped by
max_model_len) from admission on.
"""

from __future__ import annotations

from collections.abc import Callable

from checker.policy import Allocation
from checker.semantics import inflight, speculative
from checker.semantics.state import Request, SchedulerState

FULL_RESERVATION = Allocation.FULL_RESERVATION  # bound once: an Enum class attribute costs ~0.2 us per use
NO_HIT: list[int] = []  # no prefix-cache hit (never mutated)


def blocks_for(tokens: int, block_size: int) -> int:
    return -(-tokens // block_size)


def max_context(s: SchedulerState, r: Request) -> int:
    """Most tokens of KV the request can ever hold: it stops at max_model_len or max_output."""
    return min(r.prompt_len + r.max_output, s.policy.max_model_len) - 1


def target_blocks(s: SchedulerState, r: Request, n: int) -> int:
    """Blocks the request must hold to compute n more tokens."""
    kv = s.policy.kv
    size = kv.block_size
    tokens = r.num_computed + n
    if n and s.spec is not None:  # the drafter's lookahead slots come with the scheduled tokens
        tokens = speculative.lookahead_tokens(s, r, tokens)
    need = blocks_for(tokens, size)
    if kv.allocation is FULL_RESERVATION:
        need = max(need, blocks_for(max_context(s, r), size))
    return need


def new_blocks(s: SchedulerState, r: Request, n: int) -> int:
    return max(0, target_blocks(s, r, n) - r.blocks)


def free_blocks(s: SchedulerState) -> int:
    return s.policy.kv.num_blocks - s.kv_used


def can_grow(s: SchedulerState, r: Request, n: int) -> bool:
    """A running request may compute n more tokens (always true if the policy does not check)."""
    kv = s.policy.kv
    if not kv.check_allocation:
        return True
    return new_blocks(s, r, n) <= free_blocks(s)


def prefix_hit(s: SchedulerState, r: Request) -> list[int]:
    """The cached blocks a waiting request would start from (none without prefix caching)."""
    if s.pool is None or r.num_computed:
        return NO_HIT
    return s.pool.hit(r)


def admission_free(s: SchedulerState) -> int:
    """Free blocks an admission may take: the watermark is kept free when something is already running."""
    return free_blocks(s) - (s.policy.kv.watermark_blocks if s.running else 0)


def held_with_hit(s: SchedulerState, r: Request, hit: list[int]) -> int:
    """Blocks a waiting request starts from: its own and its hit's, less the hit blocks that are free (adopting
    them takes them off the free queue, as vLLM's get_num_blocks_to_allocate counts them)."""
    cache = s.policy.kv.prefix_caching
    return r.blocks + len(hit) - (s.pool.num_evictable(hit) if hit and cache.count_evictable_hits else 0)


def can_admit(s: SchedulerState, r: Request, n: int, hit: list[int] = NO_HIT) -> bool:
    """A waiting request may be admitted with a first chunk of n tokens (after the hit's tokens, which
    ``r.num_computed`` already counts): the chunk's blocks (and, with reserve_full_prompt, the blocks of
    its whole current sequence) fit with the watermark kept free when something is already running. Hit
    blocks are not taken from the pool, except those that are free (held_with_hit)."""
    p = s.policy
    kv = p.kv
    free = admission_free(s)
    held = held_with_hit(s, r, hit)
    if p.admission.reserve_full_prompt:
        whole = max(target_blocks(s, r, 0), blocks_for(r.num_tokens, kv.block_size)) - held
        if whole > free:
            return False
    return target_blocks(s, r, n) - held <= free


def adopt(s: SchedulerState, r: Request, hit: list[int]) -> None:
    """Start an admitted request from its prefix-cache hit (its tokens count as computed)."""
    pool = s.pool
    if pool is None:
        return
    pool.adopt(r, hit)
    r.blocks = len(hit)
    r.num_computed = len(hit) * pool.block_size
    s.kv_used = pool.num_used


def take(s: SchedulerState, r: Request, added: int) -> None:
    """Give the request ``added`` more blocks (from the block pool's free queue with prefix caching)."""
    r.blocks += added
    pool = s.pool
    if pool is None:
        s.kv_used += added
    else:
        pool.take(r, added)
        s.kv_used = pool.num_used


def allocate(s: SchedulerState, r: Request, n: int) -> int:
    """Give the request the blocks for n more tokens; return how many were added. With prefix caching
    they come from the block pool, and the full blocks among the scheduled tokens are cached."""
    added = new_blocks(s, r, n)
    take(s, r, added)
    pool = s.pool
    if pool is not None:
        known = r.prompt_len + r.num_generated if s.pipe is None else inflight.known_tokens(s, r)
        pool.cache(r, min(r.num_computed + n, known))
        s.kv_used = pool.num_used
    return added


def free(s: SchedulerState, r: Request) -> None:
    pool = s.pool
    if pool is None:
        s.kv_used -= r.blocks
    else:
        pool.release(r)
        s.kv_used = pool.num_used
    r.blocks = 0


def release_held(s: SchedulerState, released: list[int], due: Callable[[Request], bool]) -> None:
    """Free the held requests (``s.holding``: cancelled, or pinned by a connector) that are due; note their rids."""
    keep = []
    for r in s.holding:
        if due(r):
            free(s, r)
            r.release_step = -1
            released.append(r.rid)
        else:
            keep.append(r)
    s.holding = keep


def can_swap_out(s: SchedulerState, blocks: int) -> bool:
    return s.swap_used + blocks <= s.policy.kv.swap_blocks


def swap_out(s: SchedulerState, r: Request, blocks: int) -> None:
    """Move ``blocks`` of the request's KV to swap space and free all its pool blocks."""
    r.swapped_blocks = blocks
    s.swap_used += blocks
    free(s, r)


def swap_in_release(s: SchedulerState, r: Request) -> None:
    s.swap_used -= r.swapped_blocks
    r.swapped_blocks = 0
