"""The Draft structure every drafter returns: validation, depths, truncation to fewer levels."""

from __future__ import annotations

import numpy as np
import pytest

from edge.speculative.drafter import ROOT, Draft
from edge.speculative.prompt_lookup import PromptLookup


def test_truncating_a_tree_keeps_each_kept_nodes_ancestry():
    # root -> 10 -> 11 -> 12 ; root -> 20 -> 21 ; 10 -> 13
    draft = Draft([10, 20, 11, 21, 13, 12], [ROOT, ROOT, 0, 1, 0, 2], [np.full(3, i) for i in range(6)], "tree")
    cut = draft.truncated(2)
    assert cut.tokens == [10, 20, 11, 21, 13] and cut.parents == [ROOT, ROOT, 0, 1, 0]
    assert [int(p[0]) for p in cut.probs] == [0, 1, 2, 3, 4] and cut.kind == "tree"
    one = draft.truncated(1)
    assert one.tokens == [10, 20] and one.parents == [ROOT, ROOT]
    assert draft.truncated(3) is draft


def test_invalid_parents_are_refused():
    with pytest.raises(ValueError, match="topological"):
        Draft([1, 2], [ROOT, 1])


def test_prompt_lookup_says_how_long_its_match_was():
    lookup = PromptLookup(max_ngram=3)
    assert lookup.propose([5, 6, 7, 8, 9, 1, 5, 6, 7], 3).kind == "2-3-gram"
    draft = lookup.propose([5, 6, 7, 8, 9, 1, 2, 7], 2)
    assert draft.tokens == [8, 9] and draft.kind == "1-gram"
