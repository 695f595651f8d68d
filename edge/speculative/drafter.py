"""What every drafter proposes: a small tree of guessed continuations, and the one interface they share.

A draft hangs below the *root*, the token the target just produced (not yet in its KV cache). Nodes are listed in
topological order (a parent before its children), so the flattened list can be verified in one target call with a
tree attention mask. A chain is the tree where every node's parent is the node before it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
import numpy as np

from edge.sampling import SamplingParams

ROOT = -1  # parent index of the root's children


@dataclass
class Draft:
    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)  # index into tokens, or ROOT
    # The draft's distribution each node was sampled from (one row per node), for rejection sampling. None: the
    # drafter is deterministic, its proposal is a point mass on the token.
    probs: list[np.ndarray] | None = None
    # What kind of guess this is, when the drafter knows (prompt lookup: "2-3-gram" after a 2- or 3-token match):
    # acceptance is tracked per kind, since a long match is right far more often than a one-token one.
    kind: str = ""

    def __post_init__(self) -> None:
        if len(self.tokens) != len(self.parents):
            raise ValueError(f"{len(self.tokens)} tokens but {len(self.parents)} parents")
        for i, p in enumerate(self.parents):
            if not ROOT <= p < i:
                raise ValueError(f"node {i} has parent {p}: parents must come earlier (topological order)")

    @classmethod
    def chain(cls, tokens, probs: list[np.ndarray] | None = None) -> Draft:
        tokens = [int(t) for t in tokens]
        return cls(tokens, list(range(ROOT, len(tokens) - 1)), probs)

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def is_chain(self) -> bool:
        return self.parents == list(range(ROOT, len(self.tokens) - 1))

    def depths(self) -> list[int]:
        """Depth of each node below the root (the root's children have depth 1)."""
        depth: list[int] = []
        for p in self.parents:
            depth.append(1 if p == ROOT else depth[p] + 1)
        return depth

    def children(self, node: int) -> list[int]:
        return [i for i, p in enumerate(self.parents) if p == node]

    def truncated(self, depth: int) -> Draft:
        """The nodes at most `depth` levels below the root (a node's ancestors are shallower, so all are kept)."""
        keep = [i for i, d in enumerate(self.depths()) if d <= depth]
        if len(keep) == len(self.tokens):
            return self
        index = {old: new for new, old in enumerate(keep)}
        return Draft([self.tokens[i] for i in keep], [ROOT if self.parents[i] == ROOT else index[self.parents[i]]
                                                      for i in keep],
                     None if self.probs is None else [self.probs[i] for i in keep], self.kind)


class Drafter:
    """Guesses what the target will say next. Cheap relative to a target step, or it cannot pay off."""

    name = "drafter"
    # Model-free drafters propose in microseconds: the speculator asks them first and judges the actual draft
    # (its kind, whether there is one at all) before deciding how much of it to verify.
    cheap = False
    # Speed-up over plain decoding measured before use at the best depth (a self-draft's, at export); None: unknown.
    # Below 1 the adaptive policy never drafts with it: even a probe pays the draft's catch-up prefill.
    predicted_speedup: float | None = None
    # How often its first guess is right, measured before use (a trained draft head's held-out accuracy); None:
    # unknown. The adaptive policy starts from it instead of its weak default prior (1 in 3), so a few early misses,
    # which the machine's noise makes costlier still, do not switch off a drafter known to be right half the time.
    known_acceptance: float | None = None
    # The same per kind of draft (prompt lookup's match lengths), where it was measured; kinds not listed start from
    # known_acceptance. A cheap drafter's kind known to pay starts drafting at its first guess instead of waiting
    # for a shadow guess to pass (AdaptiveDepth.known).
    kind_acceptance: dict[str, float] = {}
    # Seconds the last propose() spent reading tokens it had not followed (a draft model's catch-up after steps it
    # did not draft). The policy counts it per drafted step, apart from the cost per draft level; a probe's, which
    # covers the whole time drafting was off, only spaces the next probe.
    catch_up_seconds: float = 0.0
    learns = False  # whether observe() wants the target's logits (token recycling): they are only passed if so
    follows_hidden = False  # whether follow() wants the target's hidden row behind each root (a draft head)
    # Kinds of draft whose acceptance depends on how sure the target was of the root: the speculator tracks each
    # as two kinds, "/sure" and "/unsure" (see edge.speculative.decode.root_is_sure).
    confidence_kinds: tuple[str, ...] = ()

    def propose(self, context: list[int], depth: int) -> Draft:
        """A draft of at most `depth` levels continuing `context` (the prompt, the output so far and the root)."""
        raise NotImplementedError

    def size(self, depth: int) -> int:
        """The most nodes a draft of `depth` levels has: what the target has to verify. Chains: depth."""
        return depth

    def fit(self, cost) -> None:
        """Called once the target's cost curve is known (edge.speculative.adaptive.CostCurve: seconds of a verify
        call by its number of tokens), before any draft is sized: a tree drafter shapes its tree for it."""

    def observe(self, tokens: list[int], logits: Sequence[np.ndarray], produced: list[int] | None = None) -> None:
        """See the target's logits for `tokens` (one row each: an array, or a list of row views for a tree's path)
        after a verify call, and under greedy decoding the token it produced after each (`produced`, the argmax of
        each row; None: not given). Most drafters ignore it."""

    def observes_cheaply(self) -> bool:
        """Whether observe() needs only `produced`, not the logits (then it costs microseconds and is not throttled
        while the drafter is off)."""
        return False

    def follow(self, hidden: np.ndarray | None) -> None:
        """See the target's final hidden row behind the logits the next root comes from (None: none known)."""

    def prepare(self, params: SamplingParams) -> None:
        """Called before a generation with its sampling settings (a draft model samples under the same ones)."""

    def begin(self, context: list[int]) -> None:
        """Called once a prompt is in the target's cache (a draft model reads it here, not inside a timed draft)."""

    def reset(self) -> None:
        """Forget per-conversation state (a draft model's cache)."""
