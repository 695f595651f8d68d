"""HF folder import: tiny random transformers models saved to disk, read back by edge, compared tensor by tensor."""

from __future__ import annotations

import json

import numpy as np
import pytest

from edge.errors import ModelFormatError
from edge.export.hf import load_hf
from edge.export.load import load_model

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

SMALL = dict(vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=256)

CHATML = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"


def _tokenizer_json() -> str:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{chr(97 + i): 3 + i for i in range(26)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    return tok.to_str()


def _save(model, folder, dtype, tokenizer_config: dict | None = None):
    torch.manual_seed(0)
    model.to(dtype).save_pretrained(folder)
    (folder / "tokenizer.json").write_text(_tokenizer_json())
    if tokenizer_config is not None:
        (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))


def _assert_same_tensors(imported, model):
    expected = {k: v.float().numpy() for k, v in model.state_dict().items()}
    if imported.config.tie_word_embeddings:
        expected.pop("lm_head.weight", None)
    assert set(imported.tensors) == set(expected)
    for name, value in expected.items():
        got = imported.tensors[name]
        assert got.dtype == np.float32 and got.shape == value.shape, name
        np.testing.assert_array_equal(got, value, err_msg=name)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_tiny_llama(tmp_path, dtype):
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(**SMALL, rope_theta=5000.0, rms_norm_eps=1e-5, tie_word_embeddings=False,
                                   bos_token_id=1, eos_token_id=2)
    model = transformers.LlamaForCausalLM(cfg)
    _save(model, tmp_path, dtype, {"bos_token": "<s>", "eos_token": "</s>", "add_bos_token": True,
                                   "chat_template": CHATML})
    imported = load_model(tmp_path)
    c = imported.config
    assert (c.architecture, c.vocab_size, c.hidden_size, c.intermediate_size) == ("llama", 96, 32, 48)
    assert (c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim, c.max_context) == (2, 4, 2, 8, 256)
    assert (c.rope_theta, c.rms_norm_eps, c.tie_word_embeddings, c.qkv_bias) == (5000.0, 1e-5, False, False)
    assert c.rope_scaling is None
    _assert_same_tensors(imported, model.to(dtype))
    s = imported.special_tokens
    assert (s.bos_token_id, s.eos_token_ids, s.add_bos) == (1, [2], True)
    assert imported.chat_template == CHATML and imported.source["format"] == "hf"


def test_tiny_qwen2_with_bias_and_tied_embeddings(tmp_path):
    torch.manual_seed(0)
    cfg = transformers.Qwen2Config(**SMALL, tie_word_embeddings=True, rope_theta=1e6)
    model = transformers.Qwen2ForCausalLM(cfg)
    with torch.no_grad():  # random init leaves biases at zero; make them tell apart
        for layer in model.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                proj.bias.normal_()
    _save(model, tmp_path, torch.float32)
    (tmp_path / "chat_template.jinja").write_text(CHATML)
    imported = load_hf(tmp_path)
    assert imported.config.qkv_bias and imported.config.tie_word_embeddings and imported.config.rope_theta == 1e6
    assert "model.layers.1.self_attn.k_proj.bias" in imported.tensors
    assert "lm_head.weight" not in imported.tensors
    _assert_same_tensors(imported, model)
    assert imported.chat_template == CHATML


def test_llama3_rope_scaling(tmp_path):
    rope = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 128, "rope_theta": 500000.0}
    cfg = transformers.LlamaConfig(**SMALL, rope_parameters=rope)
    _save(transformers.LlamaForCausalLM(cfg), tmp_path, torch.float32)
    c = load_hf(tmp_path).config
    assert c.rope_theta == 500000.0
    assert c.rope_scaling == {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                              "original_max_position_embeddings": 128}


def test_tiny_gemma3_norms_are_made_effective(tmp_path):
    torch.manual_seed(0)
    cfg = transformers.Gemma3TextConfig(**SMALL, head_dim=8, sliding_window=16, query_pre_attn_scalar=8)
    model = transformers.Gemma3ForCausalLM(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.normal_()
    _save(model, tmp_path, torch.float32)
    imported = load_hf(tmp_path)
    c = imported.config
    assert (c.architecture, c.hidden_act, c.qk_norm, c.sliding_window, c.sliding_window_pattern) == (
        "gemma3", "gelu_tanh", True, 16, 6)
    assert c.rope_local_theta == 10000.0 and c.rope_theta == 1e6 and c.query_scale is None
    assert c.embedding_scale == pytest.approx(32**0.5)
    state = model.state_dict()
    for name in ["model.norm.weight", "model.layers.0.pre_feedforward_layernorm.weight",
                 "model.layers.1.self_attn.q_norm.weight"]:
        np.testing.assert_allclose(imported.tensors[name], state[name].numpy() + 1.0, rtol=0, atol=0)
    np.testing.assert_array_equal(imported.tensors["model.layers.0.mlp.up_proj.weight"],
                                  state["model.layers.0.mlp.up_proj.weight"].numpy())


def test_missing_files_and_unknown_type(tmp_path):
    with pytest.raises(ModelFormatError, match="config.json is missing"):
        load_hf(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    with pytest.raises(ModelFormatError, match=r"model_type 'gpt2' is not supported.*llama"):
        load_hf(tmp_path)
    cfg = transformers.LlamaConfig(**SMALL)
    cfg.save_pretrained(tmp_path)
    with pytest.raises(ModelFormatError, match="no \\*.safetensors"):
        load_hf(tmp_path)
    transformers.LlamaForCausalLM(cfg).save_pretrained(tmp_path)
    with pytest.raises(ModelFormatError, match="tokenizer.json is missing"):
        load_hf(tmp_path)


def test_load_model_dispatch(tmp_path, smollm2_gguf):
    odd = tmp_path / "weights.bin"
    odd.write_bytes(b"\x80\x04 pickle")
    with pytest.raises(ModelFormatError, match="not a model edge can import"):
        load_model(odd)
    with pytest.raises(ModelFormatError, match="no such file or folder"):
        load_model(tmp_path / "nothing")
    assert load_model(smollm2_gguf).source["format"] == "gguf"
