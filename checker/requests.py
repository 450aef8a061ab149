"""A request as the environment supplies it (from a workload, a trace, a log's arrivals or a solver model),
and the token identity of its prompt, which prefix caching needs.

This is an input schema: it sits below the semantics (checker/semantics reads it, never the other way).

Token identity. Prefix caching reuses a KV block when the block's tokens and every token before it are
the same. A prompt's tokens are described compactly, as runs of consecutive token ids: ``(first, length)``
means the ids ``first, first + 1, ..., first + length - 1``. This is exactly how the real-scheduler harness
(``shared/tools/vllm-scheduler``) builds its prompts, so equal descriptions mean equal tokens there too:

- ``hash_ids`` (Mooncake traces): each id ``h`` names one block of ``hash_block_tokens`` tokens, the ids
  ``(10 + h) * 10**6 + j``; tokens past the last id are the request's own;
- ``prefix_group`` ``g``: the prompt is the first ``prompt_len`` ids of ``g * 10**6, g * 10**6 + 1, ...``, so
  two prompts of one group share their common length;
- neither: the prompt is the request's own (``content`` is None), shared with nobody.

Output tokens are all the same id (GREEDY_OUTPUT_TOKEN): identical contexts decoded greedily produce
identical tokens, so two requests with identical prompts also share the blocks of their outputs, as in the
harness (every sampled token there is the same non-EOS id).
"""

from __future__ import annotations

from dataclasses import dataclass, field

Run = tuple[int, int]  # (first token id, number of consecutive ids)
PromptContent = tuple[Run, ...]

GREEDY_OUTPUT_TOKEN = 7  # the id every output token has (the harness samples this id)
HASH_ID_BASE = 10  # hash id h names the token ids (HASH_ID_BASE + h) * TOKEN_ID_SPAN + j
TOKEN_ID_SPAN = 1_000_000  # token ids of one hash id or prefix group: a span this wide
OWN_TOKEN_BASE = 1000  # the harness gives request number i the ids (OWN_TOKEN_BASE + i) * TOKEN_ID_SPAN + j
DEFAULT_HASH_BLOCK_TOKENS = 512  # Mooncake traces hash 512-token blocks


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """A request as the environment supplies it."""

    rid: int
    arrival_us: int
    prompt_len: int
    output_len: int  # output tokens it produces before it stops
    max_output: int  # declared max_tokens; what full reservation reserves (>= output_len)
    priority: int = 0
    tenant: int = 0
    cls: int = 0
    cancel_us: int | None = None  # when the client cancels (None: never)
    content: PromptContent | None = None  # token identity of the prompt (None: its own tokens, shared with nobody)
    # A KV connector (policy.connector; ignored without one). external_tokens: leading prompt tokens the external
    # tier holds (a load covers those beyond the local prefix hit; only the first admission asks). load_steps: a
    # load started in step t is reported done in the output of step t + load_steps - 1 (None: never). send_steps:
    # on a prefill node, a request finishing in step t has its transfer confirmed in the output of step
    # t + 1 + send_steps (None: never).
    external_tokens: int = 0
    load_steps: int | None = 1
    send_steps: int | None = 0
    # The client asks to ignore EOS (a fixed-length request, as benchmark clients send): read by SGLang's rules
    # only (checker.semantics.sglang: its estimates take it at its full max output).
    ignore_eos: bool = False
    # Speculative decoding (policy.speculative; ignored without it): how many draft tokens the verifier accepts in
    # the request's successive steps that verify drafts (each clamped to the drafts scheduled; past the end, or
    # empty: none accepted). checker.semantics.speculative reads it.
    accepted: tuple[int, ...] = ()
    # With a KV connector that loads: the load is reported done and failed (policy.connector.load_failure says what
    # follows). Blocked waiting states (policy.queue.blocked_waiting; ignored when off): a structured-output request
    # whose grammar compiles for this many steps after its arrival step (its scans in those steps find it blocked).
    # Both left out of repr: the reprs of requests without them stay as they were (tests pin their digests).
    load_fails: bool = field(default=False, repr=False)
    grammar_steps: int = field(default=0, repr=False)


# A prompt identity, as the explicit-state searches choose it (checker/verify/explicit.py, checker/liveness): None
# (the request's own tokens) or (prefix group, offset in blocks): the group's token ids from offset * block_size
# on. Offset 1 of group 0 holds group 0's second block first: the same tokens as a group-0 prompt's block 1,
# after a different prefix (what chained hashes tell apart).
Identity = tuple[int, int] | None
IDENTITIES: tuple[Identity, ...] = (None, (0, 0), (1, 0), (0, 1))


def identity_name(ident: Identity) -> str:
    if ident is None:
        return "own tokens"
    group, offset = ident
    return f"prefix group {group}" + (" from its second block" if offset else "")


def identity_content(ident: Identity, prompt_len: int, block_size: int) -> PromptContent | None:
    if ident is None:
        return None
    group, offset = ident
    return ((group * TOKEN_ID_SPAN + offset * block_size, prompt_len),)


def own_tokens(index: int, start: int, length: int) -> Run:
    """The run of a request's own tokens from prompt position ``start`` (request number ``index`` in its file)."""
    return ((OWN_TOKEN_BASE + index) * TOKEN_ID_SPAN + start, length)


def content_from_hash_ids(hash_ids: list[int], hash_block_tokens: int, prompt_len: int, index: int) -> PromptContent:
    """The prompt of a Mooncake-style row: one run per hash id, then the request's own tokens."""
    runs: list[Run] = []
    pos = 0
    for h in hash_ids:
        if pos >= prompt_len:
            break
        n = min(hash_block_tokens, prompt_len - pos)
        runs.append(((HASH_ID_BASE + h) * TOKEN_ID_SPAN, n))
        pos += n
    if pos < prompt_len:
        runs.append(own_tokens(index, pos, prompt_len - pos))
    return tuple(runs)


def content_from_prefix_group(group: int, prompt_len: int) -> PromptContent:
    """The prompt of a row in prefix group ``group``: the group's first ``prompt_len`` ids."""
    return ((group * TOKEN_ID_SPAN, prompt_len),)


def prefix_problem(hash_ids: list[int] | None, hash_block_tokens: int, prompt_len: int,
                   prefix_group: int | None) -> tuple[str, object, str] | None:
    """What is wrong with a row's prefix fields, as (field, value, what is allowed), or None."""
    if hash_ids is None:
        return None
    if prefix_group is not None:
        return ("prefix_group", prefix_group, "no prefix_group when hash_ids are given (one prompt identity)")
    if any(h < 0 for h in hash_ids):
        return ("hash_ids", min(hash_ids), "ids >= 0")
    if len(set(hash_ids)) != len(hash_ids):
        seen: set[int] = set()
        dup = next(h for h in hash_ids if h in seen or seen.add(h))  # type: ignore[func-returns-value]
        return ("hash_ids", dup, "each id at most once in one request (a block's tokens appear once in a prompt)")
    need = -(-prompt_len // hash_block_tokens)
    if len(hash_ids) != need:
        return ("hash_ids", f"{len(hash_ids)} ids", f"{need} ids: ceil(prompt {prompt_len} / hash_block_tokens "
                f"{hash_block_tokens}), so that the ids cover the prompt")
    return None


def prompt_content(hash_ids: list[int] | None, hash_block_tokens: int, prompt_len: int, prefix_group: int | None,
                   index: int) -> PromptContent | None:
    """The token identity of a row with these prefix fields (request number ``index`` in its file)."""
    if hash_ids is not None:
        return content_from_hash_ids(hash_ids, hash_block_tokens, prompt_len, index)
    if prefix_group is not None:
        return content_from_prefix_group(prefix_group, prompt_len)
    return None


def shared_prefix_tokens(a: PromptContent | None, b: PromptContent | None) -> int:
    """How many leading prompt tokens two contents have in common (0 when either is the request's own)."""
    if a is None or b is None:
        return 0
    shared = 0
    for (fa, na), (fb, nb) in zip(a, b):
        if fa != fb:
            return shared
        if na != nb:
            return shared + min(na, nb)
        shared += na
    return shared
