"""Prompt lookup: the longest recent n-gram match decides what is copied."""

from __future__ import annotations

import numpy as np
import pytest

from edge.speculative import PromptLookup
from edge.speculative.prompt_lookup import STALE, case_classes, kind


def test_copies_what_followed_the_most_recent_match_of_the_longest_ngram():
    pl = PromptLookup(max_ngram=3)
    # "1 2 3" occurs twice before the suffix; the most recent one (followed by 7 8) wins over "9 9".
    context = [1, 2, 3, 9, 9, 5, 1, 2, 3, 7, 8, 6, 0, 1, 2, 3]
    draft = pl.propose(context, 4)
    assert draft.tokens == [7, 8, 6, 0] and draft.is_chain


def test_falls_back_to_shorter_ngrams_and_respects_depth():
    pl = PromptLookup(max_ngram=3)
    assert PromptLookup().propose([4, 5, 6, 1, 2, 8, 8, 2], 2).tokens == [8, 8]  # only the unigram "2" matches
    assert pl.propose([1, 2, 3, 4, 5, 3], 10).tokens == [4, 5, 3]  # stops at the end of the context
    assert pl.propose([1, 2, 3, 4], 3).tokens == []  # nothing repeats
    assert pl.propose([1, 2, 1], 0).tokens == []


def test_min_ngram_excludes_weak_matches():
    assert PromptLookup(max_ngram=3, min_ngram=2).propose([4, 5, 6, 1, 2, 8, 8, 2], 2).tokens == []
    with pytest.raises(ValueError):
        PromptLookup(max_ngram=1, min_ngram=2)


def test_case_classes_join_ascii_case_only():
    vocab = {"Ġthe": 5, "ĠThe": 9, "ĠTHE": 2, "Ã": 3, "ã": 4, "x": 0, "<|im_end|>": 7}
    fold = case_classes(vocab)
    assert fold[9] == fold[5] == fold[2]
    assert len({fold[i] for i in (5, 3, 4, 0, 7)}) == 5  # byte-level letters for non-ASCII bytes stay apart
    assert fold[1] == 1 and fold[6] == 6 and len(fold) == 10  # ids the vocabulary skips map to themselves


def test_a_copy_goes_on_across_a_change_of_case():
    """The answer capitalises a copied word ("the move went" -> "The move"): with the classes the copy goes on at
    the longer match; the draft is the context's own tokens after it."""
    the, The, move, went, mostly = 5, 9, 11, 12, 13
    fold = case_classes({"Ġthe": the, "ĠThe": The, "Ġmove": move, "Ġwent": went, "Ġmostly": mostly})
    context = [1, the, move, went, mostly, 2, 3, The, move]
    assert PromptLookup(fold=fold).propose(context, 2).tokens == [went, mostly]
    assert PromptLookup(fold=fold).propose(context, 2).kind == "2-3-gram"
    assert PromptLookup().propose(context, 2).kind == "1-gram"
    assert PromptLookup(fold=fold).propose(context + [20], 2).tokens == []  # an id past the table: itself only


def reference_lookup(context, depth, max_ngram):
    """The rule spelled out: longest n-gram first, its most recent earlier occurrence, copy what followed."""
    for n in range(min(max_ngram, len(context) - 1), 0, -1):
        for end in range(len(context) - 2, n - 2, -1):
            if context[end - n + 1:end + 1] == context[-n:]:
                return context[end + 1:end + 1 + depth], kind(n)
    return [], ""


def test_matches_the_rule_spelled_out_on_random_contexts():
    rng = np.random.default_rng(0)
    for trial in range(300):
        context = rng.integers(0, 6, rng.integers(2, 40)).tolist()  # a small vocabulary: many partial matches
        max_ngram = int(rng.integers(1, 11))
        draft = PromptLookup(max_ngram=max_ngram).propose(context, 5)
        assert (draft.tokens, draft.kind) == reference_lookup(context, 5, max_ngram), context


def test_kinds_are_bands_of_match_length():
    assert [kind(n) for n in (1, 2, 3, 4, 7, 8, 12)] == ["1-gram", "2-3-gram", "2-3-gram", "4-7-gram", "4-7-gram",
                                                         "8+-gram", "8+-gram"]
    context = [9, 1, 2, 3, 4, 5, 6, 7, 8, 40, 41, 0, 1, 2, 3, 4, 5, 6, 7, 8]
    draft = PromptLookup().propose(context, 2)  # an 8-token match: the policy for long copies judges it
    assert (draft.tokens, draft.kind) == ([40, 41], "8+-gram")


def test_copies_on_from_where_an_edited_copy_left_off():
    # The source "1 2 3 5 6 7 8 5 9" has two 5s. The answer copies "1 2", replaces 3 by 30, then says 5: the copy
    # goes on after the source's first 5 (6 7 8), not after the most recent 5 (9).
    prompt = [1, 2, 3, 5, 6, 7, 8, 5, 9, 0]
    pl = PromptLookup()
    assert pl.propose(prompt + [1], 3).tokens == [2, 3, 5]
    assert pl.propose(prompt + [1, 2, 30], 3).tokens == []  # nothing matches "30"; the position moves on
    assert pl.propose(prompt + [1, 2, 30, 5], 3).tokens == [6, 7, 8]
    assert PromptLookup().propose(prompt + [1, 2, 30, 5], 3).tokens == [9, 0, 1]  # no copy position: most recent


def test_copy_position_is_forgotten_with_the_conversation_or_after_long_unmatched_runs():
    prompt = [1, 2, 3, 5, 6, 7, 8, 5, 9, 0]
    pl = PromptLookup()
    pl.propose(prompt + [1], 3)
    pl.begin(prompt)  # a new generation: no copy position
    assert pl.propose(prompt + [1, 2, 30, 5], 3).tokens == [9, 0, 1]
    pl.propose(prompt + [1], 3)
    answer = [1]
    for t in range(100, 100 + STALE + 1):  # tokens that match nothing, each proposed after
        answer.append(t)
        assert pl.propose(prompt + answer, 3).tokens == []
    assert pl.source is None
