"""Prompt lookup: the answer often copies the conversation (rewrites, summaries, code edits, repeated answers).

Match the last n tokens (n from `max_ngram` down to 1) at an earlier occurrence anywhere in the context, and propose
what followed it there. Costs microseconds and no model.

Which occurrence: the one nearest to where the answer was copying from, else the most recent. A rewrite copies its
source in order with edits, so after "smooth" became "smoothly" the next "," to copy from is the one a token after
the source's "smooth", not the last "," in the text (the drafter keeps that position, advancing it by one per token
the answer adds, which keeps it aligned across a word replaced by another). Replayed on the speculative benchmark's
outputs with every draft cut to what passes, rewrite went from 2.34x to 2.52x of plain decoding (copying from the
best occurrence at every step: 2.58x); with the adaptive policy from 2.04x to 2.23x, code 1.31x -> 1.36x,
summarise 3.09x -> 3.00x, and on 13 other prompts no change. Measured in one interleaved run: rewrite 1.69x ->
1.75x, code 1.16x -> 1.26x, summarise 2.77x -> 2.85x, repeat 3.02x -> 2.88x (benchmarks/RESULTS.md, session 13).

The draft's kind (which adaptive depth policy judges it) is its match length in bands: a copy that already agrees
with 8 tokens of context keeps agreeing far longer than a 1-token match, so the bands learn their own depths.
Measured offline on the same outputs (max_ngram 3 and kinds by n, to bands up to 8): rewrite 1.87x -> 1.94x,
summarise 2.61x -> 2.87x, repeat 2.86x -> 3.34x. Matches of 1-3 tokens are split again by how sure the target was
of the root (confidence_kinds): after a root the target gave less than 0.8, a 1-gram match's first token passed
3-18% of the time on the benchmark's outputs, after a sure root 33-67%. Replayed with the policies per kind
(benchmarks/speculative_replay.py, session 14): open chat 0.99x -> 1.00x, code 1.26x -> 1.32x, rewrite 2.04x ->
2.09x, summarise 2.66x -> 2.91x, repeat 2.53x -> 2.54x of plain decoding; on 14 other prompts (other passages,
tasks and questions, 96 tokens) 1.72x -> 1.78x over the five categories, none lower.
"""

from __future__ import annotations

import string
from array import array
from collections.abc import Sequence

from edge.speculative.drafter import Draft, Drafter


BANDS = ((1, "1-gram"), (3, "2-3-gram"), (7, "4-7-gram"))  # longer: "8+-gram"
NEAR = 4  # how far (tokens) from the copy position an occurrence counts as the copy going on
STALE = 16  # tokens without any match after which the copy position is forgotten


_LOWER = str.maketrans(string.ascii_uppercase, string.ascii_lowercase)


def case_classes(vocab: dict[str, int]) -> Sequence[int]:
    """Token id -> one id shared by all the tokens spelt the same up to ASCII letter case (" The" and " the").

    Rewrites and summaries copy words whose case changed ("the move went" -> "The move went"): matching through
    these classes lets the copy go on there. Replayed (benchmarks/speculative_replay.py, session 35) on the
    benchmark's outputs: rewrite 2.52x -> 2.57x of plain decoding, the others within 1%; on the held-out prompts
    open chat 1.17x -> 1.19x, rewrite 1.72x -> 1.74x, summarise 1.54x -> 1.59x, code and repeat unchanged. ASCII
    only: byte-level vocabularies spell non-ASCII bytes with letters such as "Ã", whose lower case is another byte.
    4 bytes a token (Gemma 3's 262,144: 1 MB, built in ~0.5 s).
    """
    fold = array("i", range(max(vocab.values(), default=-1) + 1))
    classes: dict[str, int] = {}
    for token, i in vocab.items():
        fold[i] = classes.setdefault(token.translate(_LOWER), i)
    return fold


def kind(n: int) -> str:
    """The policy key of a draft copied after an n-token match."""
    return next((name for top, name in BANDS if n <= top), "8+-gram")


class PromptLookup(Drafter):
    name = "prompt-lookup"
    cheap = True
    confidence_kinds = ("1-gram", "2-3-gram")
    # How often each kind's first token passes, measured at every position of the default model's greedy answers to
    # benchmarks/speculative_replay.py's held-out prompts (`--prompts held-out --kinds`; the benchmark's own prompts
    # gave 0.54, 0.15, 0.76, 0.38, 0.88, 0.91). Without it every kind started from the policy's 1-in-3 guess and
    # off, so a copy's first long match waited a verify call for a shadow guess and then drafted 1-3 tokens where 8
    # pass: replayed with policies new to each prompt (one `edge-run` call), rewrite 1.82x -> 2.19x, summarise
    # 1.95x -> 2.27x, repeat 2.08x -> 2.47x, open chat 1.02x -> 1.04x, code unchanged (held-out prompts: +4-14%).
    # Timed against lookup+head without it in one run (`benchmarks/speculative.py --fresh --ablations`, session 40):
    # summarise 1.83x -> 2.12x, repeat 1.99x -> 2.15x, rewrite 1.72x -> 1.79x, code 1.35x -> 1.37x, open chat
    # 1.17x -> 1.13x; with policies that persist across prompts (the benchmark's default, a chat app's) within noise.
    kind_acceptance = {"1-gram/sure": 0.48, "1-gram/unsure": 0.11, "2-3-gram/sure": 0.84, "2-3-gram/unsure": 0.36,
                       "4-7-gram": 0.79, "8+-gram": 0.94}

    def __init__(self, max_ngram: int = 8, min_ngram: int = 1, fold: Sequence[int] | None = None):
        """fold: token id -> the class it matches as (case_classes); None: tokens match only themselves."""
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        self.max_ngram, self.min_ngram, self.fold = max_ngram, min_ngram, fold
        self.reset()

    def reset(self) -> None:
        self.source: int | None = None  # context index the next token is expected to copy
        self.seen = 0  # context length at the last propose()
        self.unmatched = 0  # tokens since the last match
        self.tokens: list[int] = []  # the context indexed so far
        self.keys: list[int] = []  # its tokens as they match (through `fold`)
        self.where: dict[int, list[int]] = {}  # key -> its positions in `tokens`, in order

    def begin(self, context: list[int]) -> None:
        self.reset()

    def _follow_answer(self, length: int) -> None:
        """Move the copy position along with the tokens added since the last call: one source token per token,
        copied or replaced alike."""
        added = length - self.seen
        if added < 0 or self.source is None:  # another conversation, or nothing being copied
            self.source = None
        else:
            self.source += added
        self.seen = length

    def _index(self, context: list[int]) -> None:
        """Bring the token -> positions index up to `context`: within a generation each call's context extends the
        last one's, so only the tokens added since are indexed; anything else is indexed afresh."""
        n = len(self.tokens)
        if len(context) < n or context[:n] != self.tokens:
            self.tokens, self.keys, self.where, n = [], [], {}, 0
        fold, size = self.fold, len(self.fold or ())
        added = context[n:] if fold is None else [fold[t] if t < size else t for t in context[n:]]
        for i, key in enumerate(added, n):
            self.where.setdefault(key, []).append(i)
        self.tokens.extend(context[n:])
        self.keys.extend(added)

    def _match(self, ids: list[int]) -> tuple[list[int] | None, int]:
        """Ends of the earlier occurrences of the longest matching suffix (n tokens) of `ids`, the context's keys.

        Runs every step, after a target step has left the caches cold, so it must cost microseconds: the earlier
        occurrences of the last token come from the index, then those whose preceding tokens match too are kept,
        one n at a time, in Python (numpy on the whole context cost ~90 us a step, most of it per-call overhead:
        session 19). Ends lie in 0..len-2: each is followed by >= 1 token."""
        ends = self.where[ids[-1]][:-1]  # the last key's own position is the last entry
        found, n = (ends, 1) if ends else (None, 0)
        for m in range(2, min(self.max_ngram, len(ids) - 1) + 1):
            ends = [e for e in ends if e >= m - 1 and ids[e - (m - 1)] == ids[-m]]
            if not ends:
                break
            found, n = ends, m
        return found, n

    def _start(self, ends: list[int]) -> int:
        """Where to copy from: the occurrence nearest the copy position if one is near, else the most recent."""
        if self.source is not None:
            distance = [abs(e + 1 - self.source) for e in ends]
            nearest = min(distance)
            if nearest <= NEAR:
                return ends[distance.index(nearest)] + 1
        return ends[-1] + 1

    def propose(self, context: list[int], depth: int) -> Draft:
        self._follow_answer(len(context))
        if depth <= 0 or len(context) < 2:
            return Draft()
        self._index(context)
        ids = self.tokens
        found, n = self._match(self.keys)
        if found is None or n < self.min_ngram:
            self.unmatched += 1
            if self.unmatched > STALE:
                self.source = None
            return Draft()
        start = self._start(found)
        self.source, self.unmatched = start, 0
        draft = Draft.chain(ids[start:start + depth])
        draft.kind = kind(n)
        return draft
