"""Tiny random models for reference checks without real weights: transformers models turned into edge's ImportedModel,
and a GGUF file written with gguf's own writer."""

from __future__ import annotations

import dataclasses
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


CHATML = ("{% for m in messages %}<|im_start|> {{ m['role'] }} {{ m['content'] }} <|im_end|> {% endfor %}"
          "{% if add_generation_prompt %}<|im_start|> assistant {% endif %}")


def tiny_chat_llama(**overrides) -> ImportedModel:
    """A tiny Llama that chats: a ChatML template whose markers and roles are words of its vocabulary (t90-t94
    renamed), so rendered conversations tokenize, and no EOS, so replies run to max_tokens. Larger weights than
    tiny_llama's default: varied, non-repeating greedy text."""
    _, imported = tiny_llama(seed=7, initializer_range=0.3, **overrides)
    imported.chat_template = CHATML
    for word, name in (("t90", "<|im_start|>"), ("t91", "<|im_end|>"), ("t92", "user"), ("t93", "assistant"),
                       ("t94", "system")):
        imported.tokenizer_json = imported.tokenizer_json.replace(f'"{word}"', f'"{name}"')
    imported.special_tokens = dataclasses.replace(imported.special_tokens, eos_token_ids=[])
    return imported


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


def tiny_gguf(path, arch: str, *, bias: bool, tied: bool, rope_freqs: bool = False) -> dict[str, np.ndarray]:
    """A 1-layer model GGUF written with gguf's own writer; returns the float tensors as written (GGUF names)."""
    import gguf

    from edge.export.gguf_tokenizer import _byte_to_unicode

    rng = np.random.default_rng(0)
    hidden, heads, kv_heads, ffn = 64, 4, 2, 96
    alphabet = list(_byte_to_unicode().values())
    tokens = alphabet + ["Ġt", "Ġth", "<|endoftext|>"]
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(1)
    w.add_context_length(512)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(1e6)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types([1] * (len(tokens) - 1) + [3])
    w.add_token_merges(["Ġ t", "Ġt h"])
    w.add_eos_token_id(len(tokens) - 1)
    shapes = {"token_embd.weight": (len(tokens), hidden), "output_norm.weight": (hidden,),
              "blk.0.attn_norm.weight": (hidden,), "blk.0.ffn_norm.weight": (hidden,),
              "blk.0.attn_q.weight": (hidden, hidden), "blk.0.attn_k.weight": (kv_heads * 16, hidden),
              "blk.0.attn_v.weight": (kv_heads * 16, hidden), "blk.0.attn_output.weight": (hidden, hidden),
              "blk.0.ffn_gate.weight": (ffn, hidden), "blk.0.ffn_up.weight": (ffn, hidden),
              "blk.0.ffn_down.weight": (hidden, ffn)}
    if bias:
        shapes |= {"blk.0.attn_q.bias": (hidden,), "blk.0.attn_k.bias": (kv_heads * 16,),
                   "blk.0.attn_v.bias": (kv_heads * 16,)}
    if not tied:
        shapes["output.weight"] = (len(tokens), hidden)
    if rope_freqs:
        shapes["rope_freqs.weight"] = (8,)
    written = {}
    for name, shape in shapes.items():
        value = rng.standard_normal(shape).astype(np.float32)
        if name == "rope_freqs.weight":
            value = np.linspace(1.0, 8.0, 8, dtype=np.float32)
        if len(shape) == 2 and name != "blk.0.ffn_down.weight":  # quantize matrices (Q8_0), keep one in F32
            packed = gguf.quants.quantize(value, gguf.GGMLQuantizationType.Q8_0)
            value = gguf.quants.dequantize(packed, gguf.GGMLQuantizationType.Q8_0)
            w.add_tensor(name, packed, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            w.add_tensor(name, value)
        written[name] = value
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return written
