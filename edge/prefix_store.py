"""Saved KV cache prefixes of other conversations, so one engine can take turns between several without reading
each again from the start.

The engine keeps one KV cache, and a prompt reuses only what that cache holds. A server whose clients take turns
(two chats, or a chat app that asks for a title between two turns of the conversation) would otherwise feed every
conversation's whole history again at each switch: ~0.7 s for 1,000 tokens of SmolLM2 on 2 cores, against ~10 ms
to copy that many tokens' keys and values (46 KB a token) out and back. So when a prompt is about to overwrite a
cached prefix it shares little of, the engine saves that prefix here first, and a later prompt that continues a
saved prefix further than the live cache does gets it copied back.

CPU caches only (their numpy arrays are copied in place). Memory: up to `slots` saved prefixes, each its tokens'
share of the cache: not part of a memory plan, so the engine keeps none under a budget.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from edge.kv_cache import KVCache

MIN_SAVED = 32  # a shorter prefix is cheaper to read again than to keep


@dataclass
class Saved:
    tokens: list[int]
    rows: list[np.ndarray]  # each cache array's first len(tokens) positions


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


class PrefixStore:
    def __init__(self, slots: int):
        if slots < 1:
            raise ValueError(f"a prefix store needs at least one slot, got {slots}")
        self.slots = slots
        self.saved: list[Saved] = []  # least recently used first

    def best(self, ids: list[int]) -> tuple[int, Saved | None]:
        """The saved prefix sharing the most tokens with `ids`, and how many."""
        found, length = None, 0
        for entry in self.saved:
            n = common_prefix(entry.tokens, ids)
            if n > length:
                found, length = entry, n
        return length, found

    def save(self, tokens: list[int], cache: KVCache) -> None:
        """Keep a copy of what the cache holds for `tokens` (its first len(tokens) positions)."""
        if len(tokens) < MIN_SAVED or any(common_prefix(e.tokens, tokens) == len(tokens) for e in self.saved):
            return  # too short, or already held within a saved prefix
        self.saved = [e for e in self.saved if common_prefix(e.tokens, tokens) < len(e.tokens)]  # superseded
        n = len(tokens)
        self.saved.append(Saved(list(tokens), [a[:, :, :n].copy() for a in cache.arrays]))
        del self.saved[:-self.slots]

    def restore(self, entry: Saved, cache: KVCache) -> list[int]:
        """Copy a saved prefix back into the cache; returns the tokens it now holds."""
        n = len(entry.tokens)
        for a, rows in zip(cache.arrays, entry.rows):
            a[:, :, :n] = rows
        cache.length = n
        self.saved.remove(entry)
        self.saved.append(entry)  # most recently used
        return list(entry.tokens)
