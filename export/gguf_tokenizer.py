"""Rebuild a `tokenizers` JSON document from the vocabulary a GGUF file embeds.

A GGUF carries the raw pieces of a tokenizer (tokens, token types, merges or scores, the name of the pre-tokenizer)
but not the tokenizer.json the model was trained with. This module reassembles an equivalent one so that edge
tokenizes exactly like the original model (and like llama.cpp and transformers' GGUF loader):

- `gpt2` vocabularies are byte-level BPE; the merges are stored; the text split rule is named by
  `tokenizer.ggml.pre` and has to be looked up here, because the file does not store the regex.
- `llama` vocabularies are SentencePiece BPE with byte fallback; the file stores scores instead of merges, so merges
  are derived from the vocabulary (for Gemma the file order, not the scores, gives the merge priority).

Control tokens become special added tokens (matched whole, skipped when decoding); user-defined tokens become plain
added tokens (matched whole, kept when decoding). BOS is not added by the document: edge's Tokenizer adds it when
the model's manifest asks for it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

from edge.errors import ModelFormatError

# llama.cpp token types (gguf.TokenType)
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _byte_level_split(regex: str) -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(regex), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )


def _gpt2_pre() -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)


def _smollm_pre() -> pre_tokenizers.PreTokenizer:
    # SmolLM/SmolLM2's own tokenizer.json: every digit on its own, then GPT-2's byte-level split.
    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )


# tokenizer.ggml.pre -> builder of the pre-tokenizer the vocabulary was trained with.
PRE_TOKENIZERS = {
    "default": _gpt2_pre,
    "gpt-2": _gpt2_pre,
    "gpt2": _gpt2_pre,
    "smollm": _smollm_pre,
    "llama3": lambda: _byte_level_split(_LLAMA3_SPLIT),
    "llama-v3": lambda: _byte_level_split(_LLAMA3_SPLIT),
    "llama-bpe": lambda: _byte_level_split(_LLAMA3_SPLIT),
    "smaug-bpe": lambda: _byte_level_split(_LLAMA3_SPLIT),
    "qwen2": lambda: _byte_level_split(_QWEN2_SPLIT),
    "deepseek-r1-qwen": lambda: _byte_level_split(_QWEN2_SPLIT),
}
# Vocabularies whose original tokenizer.json applies NFC before splitting.
_NFC_PRE = {"qwen2", "deepseek-r1-qwen"}


@dataclass
class GGUFVocab:
    """The tokenizer fields of a GGUF file, as plain Python values."""

    model: str  # tokenizer.ggml.model: "gpt2" or "llama"
    tokens: list[str]
    token_types: list[int] = field(default_factory=list)
    merges: list[str] | None = None
    scores: list[float] | None = None
    pre: str | None = None  # tokenizer.ggml.pre
    add_space_prefix: bool | None = None
    unk_token_id: int | None = None
    architecture: str = "llama"


def build_tokenizer_json(vocab: GGUFVocab, source: str = "the GGUF file") -> str:
    """A tokenizers JSON document equivalent to the GGUF vocabulary (raises ModelFormatError if unsupported)."""
    if vocab.model == "gpt2":
        tok = _byte_level_bpe(vocab, source)
    elif vocab.model == "llama":
        tok = _sentencepiece_bpe(vocab)
    else:
        raise ModelFormatError(
            f"{source}: tokenizer model {vocab.model!r} is not supported; edge reads 'gpt2' (byte-level BPE) and "
            "'llama' (SentencePiece BPE) vocabularies"
        )
    _add_marked_tokens(tok, vocab)
    return tok.to_str()


def _byte_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character table."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def _byte_level_bpe(vocab: GGUFVocab, source: str) -> Tokenizer:
    pre = vocab.pre or "default"
    if pre not in PRE_TOKENIZERS:
        raise ModelFormatError(
            f"{source}: pre-tokenizer {pre!r} is not known to edge, so its text could not be split like the original "
            f"model's; known ones: {sorted(PRE_TOKENIZERS)}"
        )
    if vocab.merges is None:
        raise ModelFormatError(f"{source}: a 'gpt2' vocabulary without tokenizer.ggml.merges cannot be rebuilt")
    spelling = _byte_to_unicode()
    alphabet = set(spelling.values())
    # Every real token is spelled in the byte alphabet; respell the rare one that is not (so it stays reachable).
    ids = {
        (t if set(t) <= alphabet else "".join(spelling[b] for b in t.encode("utf-8"))): i
        for i, t in enumerate(vocab.tokens)
    }
    merges = [tuple(m.split(" ", 1)) for m in vocab.merges]
    tok = Tokenizer(models.BPE(vocab=ids, merges=merges, fuse_unk=False, byte_fallback=False))
    if pre in _NFC_PRE:
        tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = PRE_TOKENIZERS[pre]()
    tok.decoder = decoders.ByteLevel()
    return tok


def _sentencepiece_bpe(vocab: GGUFVocab) -> Tokenizer:
    gemma = vocab.architecture.startswith("gemma")
    tokens = list(vocab.tokens)
    if gemma:
        # Gemma files store tokens made only of spaces with real spaces; the model looks them up as "▁▁...".
        tokens = ["\u2581" * len(t) if t and not t.strip(" ") else t for t in tokens]
    ids: dict[str, int] = {}
    for i, t in enumerate(tokens):
        ids.setdefault(t, i)
    if gemma or not vocab.scores:
        priority = {t: -i for t, i in ids.items()}  # earlier in the file merges first
    else:
        priority = {t: vocab.scores[i] for t, i in ids.items()}
    unk = tokens[vocab.unk_token_id] if vocab.unk_token_id is not None else None
    bpe = models.BPE(vocab=ids, merges=_derive_merges(ids, priority), unk_token=unk, fuse_unk=True, byte_fallback=True)
    tok = Tokenizer(bpe)
    add_prefix = vocab.add_space_prefix if vocab.add_space_prefix is not None else not gemma
    if add_prefix:
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first", split=False)
        tok.decoder = decoders.Sequence(
            [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
        )
    else:
        tok.normalizer = normalizers.Replace(" ", "\u2581")
        tok.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_previous")
        tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])
    return tok


def _derive_merges(ids: dict[str, int], priority: dict[str, float]) -> list[tuple[str, str]]:
    """SentencePiece BPE merges a pair when the joined piece is in the vocabulary, best-scored piece first."""
    ranked: list[tuple[float, int, str, str]] = []
    for piece, score in priority.items():
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in ids and right in ids:
                ranked.append((-score, -cut, left, right))  # longer left part first among splits of one piece
    ranked.sort(key=lambda r: (r[0], r[1]))
    return [(left, right) for _, _, left, right in ranked]


def _add_marked_tokens(tok: Tokenizer, vocab: GGUFVocab) -> None:
    """Control tokens -> special added tokens; user-defined tokens -> plain added tokens (both matched whole)."""
    if not vocab.token_types:
        return
    byte_level = vocab.model == "gpt2"
    alphabet = set(_byte_to_unicode().values()) if byte_level else None
    known = tok.get_vocab()
    control, user = [], []
    for token, kind in zip(vocab.tokens, vocab.token_types):
        if kind == CONTROL and (alphabet is None or set(token) <= alphabet):
            control.append(AddedToken(token, normalized=False, special=True))
        elif kind == USER_DEFINED and token in known:
            user.append(AddedToken(token, normalized=False, special=False))
    if control:
        tok.add_special_tokens(control)
    if user:
        tok.add_tokens(user)
