"""Token recycling: the target's own runner-up candidates, remembered per token, become the next drafts.

Every verify call yields logits for each node it scored; their top-k are stored as that token's likely successors
(a vocab x k table, 1.5 MiB for 49k tokens and k=8, overwritten by newer evidence). A draft is a tree grown by
breadth-first search from the root through the table, `widths[d]` children per node at depth d+1.

The tree's shape suits the device (fit): where verifying more rows is nearly free (a GPU), the wide tree; where each
row costs (2-core CPU, int4: a 5-row verify 1.46x a 1-row one), a chain of first choices. Replayed along the
default model's greedy answers to the benchmark's prompts (benchmarks/RESULTS.md, session 21), the table's first
choice was the next token 31-50% of the time where recycling can pay (code, summarise, repeat), its 2nd-4th choices
only 10-13% more together: three more rows per level cost far more than that on the CPU. A chain reads only first
choices, which under greedy decoding are the tokens the target has just produced: it learns those (observe).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from edge.sampling import top_k as k_largest
from edge.speculative.drafter import ROOT, Draft, Drafter

if TYPE_CHECKING:
    from edge.speculative.adaptive import CostCurve

DEFAULT_WIDTHS = (4, 2, 2, 1, 1, 1, 1, 1)
CHAIN_WIDTHS = (1,) * 8
# What a runner-up adds to a level's chance that the target's token is among the drafts, as a share of a step
# (measured: 2nd-4th choices 0.03-0.04 each); a row that costs more than this to verify is not worth adding.
RUNNER_UP_GAIN = 0.03


class TokenRecycling(Drafter):
    name = "recycling"
    cheap = True
    learns = True

    def __init__(self, vocab_size: int, top_k: int = 8, widths: tuple[int, ...] = DEFAULT_WIDTHS,
                 max_nodes: int = 24):
        if top_k < max(widths):
            raise ValueError(f"top_k={top_k} is smaller than the widest level {max(widths)}")
        self.widths, self.max_nodes = tuple(widths), max_nodes
        self.successors = np.full((vocab_size, top_k), -1, dtype=np.int32)

    def observe(self, tokens: list[int], logits: Sequence[np.ndarray], produced: list[int] | None = None) -> None:
        """A chain reads only each token's first successor, which greedy decoding has just produced: recording it
        costs microseconds, where the top k of one 49k-logit row cost ~0.27 ms after a step (5% of an int4 step, per
        accepted row). A tree, or sampling, takes the top k of each row."""
        if not len(tokens):
            return
        if produced is not None and self.observes_cheaply():
            table = memoryview(self.successors)  # item access without numpy's indexing machinery (see propose)
            for token, successor in zip(tokens, produced):
                table[token, 0] = successor
            return
        self.successors[np.asarray(tokens)] = np.stack([top_k(row, self.successors.shape[1]) for row in logits])

    def observes_cheaply(self) -> bool:
        return max(self.widths) == 1

    def fit(self, cost: CostCurve) -> None:
        """A chain where an extra verify row costs more than a runner-up adds (see RUNNER_UP_GAIN), else the tree
        given (on a flat cost curve, the wide default)."""
        rows = min(max(cost.sizes), 1 + self.size(len(self.widths)))  # within the measured range
        if rows > 1 and (cost(rows) / cost(1) - 1) / (rows - 1) > RUNNER_UP_GAIN:
            self.widths = CHAIN_WIDTHS[:len(self.widths)]

    def size(self, depth: int) -> int:
        total, level = 0, 1
        for d in range(min(depth, len(self.widths))):
            level *= self.widths[d]
            total += level
        return min(total, self.max_nodes)

    def propose(self, context: list[int], depth: int) -> Draft:
        """Breadth-first through the table. It reads the table through a memoryview: after a target step has left
        the caches cold, each numpy indexing call costs tens of microseconds (measured in the loop, a chain switched
        off on open chat: propose 16 -> 12 us a step, observe 44 -> 9 us)."""
        tokens: list[int] = []
        parents: list[int] = []
        frontier = [(ROOT, context[-1])]
        budget = self.size(depth)
        table = memoryview(self.successors)
        for d in range(min(depth, len(self.widths))):
            next_frontier = []
            for parent, token in frontier:
                for j in range(self.widths[d]):
                    succ = table[token, j]
                    if succ < 0 or len(tokens) >= budget:
                        break
                    tokens.append(succ)
                    parents.append(parent)
                    next_frontier.append((len(tokens) - 1, succ))
            frontier = next_frontier
            if not frontier:
                break
        return Draft(tokens, parents)

    def reset(self) -> None:
        """The table is knowledge about the model, not the conversation: it is kept."""


def top_k(row: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k largest logits, largest first (ties: the lower index first)."""
    largest = k_largest(row, k)
    return largest[np.argsort(-row[largest], kind="stable")]
