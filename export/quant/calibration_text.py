"""Calibration and evaluation text: English prose that ships with Python itself, split so the two never overlap.

The source is CPython's `pydoc_data.topics` (the language reference as plain text, ~465k characters in 3.11), present
in every standard CPython install and fixed per Python version, so no download and no hub. Topics are split by a
fixed rule (every third topic, in sorted order, is evaluation), and any paragraph of the calibration part that also
occurs in the evaluation part is dropped, so not one paragraph is shared. The metadata (Python version, topics, sha256
of each text) goes into the package manifest so a result can be tied to the exact text.
"""

from __future__ import annotations

import hashlib
import platform
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from edge.export.quant import QuantizationError

SPLITS = ("calibration", "evaluation")


def _topics() -> dict[str, str]:
    try:
        from pydoc_data.topics import topics
    except ImportError as exc:  # stripped-down Python builds drop pydoc_data
        raise QuantizationError(
            "this Python has no pydoc_data module, the source of the calibration text; use a full CPython install"
        ) from exc
    return topics


def _paragraphs(text: str) -> list[str]:
    return [p.strip() for p in text.split("\n\n") if p.strip()]


def split_topics() -> dict[str, list[str]]:
    names = sorted(_topics())
    return {"evaluation": names[0::3], "calibration": [n for i, n in enumerate(names) if i % 3]}


def corpus(split: str) -> tuple[str, dict[str, Any]]:
    """The whole text of one split and what it is made of."""
    if split not in SPLITS:
        raise QuantizationError(f"unknown text split {split!r}; choose one of {SPLITS}")
    topics = _topics()
    names = split_topics()
    evaluation = [p for n in names["evaluation"] for p in _paragraphs(topics[n])]
    if split == "evaluation":
        paragraphs = evaluation
    else:
        seen = set(evaluation)
        paragraphs = [p for n in names["calibration"] for p in _paragraphs(topics[n]) if p not in seen]
    text = "\n\n".join(paragraphs)
    meta = {
        "source": f"CPython {platform.python_version()} pydoc_data.topics",
        "split": split,
        "topics": len(names[split]),
        "characters": len(text),
        "sha256": hashlib.sha256(text.encode("utf-8")).hexdigest(),
    }
    return text, meta


def token_sequences(
    encode: Callable[[str], Sequence[int]], split: str = "calibration", num_sequences: int = 32, seq_len: int = 512
) -> tuple[np.ndarray, dict[str, Any]]:
    """(num_sequences, seq_len) int64 windows of the tokenized split, spread evenly over the text, never overlapping.

    `encode` is a Tokenizer-like callable (text -> ids); pass one that adds no special tokens.
    """
    if num_sequences < 1 or seq_len < 2:
        raise QuantizationError(f"need at least one sequence of 2+ tokens, got {num_sequences} x {seq_len}")
    text, meta = corpus(split)
    ids = np.asarray(encode(text), dtype=np.int64)
    available = len(ids) // seq_len
    if available < num_sequences:
        raise QuantizationError(
            f"the {split} text has {len(ids)} tokens, enough for {available} sequences of {seq_len}, "
            f"not {num_sequences}; ask for fewer or shorter sequences"
        )
    starts = (np.arange(num_sequences) * available // num_sequences) * seq_len
    windows = np.stack([ids[s : s + seq_len] for s in starts])
    meta.update({"tokens": int(len(ids)), "num_sequences": num_sequences, "seq_len": seq_len,
                 "window_starts": starts.tolist()})
    return windows, meta
