"""SGLang's radix (prefix) cache: a page-aligned radix tree over token ids, as SGLang 0.5.23's UnifiedRadixCache keeps
it for the plain full-attention KV (mem_cache/unified_radix_cache.py, unified_cache/unified_tree_core.py,
unified_cache/components/full.py; docs/semantics.md, "SGLang's radix cache", derives each rule).

- A node holds a run of tokens whose length is a whole number of pages; its children are keyed by their first page
  (a dict: insertion order is the order dfs-weight walks ties in). The KV of a node's tokens is in the pool.
- Locks (inc_lock_ref): locking a node locks it and every ancestor; a node with lock count 0 is *evictable*, else
  *protected*. evictable + protected is the tree's KV, in tokens.
- Every node has a last-access time from one counter: a match stamps the node it ends on with a new tick and its
  ancestors each 1e-5 older; an insert stamps each node it walks and the root; a new node and the lower half of a
  split get new ticks.
- Eviction: the evictable leaves, least recently accessed first (a parent that becomes an evictable leaf joins
  them), each dropped whole, until the tokens asked for are freed or nothing is evictable.
- A match and an insert split a node where the key leaves it (page-aligned); the upper half inherits the lock count.

The tree holds token ids only; which pool pages they are is counted by the caller (checker.semantics.sglang).
"""

from __future__ import annotations

import heapq

ANCESTOR_AGE = 1e-5  # a match stamps each ancestor of the node it ends on this much older than the one below


class Node:
    __slots__ = ("key", "parent", "children", "lock", "time", "id")

    def __init__(self, key: tuple, parent: Node | None, lock: int, time: float, nid: int):
        self.key = key
        self.parent = parent
        self.children: dict[tuple, Node] = {}
        self.lock = lock
        self.time = time
        self.id = nid


class Tree:
    """One radix tree; sizes in tokens."""

    __slots__ = ("page", "root", "clock", "next_id", "evictable", "protected")

    def __init__(self, page: int):
        self.page = page
        self.clock = 0
        self.next_id = 0
        self.evictable = 0
        self.protected = 0
        self.root = self._node((), None, 0)

    # ----------------------------------------------------------------------------------- bookkeeping
    def _tick(self) -> int:
        t = self.clock
        self.clock += 1
        return t

    def _node(self, key: tuple, parent: Node | None, lock: int) -> Node:
        n = Node(key, parent, lock, self._tick(), self.next_id)
        self.next_id += 1
        return n

    def _common(self, key: tuple, tokens: tuple, off: int, end: int) -> int:
        """Tokens of key that tokens[off:end] matches, in whole pages."""
        n = min(len(key), end - off)
        if tokens[off:off + n] == key[:n]:
            return n // self.page * self.page
        p = self.page
        m = 0
        while m + p <= n and tokens[off + m:off + m + p] == key[m:m + p]:
            m += p
        return m

    def _split(self, child: Node, m: int) -> Node:
        """_split_node: the first m tokens of child become a new parent above it (the lock count copied)."""
        p = self.page
        parent = child.parent
        upper = self._node(child.key[:m], parent, child.lock)
        parent.children[child.key[:p]] = upper  # the same key: its place in the parent's order kept
        child.key = child.key[m:]
        upper.children[child.key[:p]] = child
        child.parent = upper
        child.time = self._tick()
        return upper

    # ----------------------------------------------------------------------------------- the operations
    def match(self, tokens: tuple, limit: int | None = None) -> tuple[int, Node]:
        """match_prefix: the cached, page-aligned prefix of tokens[:limit] and the node it ends on (the root: none).
        The node and its ancestors are stamped, unless the key is shorter than a page."""
        p = self.page
        end = len(tokens) if limit is None else min(limit, len(tokens))
        end = end // p * p
        if end <= 0:
            return 0, self.root
        node, off = self.root, 0
        while off < end:
            child = node.children.get(tokens[off:off + p])
            if child is None:
                break
            m = self._common(child.key, tokens, off, end)
            if m < len(child.key):
                node = self._split(child, m)
                off += m
                break
            node = child
            off += m
        t = self._tick()
        x = node
        while x is not None:
            x.time = t
            t -= ANCESTOR_AGE
            x = x.parent
        return off, node

    def insert(self, tokens: tuple, up_to: int, protected_len: int) -> tuple[Node, int, int]:
        """insert of tokens[:up_to], page-aligned, by a request whose first protected_len tokens are its locked path:
        returns the node it ends on, the tokens beyond protected_len that the tree already held (the request's copies
        are freed: duplicates), and the tokens of the new leaf (the request's pages become the tree's)."""
        p = self.page
        end = up_to // p * p
        self.root.time = self._tick()
        node, off, dup = self.root, 0, 0
        while off < end:
            child = node.children.get(tokens[off:off + p])
            if child is None:
                break
            child.time = self._tick()
            m = self._common(child.key, tokens, off, end)
            if m < len(child.key):
                child = self._split(child, m)
            start = max(0, protected_len - off)
            if start < m:
                dup += m - start
            node = child
            off += m
        new = end - off
        if new > 0:
            leaf = self._node(tokens[off:end], node, 0)
            node.children[leaf.key[:p]] = leaf
            self.evictable += new
            node = leaf
        return node, dup, max(new, 0)

    def lock(self, node: Node) -> None:
        root = self.root
        while node is not root:
            if node.lock == 0:
                n = len(node.key)
                self.evictable -= n
                self.protected += n
            node.lock += 1
            node = node.parent

    def unlock(self, node: Node) -> None:
        root = self.root
        while node is not root:
            node.lock -= 1
            if node.lock == 0:
                n = len(node.key)
                self.evictable += n
                self.protected -= n
            node = node.parent

    def evict(self, num_tokens: int) -> int:
        """Drop evictable leaves, least recently accessed first, until num_tokens are freed; the tokens freed."""
        if num_tokens <= 0 or self.evictable <= 0:
            return 0
        heap = [(x.time, x.id, x) for x in self._evictable_leaves()]
        heapq.heapify(heap)
        freed = 0
        root, p = self.root, self.page
        while freed < num_tokens and heap:
            _, _, x = heapq.heappop(heap)
            parent = x.parent
            del parent.children[x.key[:p]]
            x.parent = None
            n = len(x.key)
            self.evictable -= n
            freed += n
            if parent is not root and not parent.children and parent.lock == 0:
                heapq.heappush(heap, (parent.time, parent.id, parent))
        return freed

    def _evictable_leaves(self) -> list[Node]:
        out, stack = [], list(self.root.children.values())
        while stack:
            x = stack.pop()
            if x.children:
                stack.extend(x.children.values())
            elif x.lock == 0:
                out.append(x)
        return out

    def dfs_weight_order(self, nodes: list[Node]) -> list[int]:
        """_dfs_weight_order: indices of nodes (each a waiting request's match end) in a depth-first walk that visits
        children by descending weight (waiting requests ending in their subtree; ties in child order) and lists a
        node's own requests after its subtree."""
        at: dict[int, list[int]] = {}
        for i, n in enumerate(nodes):
            at.setdefault(n.id, []).append(i)
        weight: dict[int, int] = {}

        def w(n: Node) -> int:
            total = len(at.get(n.id, ()))
            for c in n.children.values():
                total += w(c)
            weight[n.id] = total
            return total

        w(self.root)
        order: list[int] = []

        def walk(n: Node) -> None:
            for c in sorted(n.children.values(), key=lambda c: -weight[c.id]):
                walk(c)
            order.extend(at.get(n.id, ()))

        walk(self.root)
        return order

    # ----------------------------------------------------------------------------------- state
    def copy(self) -> tuple[Tree, dict[int, Node]]:
        """An independent tree and its nodes by id (to re-point the requests' node references)."""
        c = Tree.__new__(Tree)
        c.page, c.clock, c.next_id = self.page, self.clock, self.next_id
        c.evictable, c.protected = self.evictable, self.protected
        by_id: dict[int, Node] = {}

        def dup(n: Node, parent: Node | None) -> Node:
            m = Node(n.key, parent, n.lock, n.time, n.id)
            by_id[n.id] = m
            for k, ch in n.children.items():
                m.children[k] = dup(ch, m)
            return m

        c.root = dup(self.root, None)
        return c, by_id

    def snapshot(self) -> tuple:
        """The tree up to what its behaviour depends on: structure, keys, locks, and the order of access times."""
        nodes: list[Node] = []

        def enc(n: Node) -> tuple:
            nodes.append(n)
            return (n.key, n.lock, n.id, tuple(enc(c) for c in n.children.values()))

        shape = enc(self.root)
        ranks = tuple(n.id for n in sorted(nodes, key=lambda n: n.time))
        return shape, ranks, self.next_id

    def size(self) -> int:
        return self.evictable + self.protected
