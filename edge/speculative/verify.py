"""Scoring a draft with the target in one call, and deciding how much of it to keep.

Flattened layout of a verify call: node 0 is the root (the token the target produced last, not yet in its cache),
nodes 1..n are the draft's nodes. Row i of the returned logits is the target's prediction after node i's path.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from edge.model import MASKED
from edge.sampling import Sampler
from edge.speculative.drafter import ROOT, Draft


@dataclass
class Verdict:
    path: list[int]  # flattened nodes whose K/V stay in the cache, in order: [0, accepted nodes...]
    accepted: list[int]  # the accepted draft tokens (path[1:] as tokens)
    next_token: int | None  # the target's token after the path (the next root); None: a near-tie, undecided


def tree_inputs(past: int, root: int, draft: Draft) -> tuple[list[int], list[int], np.ndarray | None]:
    """Tokens, positions and attention bias for one verify call; the bias is None for a chain (plain causal)."""
    tokens = [root] + draft.tokens
    positions = [past] + [past + d for d in draft.depths()]
    if draft.is_chain:
        return tokens, positions, None
    n = len(tokens)
    bias = np.full((1, 1, n, past + n), MASKED, np.float32)
    bias[..., :past] = 0.0
    parent = [ROOT] + [p + 1 for p in draft.parents]  # flattened indices; the root's parent is ROOT
    for i in range(n):
        j = i
        while j != ROOT:
            bias[0, 0, i, past + j] = 0.0
            j = parent[j]
    return tokens, positions, bias


def _children(draft: Draft) -> list[list[int]]:
    """Children of each flattened node (0 = root), as flattened indices."""
    kids: list[list[int]] = [[] for _ in range(len(draft) + 1)]
    for i, p in enumerate(draft.parents):
        kids[p + 1].append(i + 1)
    return kids


def accept_greedy(draft: Draft, logits: np.ndarray, margin: float = 0.0, top: np.ndarray | None = None) -> Verdict:
    """Follow the draft while it agrees with the target's argmax: exactly what greedy decoding would emit.

    A row whose top-2 gap is under `margin` decides nothing: the verdict ends at its node with next_token None.
    top: the step's (rows, 2) row tops (Decoder.top), whose first column is each row's argmax, found by the head's
    kernel while the row was in cache; a row read back after the step costs ~30 us (session 42).
    """
    best_of = top[:, 0].tolist() if top is not None else None  # one numpy call, not one per row read
    if not len(draft):  # most steps of a drafter that is off: what plain decoding does, and no more
        return Verdict([0], [], _argmax(logits, best_of, 0))
    kids, node, path = _children(draft), 0, [0]
    while True:
        row = logits[node]
        best = _argmax(logits, best_of, node)
        if margin > 0 and top2_gap(row) < margin:
            return Verdict(path, [draft.tokens[i - 1] for i in path[1:]], None)
        match = next((c for c in kids[node] if draft.tokens[c - 1] == best), None)
        if match is None:
            return Verdict(path, [draft.tokens[i - 1] for i in path[1:]], best)
        node = match
        path.append(node)


def _argmax(logits: np.ndarray, best_of: list[float] | None, row: int) -> int:
    """The row's argmax: from the row tops where the kernel found one, else read from the row."""
    if best_of is not None and best_of[row] >= 0:
        return int(best_of[row])
    return int(np.argmax(logits[row]))


def top2_gap(row: np.ndarray) -> float:
    top = np.partition(row, -2)[-2:]
    return float(abs(top[1] - top[0]))


def accept_sampled(draft: Draft, logits: np.ndarray, sampler: Sampler) -> Verdict:
    """Speculative sampling: every emitted token follows the target's distribution p exactly.

    At each node the children are tried in turn: child c (drawn from q) is accepted with probability
    min(1, p(c)/q(c)); on rejection p becomes the normalised residual max(0, p - q) and the next child is tried;
    when none is left the token is drawn from the residual. A deterministic drafter's q is a point mass, so the
    residual is p with the rejected token removed, done in the sampler's workspace: each node's p is computed
    there, and a vocabulary-sized array allocated per row cost more than the row's softmax (session 43).
    """
    kids, node, path, rng = _children(draft), 0, [0], sampler.rng
    while True:
        p = sampler.probabilities(logits[node])
        accepted = None
        for child in kids[node]:
            token = draft.tokens[child - 1]
            q = None if draft.probs is None else draft.probs[child - 1]
            q_token = 1.0 if q is None else float(q[token])
            if rng.random() * q_token < p[token]:  # probability min(1, p/q)
                accepted = child
                break
            p = residual(p, token, q, in_place=q is None)
        if accepted is None:
            return Verdict(path, [draft.tokens[i - 1] for i in path[1:]], sampler.draw(p))
        node = accepted
        path.append(node)


def residual(p: np.ndarray, token: int, q: np.ndarray | None, in_place: bool = False) -> np.ndarray:
    """Normalised max(0, p - q): what the target still owes after the draft's token was rejected. in_place (point
    masses only): written over p."""
    if q is None:
        r = p if in_place else p.copy()
        kept, r[token] = r[token], 0.0
    else:
        r = np.maximum(p - q, 0.0)
    total = r.sum()
    if total > 0:
        return np.divide(r, total, out=r)
    if q is None:
        r[token] = kept  # total is 0 only by rounding when p == q: then p is still exact
    return p
