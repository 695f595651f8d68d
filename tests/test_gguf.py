"""GGUF import: the real SmolLM2 file against transformers' GGUF loader, synthetic files for the error paths."""

from __future__ import annotations

import numpy as np
import pytest

from edge.errors import ModelFormatError
from edge.export.gguf import load_gguf, unpermute_rotary
from tiny_models import tiny_gguf


def test_smollm2_config(smollm2):
    c = smollm2.config
    assert (c.architecture, c.num_layers, c.hidden_size, c.intermediate_size) == ("llama", 30, 576, 1536)
    assert (c.num_heads, c.num_kv_heads, c.head_dim, c.vocab_size) == (9, 3, 64, 49152)
    assert (c.rope_theta, c.max_context, c.rms_norm_eps) == (100000.0, 8192, 1e-5)
    assert c.tie_word_embeddings and not c.qkv_bias and c.rope_scaling is None and c.hidden_act == "silu"
    s = smollm2.special_tokens
    assert (s.bos_token_id, s.eos_token_ids, s.add_bos) == (1, [2], False)
    assert smollm2.chat_template.startswith("{% for message in messages %}")
    src = smollm2.source
    assert src["format"] == "gguf" and src["file_type"] == 3
    assert src["sha256"] == "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"


def test_smollm2_tensor_names_and_shapes(smollm2):
    t = smollm2.tensors
    assert len(t) == 272 and "lm_head.weight" not in t
    assert t["model.layers.0.mlp.gate_proj.weight"].shape == (1536, 576)
    assert t["model.layers.0.mlp.down_proj.weight"].shape == (576, 1536)
    assert t["model.layers.29.self_attn.k_proj.weight"].shape == (192, 576)
    assert t["model.embed_tokens.weight"].shape == (49152, 576)
    assert t["model.layers.3.post_attention_layernorm.weight"].dtype == np.float32


@pytest.mark.parametrize(
    "name",
    [
        "model.layers.0.self_attn.q_proj.weight",
        "model.layers.0.self_attn.k_proj.weight",
        "model.layers.29.self_attn.q_proj.weight",
        "model.layers.17.self_attn.k_proj.weight",
        "model.layers.5.self_attn.v_proj.weight",
        "model.layers.5.mlp.down_proj.weight",
        "model.layers.12.post_attention_layernorm.weight",
        "model.embed_tokens.weight",
        "model.norm.weight",
    ],
)
def test_tensors_equal_transformers(smollm2, hf_gguf_model, name):
    """Same dequantized values, and q/k rows back in HF's half-split rotary order."""
    expected = hf_gguf_model.state_dict()[name].numpy()
    np.testing.assert_array_equal(smollm2.tensors[name], expected)


def _llama_cpp_permute(w: np.ndarray, heads: int) -> np.ndarray:
    # the converter's permutation, restated to check that the importer inverts it
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def test_unpermute_inverts_llama_cpp_permutation():
    w = np.arange(8 * 16 * 3, dtype=np.float32).reshape(8 * 16, 3)
    assert not np.array_equal(_llama_cpp_permute(w, 8), w)
    np.testing.assert_array_equal(unpermute_rotary(_llama_cpp_permute(w, 8), 8), w)


def _write_gguf(path, arch: str, tensors: dict[str, np.ndarray], **meta) -> None:
    import gguf

    writer = gguf.GGUFWriter(str(path), arch)
    for key, value in meta.items():
        writer.add_uint32(key, value) if isinstance(value, int) else writer.add_string(key, value)
    for name, array in tensors.items():
        writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_not_a_gguf(tmp_path):
    bad = tmp_path / "model.gguf"
    bad.write_bytes(b"PK\x03\x04 this is a zip, not a model")
    with pytest.raises(ModelFormatError, match="not a GGUF file"):
        load_gguf(bad)
    with pytest.raises(ModelFormatError, match="no such GGUF file"):
        load_gguf(tmp_path / "missing.gguf")


def test_unknown_architecture(tmp_path):
    path = tmp_path / "foo.gguf"
    _write_gguf(path, "foo", {"token_embd.weight": np.zeros((4, 8), np.float32)})
    with pytest.raises(ModelFormatError, match=r"architecture 'foo' is not supported.*gemma3.*llama"):
        load_gguf(path)


@pytest.mark.parametrize("keep", [0.02, 0.5, 0.999])
def test_truncated_gguf(tmp_path, keep):
    whole = tmp_path / "whole.gguf"
    tiny_gguf(whole, "llama", bias=False, tied=True)
    data = whole.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: int(len(data) * keep)])  # 0.02 ends inside the metadata, the others inside tensor data
    with pytest.raises(ModelFormatError, match="truncated"):
        load_gguf(cut)


@pytest.mark.slow
def test_gemma3_import(gemma3_gguf):
    """The second architecture: config from metadata, effective norms, tokenizer equal to transformers'."""
    model = load_gguf(gemma3_gguf)
    c = model.config
    assert (c.architecture, c.num_layers, c.hidden_size, c.intermediate_size) == ("gemma3", 18, 640, 2048)
    assert (c.num_heads, c.num_kv_heads, c.head_dim, c.vocab_size) == (4, 1, 256, 262144)
    assert (c.rope_theta, c.rope_local_theta, c.sliding_window, c.sliding_window_pattern) == (1e6, 1e4, 512, 6)
    assert c.max_context == 32768 and c.rms_norm_eps == 1e-6 and c.qk_norm and c.hidden_act == "gelu_tanh"
    assert c.embedding_scale == pytest.approx(640**0.5) and c.tie_word_embeddings
    assert c.is_sliding_layer(0) and not c.is_sliding_layer(5)
    s = model.special_tokens
    assert (s.bos_token_id, s.add_bos) == (2, True) and s.eos_token_ids[0] == 1 and 106 in s.eos_token_ids
    assert model.chat_template is None  # a base model
    t = model.tensors
    assert "model.layers.0.pre_feedforward_layernorm.weight" in t and "model.layers.0.self_attn.q_norm.weight" in t
    # GGUF already holds Gemma's effective norm (1 + w): far from the raw weights' ~0 mean
    assert t["model.layers.0.input_layernorm.weight"].mean() > 2.0
    assert t["model.layers.0.self_attn.q_proj.weight"].shape == (1024, 640)

    transformers = pytest.importorskip("transformers")
    from edge.tokenizer import Tokenizer

    ref = transformers.AutoTokenizer.from_pretrained(str(gemma3_gguf.parent), gguf_file=gemma3_gguf.name)
    tok = Tokenizer.from_special_tokens(model.tokenizer_json, s)
    for text in ["Hello world", "  two  spaces\n\nand lines", "def f(x):\n\treturn x**2", "café 😀 你好 12345",
                 "<start_of_turn>user\nhi<end_of_turn>"]:
        assert tok.encode(text) == ref.encode(text), text
        assert tok.decode(tok.encode(text)) == ref.decode(ref.encode(text), skip_special_tokens=True)
    # byte-fallback pieces (<0xF0>...) of rare characters stream out as whole characters
    text = "𠀋𝔘 rare ☃ 😀"
    ids = tok.encode(text)
    assert tok.id_to_token(ids[1]) == "<0xF0>"
    stream = tok.stream_decoder()
    pieces = [stream.step(i) for i in ids]
    assert "".join(pieces) == text and not any("\ufffd" in p for p in pieces)


def test_qwen2_gguf_keeps_rows_and_biases(tmp_path):
    """qwen2 files use NEOX rotary: no row permutation to undo; biases come along; an output layer is kept."""
    path = tmp_path / "qwen2.gguf"
    written = tiny_gguf(path, "qwen2", bias=True, tied=False)
    model = load_gguf(path)
    c = model.config
    assert (c.architecture, c.qkv_bias, c.tie_word_embeddings) == ("llama", True, False)
    assert (c.head_dim, c.rope_theta) == (16, 1e6)
    t = model.tensors
    np.testing.assert_array_equal(t["model.layers.0.self_attn.q_proj.weight"], written["blk.0.attn_q.weight"])
    np.testing.assert_array_equal(t["model.layers.0.self_attn.k_proj.bias"], written["blk.0.attn_k.bias"])
    np.testing.assert_array_equal(t["lm_head.weight"], written["output.weight"])
    np.testing.assert_array_equal(t["model.layers.0.mlp.down_proj.weight"], written["blk.0.ffn_down.weight"])
    from edge.tokenizer import Tokenizer

    tok = Tokenizer.from_special_tokens(model.tokenizer_json, model.special_tokens)
    eos = len(written["token_embd.weight"]) - 1
    assert model.special_tokens.eos_token_ids == [eos]
    assert tok.encode(" th<|endoftext|>") == [tok.token_to_id("Ġth"), eos]
    assert tok.decode(tok.encode("a thé")) == "a thé"


def test_llama_gguf_unpermutes_q_k_and_reads_rope_freqs(tmp_path):
    path = tmp_path / "llama.gguf"
    written = tiny_gguf(path, "llama", bias=False, tied=True, rope_freqs=True)
    model = load_gguf(path)
    t = model.tensors
    np.testing.assert_array_equal(t["model.layers.0.self_attn.q_proj.weight"],
                                  unpermute_rotary(written["blk.0.attn_q.weight"], 4))
    np.testing.assert_array_equal(t["model.layers.0.self_attn.k_proj.weight"],
                                  unpermute_rotary(written["blk.0.attn_k.weight"], 2))
    np.testing.assert_array_equal(t["model.layers.0.self_attn.v_proj.weight"], written["blk.0.attn_v.weight"])
    assert "lm_head.weight" not in t and model.config.tie_word_embeddings
    scaling = model.config.rope_scaling
    assert scaling["rope_type"] == "llama3" and scaling["factor"] == 8.0 and len(scaling["freq_factors"]) == 8


def test_sentencepiece_vocab_merges_by_score_with_byte_fallback():
    """A Llama-2-style vocabulary (scores, no merges): pieces merge best-score first; unknown bytes fall back."""
    from edge.export.gguf_tokenizer import BYTE, CONTROL, NORMAL, GGUFVocab, build_tokenizer_json
    from edge.tokenizer import Tokenizer

    pieces = {"▁": -10, "h": -10, "e": -10, "l": -10, "o": -10, "▁h": -6, "he": -5, "ll": -4, "▁he": -3,
              "llo": -2, "▁hello": -1}
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + list(pieces)
    vocab = GGUFVocab(
        model="llama",
        tokens=tokens,
        token_types=[2, CONTROL, CONTROL] + [BYTE] * 256 + [NORMAL] * len(pieces),
        scores=[0.0] * 259 + list(pieces.values()),
        unk_token_id=0,
    )
    tok = Tokenizer(build_tokenizer_json(vocab), bos_token_id=1, eos_token_ids=[2], add_bos=True)
    ids = tok.encode("hello hi")
    assert [tok.id_to_token(i) for i in ids] == ["<s>", "▁hello", "▁h", "<0x69>"]
    assert tok.decode(ids) == "hello hi"
    assert tok.encode("</s>", add_special_tokens=False) == [2]
    stream = tok.stream_decoder()  # the prefix space is dropped once, not per token; bytes join into "é"
    assert [stream.step(i) for i in tok.encode("hello hello é")] == ["", "hello", " hello", " ", "", "é"]
