"""Token recycling: the successor table learns from verify logits and grows a breadth-first draft tree."""

from __future__ import annotations

import numpy as np

from edge.speculative import CostCurve, TokenRecycling
from edge.speculative.drafter import ROOT
from edge.speculative.token_recycling import top_k


def logits_preferring(vocab, order):
    row = np.zeros(vocab, np.float32)
    row[order] = np.linspace(10, 5, len(order))
    return row


def test_observe_stores_the_top_k_in_order_and_newer_evidence_wins():
    tr = TokenRecycling(20, top_k=3, widths=(2, 1))
    tr.observe([4], logits_preferring(20, [7, 1, 9, 3])[None])
    assert tr.successors[4].tolist() == [7, 1, 9]
    tr.observe([4], logits_preferring(20, [2, 7, 1])[None])
    assert tr.successors[4].tolist() == [2, 7, 1]
    assert (tr.successors[5] == -1).all()


def test_breadth_first_tree_follows_the_table_with_level_widths():
    tr = TokenRecycling(20, top_k=3, widths=(2, 2, 1), max_nodes=8)
    rows = np.stack([logits_preferring(20, o) for o in ([7, 1, 9], [3, 4, 5], [6, 2, 8], [11, 12, 13])])
    tr.observe([0, 7, 1, 3], rows)
    draft = tr.propose([5, 0], 3)
    # level 1: 7, 1 (children of the root 0); level 2: 3, 4 under 7 and 6, 2 under 1; level 3: 11 under 3.
    assert draft.tokens == [7, 1, 3, 4, 6, 2, 11]
    assert draft.parents == [ROOT, ROOT, 0, 0, 1, 1, 2]
    assert tr.size(3) == 8 and tr.size(2) == 6 and tr.propose([5, 0], 1).tokens == [7, 1]
    assert tr.propose([5, 19], 3).tokens == []  # nothing known about 19


def test_max_nodes_caps_the_tree():
    tr = TokenRecycling(20, top_k=3, widths=(3, 3), max_nodes=5)
    tr.observe([0, 1, 2, 3], np.stack([logits_preferring(20, [1, 2, 3])] * 4))
    draft = tr.propose([0], 2)
    assert len(draft) == 5 == tr.size(2)


def test_top_k_is_exact_whatever_the_logits_spread():
    rng = np.random.default_rng(0)
    for scale in (0.1, 1.0, 5.0, 50.0):  # many within the window of the maximum, or fewer than k
        for _ in range(20):
            row = (rng.standard_normal(1000) * scale).astype(np.float32)
            expected = np.argsort(-row, kind="stable")[:8]
            assert top_k(row, 8).tolist() == expected.tolist()


def test_fit_makes_a_chain_where_verify_rows_cost_and_keeps_the_tree_where_they_are_nearly_free():
    steep = CostCurve((1, 2, 4, 8, 16), (5.0, 6.1, 7.0, 8.2, 13.5))  # the 2-core CPU's int4 curve, in ms
    flat = CostCurve((1, 2, 4, 8, 16), (3.0, 3.0, 3.02, 3.05, 3.1))  # a GPU's
    cpu, gpu = TokenRecycling(50), TokenRecycling(50)
    cpu.fit(steep)
    gpu.fit(flat)
    assert cpu.widths == (1,) * 8 and cpu.size(3) == 3
    assert gpu.widths == (4, 2, 2, 1, 1, 1, 1, 1) and gpu.size(1) == 4
    cpu.observe([0, 1, 2], np.stack([logits_preferring(50, o) for o in ([1, 5], [2, 6], [3, 7])]))
    draft = cpu.propose([9, 0], 3)
    assert draft.tokens == [1, 2, 3] and draft.is_chain


def test_a_chain_records_the_produced_successor_and_a_tree_the_top_k():
    chain, tree = TokenRecycling(20, top_k=3, widths=(1, 1)), TokenRecycling(20, top_k=3, widths=(2, 1))
    rows = np.stack([logits_preferring(20, [7, 1, 9])] * 2)
    assert chain.observes_cheaply() and not tree.observes_cheaply()
    chain.observe([4, 5], rows, produced=[11, 12])  # greedy's tokens after 4 and 5; the logits are not read
    tree.observe([4, 5], rows, produced=[11, 12])
    assert chain.successors[[4, 5], 0].tolist() == [11, 12]
    assert tree.successors[4].tolist() == [7, 1, 9] and tree.successors[5].tolist() == [7, 1, 9]
    chain.observe([6], rows[:1])  # sampling: no produced tokens, the top k
    assert chain.successors[6].tolist() == [7, 1, 9]
