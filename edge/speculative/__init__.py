"""Speculative decoding: cheap drafters guess several tokens, the target verifies them in one call.

    from edge.speculative import PromptLookup, Speculator
    engine = Engine(package, speculator=Speculator([PromptLookup()]))

`make_speculator("auto" | "prompt-lookup" | "recycling" | "head" | "lookup+head" | "skip" | "lookup+skip" | PATH,
engine)` builds the usual combinations ("head": the package's trained draft head, edge.speculative.draft_head; "skip": its
skip-layer self-draft, edge.speculative.layer_skip).
"""

from edge.speculative.adaptive import AdaptiveDepth, CostCurve, FixedDepth, Pace
from edge.speculative.decode import Speculator
from edge.speculative.draft_head import DraftHead
from edge.speculative.draft_model import DraftModel, check_compatible
from edge.speculative.drafter import Draft, Drafter
from edge.speculative.factory import make_speculator
from edge.speculative.layer_skip import LayerSkipDraft
from edge.speculative.prompt_lookup import PromptLookup
from edge.speculative.stats import SpeculativeStats
from edge.speculative.token_recycling import TokenRecycling

__all__ = ["AdaptiveDepth", "CostCurve", "Draft", "DraftHead", "DraftModel", "Drafter", "FixedDepth", "LayerSkipDraft",
           "Pace", "PromptLookup", "SpeculativeStats", "Speculator", "TokenRecycling", "check_compatible",
           "make_speculator"]
