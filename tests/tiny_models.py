"""Tiny random transformers models turned into edge's ImportedModel, for reference checks without real weights."""

from __future__ import annotations

import json

import numpy as np

from edge.config import ModelConfig
from edge.export.source import ImportedModel, SpecialTokens

VOCAB = 96


def word_level_tokenizer_json(vocab: int = VOCAB) -> str:
    """A tokenizer whose tokens are 't0'..'tN', enough for the runtime's text path."""
    return json.dumps({
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": [],
        "normalizer": None, "pre_tokenizer": {"type": "WhitespaceSplit"}, "post_processor": None,
        "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": False},  # joins words with spaces
        "model": {"type": "WordLevel", "vocab": {f"t{i}": i for i in range(vocab)}, "unk_token": "t0"},
    })


def tiny_llama(seed: int = 0, qkv_bias: bool = False, tie: bool = True, **overrides):
    """A random Llama (or Qwen2 with qkv_bias) in transformers and the same weights as an ImportedModel."""
    import torch
    import transformers

    torch.manual_seed(seed)
    kw = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-5, tie_word_embeddings=tie,
              rope_theta=10000.0)
    kw.update(overrides)
    if qkv_bias:
        hf_config = transformers.Qwen2Config(**kw)
        model = transformers.Qwen2ForCausalLM(hf_config)
    else:
        hf_config = transformers.LlamaConfig(**kw)
        model = transformers.LlamaForCausalLM(hf_config)
    model.eval()
    with torch.no_grad():  # random norms, so a wrong norm weight cannot hide behind all-ones
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
    tensors = {k: v.detach().float().numpy().copy() for k, v in model.state_dict().items()}
    if tie:
        tensors.pop("lm_head.weight", None)
    cfg = ModelConfig(
        architecture="llama", vocab_size=VOCAB, hidden_size=kw["hidden_size"],
        intermediate_size=kw["intermediate_size"], num_layers=kw["num_hidden_layers"],
        num_heads=kw["num_attention_heads"], num_kv_heads=kw["num_key_value_heads"],
        head_dim=kw["hidden_size"] // kw["num_attention_heads"], max_context=kw["max_position_embeddings"],
        rms_norm_eps=kw["rms_norm_eps"], rope_theta=kw["rope_theta"], tie_word_embeddings=tie, qkv_bias=qkv_bias,
    )
    imported = ImportedModel(cfg, tensors, word_level_tokenizer_json(), SpecialTokens(None, [VOCAB - 1]), None,
                             {"format": "test", "name": "tiny"})
    return model, imported


def reference_logits(model, ids: list[int]) -> np.ndarray:
    import torch

    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float().numpy()


def max_rel_error(ours: np.ndarray, ref: np.ndarray) -> float:
    """Worst row's max |difference| over that row's max |reference|: scale-free and stable near zero logits."""
    ours, ref = np.atleast_2d(ours), np.atleast_2d(ref)
    return float(np.max(np.abs(ours - ref).max(axis=-1) / np.abs(ref).max(axis=-1)))


def tiny_gemma3(tmp_path):
    """A tiny random Gemma 3 (transformers) with a 6-layer pattern: 5 sliding-window layers (window 8) and one
    global, q/k norms, GELU, embedding scale and two rope bases; returns (torch model, imported model)."""
    import torch
    import transformers

    from edge.export.hf import load_hf

    torch.manual_seed(0)
    config = transformers.Gemma3TextConfig(
        vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=7, num_attention_heads=4,
        num_key_value_heads=1, head_dim=32, max_position_embeddings=128, sliding_window=8,
        query_pre_attn_scalar=32, rope_theta=1e6, tie_word_embeddings=True)
    model = transformers.Gemma3ForCausalLM(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(0.3 * torch.randn_like(p))
    model.save_pretrained(tmp_path / "hf")
    (tmp_path / "hf" / "tokenizer.json").write_text(word_level_tokenizer_json())
    return model, load_hf(tmp_path / "hf")
