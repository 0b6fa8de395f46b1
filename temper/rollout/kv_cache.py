"""Prefix KV cache: a radix tree over token ids whose nodes hold the K/V of their edge.

Why a radix tree: the prefixes that repeat in post-training are nested layers: a system prompt,
then a document, then a GRPO prompt sampled G times, then each turn of an agent episode. A
token-level radix tree shares every layer with everything below it, matches any prefix length
(no block rounding, so the next turn of an episode re-encodes none of its history) and splits an
edge where two requests diverge.

Memory: the bytes of K/V the nodes hold are bounded by ``budget_bytes``. Eviction is LRU over
leaves. A lookup or an insert touches every node on its path with the same tick, so a parent is
never older than any of its children and evicting the least recently used leaf never strands a
suffix that could still be matched. A match hands out a fresh concatenated copy, so evicting a
node never touches a running request's cache (the budget bounds the shared cache; the KV of
running requests is bounded by the lanes' ``max_running`` times the context length).

Only full-attention caches (``DynamicLayer``: K/V of shape [batch, heads, seq, head_dim]) are
supported; the engine refuses sliding-window or linear-attention models.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import NamedTuple

import torch

LayerKV = list[tuple[torch.Tensor, torch.Tensor]]


@dataclass(eq=False)
class _Node:
    tokens: tuple[int, ...]
    kv: LayerKV
    parent: _Node | None
    children: dict[int, _Node] = field(default_factory=dict)
    last_used: int = 0

    @property
    def nbytes(self) -> int:
        return sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in self.kv)


class PrefixMatch(NamedTuple):
    length: int
    kv: LayerKV | None  # per layer, [1, heads, length, head_dim]; None when length == 0


def _common_prefix(a: tuple[int, ...], b: list[int], start: int) -> int:
    n = min(len(a), len(b) - start)
    i = 0
    while i < n and a[i] == b[start + i]:
        i += 1
    return i


def _slice(kv: LayerKV, lo: int, hi: int) -> LayerKV:
    """A copy of positions [lo, hi): a copy, so the parent tensor's storage can be freed."""
    return [(k[:, :, lo:hi].clone(), v[:, :, lo:hi].clone()) for k, v in kv]


class PrefixKVCache:
    def __init__(self, budget_bytes: int) -> None:
        self.budget_bytes = budget_bytes
        self._root = _Node((), [], None)
        self._leaves: set[_Node] = set()
        self._tick = 0
        self._bytes = 0
        self._lock = threading.Lock()
        self.lookups = self.hits = self.hit_tokens = 0
        self.inserted_tokens = self.evicted_tokens = self.evictions = 0

    # -- reading ---------------------------------------------------------------------------------
    def match(self, tokens: list[int], max_length: int | None = None) -> PrefixMatch:
        """Longest cached prefix of ``tokens`` (at most ``max_length`` tokens) and a copy of its K/V."""
        limit = len(tokens) if max_length is None else min(max_length, len(tokens))
        with self._lock:
            self.lookups += 1
            segments, pos = self._walk(tokens[:limit])
            if not segments:
                return PrefixMatch(0, None)
            self._touch(segments[-1][0])
            self.hits += 1
            self.hit_tokens += pos
            layers = len(segments[0][0].kv)
            kv = [(torch.cat([n.kv[i][0][:, :, :k] for n, k in segments], dim=-2),
                   torch.cat([n.kv[i][1][:, :, :k] for n, k in segments], dim=-2)) for i in range(layers)]
            return PrefixMatch(pos, kv)

    def peek(self, tokens: list[int]) -> int:
        """Length of the longest cached prefix of ``tokens``: no copy, no LRU touch, not counted as a lookup."""
        with self._lock:
            return self._walk(tokens)[1]

    def _walk(self, tokens: list[int]) -> tuple[list[tuple[_Node, int]], int]:
        """The nodes along the longest cached prefix of ``tokens``, each with how many of its tokens match,
        and that prefix's length (the caller holds the lock)."""
        segments: list[tuple[_Node, int]] = []
        node, pos = self._root, 0
        while pos < len(tokens):
            child = node.children.get(tokens[pos])
            if child is None:
                break
            k = _common_prefix(child.tokens, tokens, pos)
            segments.append((child, k))
            pos += k
            if k < len(child.tokens):
                break
            node = child
        return segments, pos

    # -- writing ---------------------------------------------------------------------------------
    def insert(self, tokens: list[int], kv: LayerKV) -> int:
        """Keep the K/V of ``tokens`` (``kv[i]`` covers at least ``len(tokens)`` positions, batch 1).

        Only the part not already cached is copied. Returns the number of newly cached tokens.
        Evicts LRU leaves afterwards until the budget holds (possibly the new leaf itself).
        """
        if not tokens or self.budget_bytes <= 0:
            return 0
        if kv[0][0].shape[-2] < len(tokens) or kv[0][0].shape[0] != 1:
            raise ValueError(f"insert: kv covers {kv[0][0].shape[-2]} positions (batch {kv[0][0].shape[0]}), "
                             f"need batch 1 and >= {len(tokens)}")
        with self._lock:
            node, pos, added = self._root, 0, 0
            while pos < len(tokens):
                child = node.children.get(tokens[pos])
                if child is None:
                    new = _Node(tuple(tokens[pos:]), _slice(kv, pos, len(tokens)), node)
                    self._attach(node, new)
                    added = len(tokens) - pos
                    self._bytes += new.nbytes
                    node, pos = new, len(tokens)
                    break
                k = _common_prefix(child.tokens, tokens, pos)
                if k < len(child.tokens):
                    child = self._split(child, k)
                node, pos = child, pos + k
            self._touch(node)
            self.inserted_tokens += added
            self._evict()
            return added

    def clear(self) -> None:
        with self._lock:
            self._root.children.clear()
            self._leaves.clear()
            self._bytes = 0

    # -- introspection ---------------------------------------------------------------------------
    @property
    def nbytes(self) -> int:
        return self._bytes

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {"bytes": self._bytes, "budget_bytes": self.budget_bytes, "nodes": self._count(self._root) - 1,
                    "lookups": self.lookups, "hits": self.hits, "hit_tokens": self.hit_tokens,
                    "inserted_tokens": self.inserted_tokens, "evicted_tokens": self.evicted_tokens,
                    "evictions": self.evictions}

    def cached_sequences(self) -> list[tuple[int, ...]]:
        """Every root-to-leaf token sequence (for tests and debugging)."""
        with self._lock:
            out: list[tuple[int, ...]] = []
            stack = [(self._root, ())]
            while stack:
                node, prefix = stack.pop()
                seq = prefix + node.tokens
                if not node.children and node is not self._root:
                    out.append(seq)
                stack.extend((c, seq) for c in node.children.values())
            return out

    # -- internals (called with the lock held) ---------------------------------------------------
    def _count(self, node: _Node) -> int:
        return 1 + sum(self._count(c) for c in node.children.values())

    def _touch(self, node: _Node | None) -> None:
        self._tick += 1
        while node is not None:
            node.last_used = self._tick
            node = node.parent

    def _attach(self, parent: _Node, child: _Node) -> None:
        parent.children[child.tokens[0]] = child
        child.parent = parent
        self._leaves.discard(parent)
        if not child.children:
            self._leaves.add(child)

    def _split(self, node: _Node, at: int) -> _Node:
        """Cut ``node``'s edge after ``at`` tokens; return the new upper node (the lower keeps the children)."""
        parent = node.parent
        assert parent is not None and 0 < at < len(node.tokens)
        upper = _Node(node.tokens[:at], _slice(node.kv, 0, at), parent, last_used=node.last_used)
        node.kv = _slice(node.kv, at, len(node.tokens))
        node.tokens = node.tokens[at:]
        parent.children[upper.tokens[0]] = upper
        upper.children[node.tokens[0]] = node
        node.parent = upper
        return upper

    def _evict(self) -> None:
        while self._bytes > self.budget_bytes and self._leaves:
            leaf = min(self._leaves, key=lambda n: n.last_used)
            parent = leaf.parent
            assert parent is not None
            del parent.children[leaf.tokens[0]]
            self._leaves.discard(leaf)
            self._bytes -= leaf.nbytes
            self.evicted_tokens += len(leaf.tokens)
            self.evictions += 1
            if parent is not self._root and not parent.children:
                self._leaves.add(parent)


def kv_of(cache, batch_index: int = 0) -> LayerKV:
    """Per-layer (K, V) views of one batch row of a transformers ``DynamicCache`` (or of a slot pool's
    ``SlotCache``, which keeps its rows elsewhere)."""
    if hasattr(cache, "row_kv"):
        return cache.row_kv(batch_index)
    return [(layer.keys[batch_index:batch_index + 1], layer.values[batch_index:batch_index + 1])
            for layer in cache.layers]


def crop_cache(cache, length: int) -> None:
    """Keep the first ``length`` positions of every layer (a speculative step's rejected tail goes). A growable
    layer keeps its buffer (only the view shrinks, the next append writes over the tail); other full-attention
    layers are sliced (transformers' own ``crop`` changed its meaning across versions)."""
    for layer in cache.layers:
        if getattr(layer, "_kview", None) is layer.keys and layer.keys is not None:
            layer.keys = layer._kview = layer._kbuf[..., :length, :]
            layer.values = layer._vbuf[..., :length, :]
        else:
            layer.keys, layer.values = layer.keys[..., :length, :], layer.values[..., :length, :]


def _growable_layer_class():
    # lazy: transformers (800 ms) would load in fast unit tests (test_rollout_kv_cache.py)
    from transformers.cache_utils import DynamicLayer

    class GrowableLayer(DynamicLayer):
        """A ``DynamicLayer`` that appends into spare capacity instead of ``torch.cat`` on every update.

        ``DynamicLayer`` re-copies the whole K/V at each decode step (O(context) per token); for a
        GRPO group of 8 rows over a 2k-token prompt that copy, not attention, is the cost of a step.
        Here the buffer is sized once to ``reserve`` positions (prompt + max_tokens, known at
        admission) or, without a reservation or past it, grows by half its size, so appends are
        amortized O(new tokens) and a chunked prefill never holds two copies of its K/V.
        Other methods (crop, batch select/repeat) replace ``keys``; the next update notices and
        rebuilds the buffer from them, so every inherited method stays correct.
        """

        reserve = 0

        def update(self, key_states, value_states, *args, **kwargs):
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            keys, values = self.keys, self.values
            old = 0 if keys is None or keys.numel() == 0 else keys.shape[-2]
            new = old + key_states.shape[-2]
            buf = getattr(self, "_kbuf", None)
            if (getattr(self, "_kview", None) is not keys or buf is None or buf.shape[-2] < new
                    or buf.shape[:-2] != key_states.shape[:-2]):
                cap = self.reserve if self.reserve >= new else new + max(256, new // 2)
                kbuf = key_states.new_empty((*key_states.shape[:-2], cap, key_states.shape[-1]))
                vbuf = value_states.new_empty((*value_states.shape[:-2], cap, value_states.shape[-1]))
                if old:
                    kbuf[..., :old, :] = keys
                    vbuf[..., :old, :] = values
                self._kbuf, self._vbuf = kbuf, vbuf
            self._kbuf[..., old:new, :] = key_states
            self._vbuf[..., old:new, :] = value_states
            self.keys = self._kview = self._kbuf[..., :new, :]
            self.values = self._vbuf[..., :new, :]
            return self.keys, self.values

    return GrowableLayer


_GROWABLE = None


def _growable_cache(config):
    global _GROWABLE
    # lazy: transformers (800 ms) would load in fast unit tests (test_rollout_kv_cache.py)
    from transformers import DynamicCache

    if _GROWABLE is None:
        _GROWABLE = _growable_layer_class()
    cache = DynamicCache(config=config)
    cache.layers = [_GROWABLE() for _ in cache.layers]
    return cache


def cache_from(kv: LayerKV | None, config, reserve: int = 0):
    """A ``DynamicCache`` of growable full-attention layers with room for ``reserve`` positions, pre-filled
    with ``kv`` (or empty)."""
    cache = _growable_cache(config)
    for layer in cache.layers:
        layer.reserve = reserve
    for layer, (k, v) in zip(cache.layers, kv or []):
        layer.update(k, v)
    return cache
