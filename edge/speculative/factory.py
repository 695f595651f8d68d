"""Named drafter combinations for the CLI and the API: model-free first, a draft model where one is given."""

from __future__ import annotations

import os

from edge.errors import EdgeError
from edge.package import load_package
from edge.speculative.decode import Speculator
from edge.speculative.draft_head import DraftHead
from edge.speculative.draft_model import DraftModel, check_compatible
from edge.speculative.layer_skip import LayerSkipDraft
from edge.speculative.prompt_lookup import PromptLookup
from edge.speculative.token_recycling import TokenRecycling

NAMES = ("prompt-lookup", "recycling", "head", "lookup+head", "auto", "skip", "lookup+skip")


def verify_rows(spec) -> int:
    """Tokens one verify step of a model-free drafter scores (root included), for the memory plan; 0 for drafters
    with a model of their own, which the planner sizes itself."""
    if spec in ("prompt-lookup", "head", "lookup+head"):  # chains of at most the speculator's depth
        return 1 + Speculator([PromptLookup()]).max_depth
    if spec in ("recycling", "auto"):
        return 1 + TokenRecycling(1).max_nodes
    return 0


def make_speculator(spec: str, engine, draft_length: int | None = None) -> Speculator:
    """`spec`: prompt-lookup, recycling, head (the package's trained draft head), lookup+head (prompt lookup, else
    the head), auto (lookup+head where the package has a head, else prompt lookup, else recycling), skip (the
    package's skip-layer self-draft), lookup+skip (prompt lookup, else the self-draft), or a draft package's path
    (prompt lookup, else the draft model).

    auto takes the head where there is one: measured on the default model (benchmarks/RESULTS.md) it matches
    lookup+recycling where the answer copies the prompt and beats it on open chat and code (1.28x / 1.33x against
    1.06x / 1.12x), where recycling rarely guesses right."""
    package = engine.package
    vocab = package.config.vocab_size
    threads = engine.threads
    if spec == "auto" and package.draft_head is not None:
        spec = "lookup+head"
    if spec in ("recycling", "auto") and not package.tree_attention:
        raise EdgeError(f"{package.root} was exported without tree attention, which token recycling needs; "
                        f"re-export it or use --draft prompt-lookup")
    if spec == "prompt-lookup":
        drafters = [PromptLookup()]
    elif spec == "recycling":
        drafters = [TokenRecycling(vocab)]
    elif spec in ("head", "lookup+head"):
        head = DraftHead(package, device=engine.decoder.device)
        drafters = [head] if spec == "head" else [PromptLookup(), head]
    elif spec == "auto":
        drafters = [PromptLookup(), TokenRecycling(vocab)]
    elif spec in ("skip", "lookup+skip"):
        skip = LayerSkipDraft(package, engine.context_length, threads=threads)
        drafters = [skip] if spec == "skip" else [PromptLookup(), skip]
    elif os.path.exists(spec):
        from edge.cached_export import resolve

        draft = load_package(resolve(spec, engine.decoder.device))  # a GGUF or HF folder: exported once
        check_compatible(package, draft)
        drafters = [PromptLookup(), DraftModel(draft, engine.context_length, threads=threads)]
    else:
        raise EdgeError(f"unknown drafter {spec!r}: use one of {', '.join(NAMES)} or a draft package's folder")
    return Speculator(drafters, draft_length=draft_length, threads=threads)
