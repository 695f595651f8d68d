"""Verification: tree inputs, greedy acceptance, and speculative sampling's exactness (chi-square on a toy model)."""

from __future__ import annotations

import numpy as np
import pytest

from edge.model import MASKED
from edge.sampling import Sampler, SamplingParams, probabilities
from edge.speculative.drafter import ROOT, Draft
from edge.speculative.verify import Verdict, accept_greedy, accept_sampled, residual, tree_inputs

V = 6
PARAMS = SamplingParams(temperature=0.9, top_k=5, top_p=0.95)


def test_tree_inputs_mask_ancestors_and_set_depth_positions():
    draft = Draft([7, 8, 9, 10], [ROOT, 0, ROOT, 2])  # two branches: 7->8 and 9->10
    tokens, positions, bias = tree_inputs(5, 1, draft)
    assert tokens == [1, 7, 8, 9, 10] and positions == [5, 6, 7, 6, 7]
    assert bias.shape == (1, 1, 5, 10) and (bias[0, 0, :, :5] == 0).all()
    visible = bias[0, 0, :, 5:] == 0
    expected = np.array([[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0], [1, 0, 0, 1, 0], [1, 0, 0, 1, 1]], bool)
    assert (visible == expected).all() and (bias[0, 0, :, 5:][~expected] == MASKED).all()
    assert tree_inputs(5, 1, Draft.chain([3, 4]))[2] is None  # a chain is plain causal attention


def test_draft_rejects_parents_out_of_order():
    with pytest.raises(ValueError, match="topological"):
        Draft([1, 2], [1, ROOT])


def one_hot_rows(winners):
    rows = np.zeros((len(winners), V), np.float32)
    rows[np.arange(len(winners)), winners] = 1.0
    return rows


def test_greedy_follows_the_matching_branch_and_adds_the_targets_token():
    draft = Draft([2, 3, 4, 5], [ROOT, ROOT, 1, 2])  # root -> 2 | root -> 3 -> 4 -> 5
    # Target argmax after: root=3, node 2 (token 2)=0, node 3 (token 3)=4, node 4 (token 4)=1, node 5=0
    verdict = accept_greedy(draft, one_hot_rows([3, 0, 4, 1, 0]))
    assert verdict.path == [0, 2, 3] and verdict.accepted == [3, 4] and verdict.next_token == 1
    none = accept_greedy(draft, one_hot_rows([1, 0, 0, 0, 0]))
    assert none.path == [0] and none.accepted == [] and none.next_token == 1


def test_a_near_tie_row_decides_nothing():
    draft = Draft([2, 3], [ROOT, 0])
    rows = one_hot_rows([2, 3, 1])
    rows[1, 0] = 0.95  # the row after token 2 is a near-tie between 3 and 0
    assert accept_greedy(draft, rows, margin=0.01).next_token == 1
    verdict = accept_greedy(draft, rows, margin=0.1)
    assert verdict.path == [0, 1] and verdict.accepted == [2] and verdict.next_token is None


def test_residual_removes_what_the_draft_already_offered():
    p = np.array([0.5, 0.3, 0.2, 0, 0, 0])
    np.testing.assert_allclose(residual(p, 0, None), [0, 0.6, 0.4, 0, 0, 0])
    q = np.array([0.2, 0.6, 0.2, 0, 0, 0])
    np.testing.assert_allclose(residual(p, 1, q), [1, 0, 0, 0, 0, 0])


# -- exactness of speculative sampling on a toy model: the next token depends on the previous one only ----------
RNG = np.random.default_rng(0)
TARGET = RNG.normal(0, 1.5, (V, V))  # logits of the next token given the previous one
DRAFT = TARGET + RNG.normal(0, 1.5, (V, V))  # a related but wrong model


Q = np.array([probabilities(DRAFT[t], PARAMS) for t in range(V)])  # the draft's distributions, once
Q_CDF = np.cumsum(Q, axis=1)


def draft_chain(prev, depth, rng):
    tokens, rows = [], []
    for _ in range(depth):
        q = Q[prev]
        prev = min(int(np.searchsorted(Q_CDF[prev], rng.random(), side="right")), V - 1)
        tokens.append(prev)
        rows.append(q)
    return Draft.chain(tokens, rows)


def draft_deterministic_tree(prev):
    """Point-mass drafts: the target's two likeliest tokens and, below the first, the draft's likeliest."""
    first, second = np.argsort(-TARGET[prev])[:2]
    return Draft([int(second), int(first), int(np.argmax(DRAFT[first]))], [ROOT, ROOT, 1])


def always_accept(draft, logits, sampler):
    """A broken rule: keeps the whole first chain, then samples the target."""
    path = [0]
    while (kids := [i + 1 for i, p in enumerate(draft.parents) if p + 1 == path[-1]]):
        path.append(kids[0])
    return Verdict(path, [draft.tokens[i - 1] for i in path[1:]], sampler(logits[path[-1]]))


def sample_pairs(accept, make_draft, n, seed):
    """The first two tokens after token 0, generated speculatively n times."""
    rng = np.random.default_rng(seed)
    sampler = Sampler(PARAMS, rng)  # the drafts and the acceptance draw from one generator
    counts = np.zeros((V, V))
    for _ in range(n):
        out, root = [], 0
        while len(out) < 2:
            draft = make_draft(root, rng)
            seq = [root] + draft.tokens
            logits = TARGET[seq]  # row i: the target after node i (each node's parent is its context here)
            verdict = accept(draft, logits, sampler)
            out += verdict.accepted + [verdict.next_token]
            root = verdict.next_token
        counts[out[0], out[1]] += 1
    return counts


def chi_square_p_value(counts):
    """P-value of the counts under the target's exact distribution of the first two tokens."""
    import torch

    p1 = probabilities(TARGET[0], PARAMS)
    expected = np.array([[p1[a] * probabilities(TARGET[a], PARAMS)[b] for b in range(V)] for a in range(V)])
    expected *= counts.sum()
    cells = expected > 0
    if counts[~cells].sum():  # a token the target can never emit (outside its top-k/top-p)
        return 0.0
    stat = float(((counts[cells] - expected[cells]) ** 2 / expected[cells]).sum())
    dof = int(cells.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64),
                                         torch.tensor(stat / 2, dtype=torch.float64)))


CHAIN = lambda root, rng: draft_chain(root, 3, rng)  # noqa: E731
TREE = lambda root, rng: draft_deterministic_tree(root)  # noqa: E731


@pytest.mark.parametrize("make_draft", [CHAIN, TREE], ids=["draft-model-chain", "point-mass-tree"])
def test_speculative_sampling_matches_the_target_distribution(make_draft):
    assert chi_square_p_value(sample_pairs(accept_sampled, make_draft, 8000, seed=1)) > 1e-3


@pytest.mark.parametrize("make_draft", [CHAIN, TREE], ids=["draft-model-chain", "point-mass-tree"])
def test_a_broken_acceptance_rule_fails_the_same_test(make_draft):
    assert chi_square_p_value(sample_pairs(always_accept, make_draft, 8000, seed=1)) < 1e-6
