"""Text <-> token ids for a packaged model, on top of Hugging Face `tokenizers` (fast, Rust, no torch).

BOS handling lives here rather than in the tokenizer.json: the model's manifest says whether a prompt starts with
BOS, and imported tokenizer documents differ in whether their post-processor adds it. Streaming decode emits text
only once the bytes of a character are complete, so a multi-byte character split across tokens never shows up as
replacement characters.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

from tokenizers import Tokenizer as _HFTokenizer
from tokenizers.decoders import DecodeStream

from edge.errors import PackageError
from edge.memory.usage import release_free_heap


class Tokenizer:
    """A model's tokenizer plus the special-token facts from its manifest."""

    def __init__(
        self,
        tokenizer_json: str | Path,
        *,
        bos_token_id: int | None = None,
        eos_token_ids: Sequence[int] = (),
        pad_token_id: int | None = None,
        add_bos: bool = False,
    ):
        self._tok = _load(tokenizer_json)
        release_free_heap()  # the JSON parse's freed garbage: ~190 MB of RSS for Gemma 3's vocabulary otherwise
        self.bos_token_id = bos_token_id
        self.eos_token_ids = list(eos_token_ids)
        self.pad_token_id = pad_token_id
        self.add_bos = add_bos

    @classmethod
    def from_special_tokens(cls, tokenizer_json: str | Path, special) -> "Tokenizer":
        """Build from an edge.export.source.SpecialTokens (or anything with the same attributes)."""
        return cls(
            tokenizer_json,
            bos_token_id=special.bos_token_id,
            eos_token_ids=special.eos_token_ids,
            pad_token_id=special.pad_token_id,
            add_bos=special.add_bos,
        )

    @property
    def vocab_size(self) -> int:
        """Number of ids the tokenizer can produce, added tokens included."""
        return self._tok.get_vocab_size(with_added_tokens=True)

    def vocab(self) -> dict[str, int]:
        """Every token's string (as the model spells it, e.g. "Ġthe") and id, added tokens included."""
        return self._tok.get_vocab(with_added_tokens=True)

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        return self._tok.id_to_token(token_id)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of `text`; with add_special_tokens, BOS is prepended if the model wants it (never twice).

        Special tokens written in the text (e.g. `<|im_start|>` from a chat template) encode as their single id.
        """
        ids = self._tok.encode(text, add_special_tokens=False).ids
        if add_special_tokens and self.add_bos and self.bos_token_id is not None:
            if not ids or ids[0] != self.bos_token_id:
                ids.insert(0, self.bos_token_id)
        return ids

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def is_eos(self, token_id: int) -> bool:
        return token_id in self.eos_token_ids

    def stream_decoder(self, skip_special_tokens: bool = True) -> "StreamDecoder":
        """A decoder that turns generated ids into text pieces as soon as they are complete characters."""
        return StreamDecoder(self._tok, skip_special_tokens)


class StreamDecoder:
    """Incremental, UTF-8-safe detokenization for one generated sequence."""

    def __init__(self, tokenizer: _HFTokenizer, skip_special_tokens: bool = True):
        self._tok = tokenizer
        self._stream = DecodeStream(skip_special_tokens=skip_special_tokens)

    def step(self, token_id: int) -> str:
        """Text that token completes ('' while a character is still partial)."""
        return self._stream.step(self._tok, token_id) or ""

    def feed(self, ids: Iterable[int]) -> str:
        return "".join(self.step(i) for i in ids)


def _load(tokenizer_json: str | Path) -> _HFTokenizer:
    """A path to tokenizer.json, or the JSON document itself."""
    try:
        if isinstance(tokenizer_json, Path) or not tokenizer_json.lstrip().startswith("{"):
            path = Path(tokenizer_json)
            if not path.is_file():
                raise PackageError(f"tokenizer file {path} does not exist")
            return _HFTokenizer.from_file(str(path))
        return _HFTokenizer.from_str(tokenizer_json)
    except PackageError:
        raise
    except Exception as exc:
        raise PackageError(f"the tokenizer could not be loaded ({exc}); re-export the model") from exc
