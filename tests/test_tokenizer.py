"""edge.tokenizer against transformers' tokenizer of the same GGUF, and streaming decode of split characters."""

from __future__ import annotations

import pytest

from edge.errors import PackageError
from edge.tokenizer import Tokenizer

TEXTS = [
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "def add(a, b):\n    return a + b\n\nprint(add(2, 3))",
    "Numbers: 12345 and 3.14159, year 2024, 1,000,000.",
    "   leading spaces and\t\ttabs   and trailing   ",
    "lines\n\n\nmany\r\nbreaks",
    "Unicode: café, naïve, Ωmega, Привет мир",
    "Emoji: 😀👍🏽🚀 and family 👨‍👩‍👧",
    "CJK: 你好，世界。日本語のテキスト。한국어",
    "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
    "it's they're I'll we've",
    "",
]


@pytest.fixture(scope="module")
def tok(smollm2) -> Tokenizer:
    return Tokenizer.from_special_tokens(smollm2.tokenizer_json, smollm2.special_tokens)


@pytest.mark.parametrize("text", TEXTS)
def test_encode_decode_match_transformers(tok, hf_gguf_tokenizer, text):
    expected = hf_gguf_tokenizer.encode(text, add_special_tokens=False)
    assert tok.encode(text) == expected
    assert tok.decode(expected) == hf_gguf_tokenizer.decode(expected, skip_special_tokens=True)
    assert tok.decode(expected, skip_special_tokens=False) == hf_gguf_tokenizer.decode(expected)


def test_special_tokens_are_single_ids(tok):
    assert tok.encode("<|im_start|>") == [tok.token_to_id("<|im_start|>")] == [1]
    assert tok.eos_token_ids == [2] and tok.is_eos(2)
    assert tok.bos_token_id == 1 and tok.vocab_size == 49152
    assert tok.decode(tok.encode("<|im_start|>hi<|im_end|>")) == "hi"


def test_bos_only_when_the_model_asks(smollm2):
    plain = Tokenizer.from_special_tokens(smollm2.tokenizer_json, smollm2.special_tokens)
    assert plain.encode("hi")[0] != 1  # SmolLM2 adds no BOS
    with_bos = Tokenizer(smollm2.tokenizer_json, bos_token_id=1, eos_token_ids=[2], add_bos=True)
    assert with_bos.encode("hi")[0] == 1
    assert with_bos.encode("hi", add_special_tokens=False)[0] != 1
    assert with_bos.encode("<|im_start|>hi").count(1) == 1  # never a doubled BOS


SPLIT_TEXTS = ["😀👍🏽🚀 done", "你好，世界。日本語", "mixed ascii 🚀 and 中文 end"]


@pytest.mark.parametrize("text", SPLIT_TEXTS)
def test_stream_decode_is_utf8_safe(tok, text):
    ids = tok.encode(text)
    stream = tok.stream_decoder()
    pieces = [stream.step(i) for i in ids]
    assert "".join(pieces) == text
    assert all("\ufffd" not in p for p in pieces)
    # the point of the test: some character really was split across tokens (decoding alone breaks it)
    assert any("\ufffd" in tok.decode([i]) for i in ids)


def test_load_from_path_and_bad_input(tmp_path, smollm2):
    path = tmp_path / "tokenizer.json"
    path.write_text(smollm2.tokenizer_json)
    assert Tokenizer(path).encode("Hello") == Tokenizer(smollm2.tokenizer_json).encode("Hello")
    with pytest.raises(PackageError, match="does not exist"):
        Tokenizer(tmp_path / "missing.json")
    with pytest.raises(PackageError, match="could not be loaded"):
        Tokenizer('{"not": "a tokenizer"}')
