"""The skip-layer self-draft: the target's own graph over a subset of its layers (export/self_draft.py chose them by
measurement), run as a draft model with its own small KV cache and rollback (DraftModel).

It needs no second model and no second copy of the weights: draft_skip.onnx reads the target's model.onnx.data.
"""

from __future__ import annotations

import warnings

from edge.package import Package
from edge.sampling import SamplingParams
from edge.speculative.draft_model import DraftModel


class LayerSkipDraft(DraftModel):
    name = "layer-skip"

    def __init__(self, target: Package, context_length: int, threads: int | None = None,
                 params: SamplingParams | None = None, min_confidence: float = 0.0, seed: int | None = None):
        """Raises PackageError (with how to add one) when the target package has no self-draft."""
        super().__init__(target.skip_draft(), context_length, threads, params, min_confidence, seed)
        self.layers = list(target.self_draft["layers"])
        self.predicted_speedup = target.self_draft.get("chosen", {}).get("predicted_speedup")
        if self.predicted_speedup is not None and self.predicted_speedup < 1:
            warnings.warn(f"{target.root}'s skip-layer self-draft was measured at export to be slower than plain "
                          f"decoding (x{self.predicted_speedup:.2f} at its best depth): it stays off unless a "
                          f"fixed draft length is asked for", stacklevel=2)

    def begin(self, context: list[int]) -> None:
        """Read the prompt lazily, at the first proposal: a skip draft costs most of a target step per token, so the
        adaptive policy often keeps it off, and then an eager prefill of every prompt would be pure loss (measured:
        x0.84-0.88 on open chat with the policy drafting 2-3 times in 48 tokens, most of it the draft's prefill)."""
