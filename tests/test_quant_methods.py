import numpy as np
import pytest

from edge.config import ModelConfig
from edge.export.quant import QuantizationError
from edge.export.quant.methods import QuantSpec, make_quantizer, quantize_model
from edge.export.source import ImportedModel, SpecialTokens


def tiny_model() -> ImportedModel:
    rng = np.random.default_rng(0)
    cfg = ModelConfig(architecture="llama", vocab_size=256, hidden_size=32, intermediate_size=48, num_layers=2,
                      num_heads=4, num_kv_heads=2, head_dim=8, max_context=64)
    shapes = {"model.embed_tokens.weight": (256, 32), "model.norm.weight": (32,)}
    for i in range(2):
        p = f"model.layers.{i}."
        shapes.update({p + "input_layernorm.weight": (32,), p + "post_attention_layernorm.weight": (32,),
                       p + "self_attn.q_proj.weight": (32, 32), p + "self_attn.k_proj.weight": (16, 32),
                       p + "self_attn.v_proj.weight": (16, 32), p + "self_attn.o_proj.weight": (32, 32),
                       p + "mlp.gate_proj.weight": (48, 32), p + "mlp.up_proj.weight": (48, 32),
                       p + "mlp.down_proj.weight": (32, 48)})
    tensors = {k: (np.ones(s) if len(s) == 1 else rng.normal(size=s) * 0.2).astype(np.float32) for k, s in shapes.items()}
    return ImportedModel(cfg, tensors, "", SpecialTokens(None, [0]), None)


def byte_encode(text):
    return list(text.encode("utf-8"))


@pytest.mark.parametrize("spec", [QuantSpec("rtn", 4), QuantSpec("spqr", 3, seq_len=64, num_sequences=4),
                                  QuantSpec("decoupleq", 2, group_size=16, seq_len=64, num_sequences=4, rounds=2)])
def test_quantize_model_covers_every_linear(spec):
    model = tiny_model()
    steps = []
    layers, record = quantize_model(model, spec, byte_encode, include_head=True, progress=steps.append)
    linears = {k for k in model.tensors if k.endswith("proj.weight")} | {"model.embed_tokens.weight"}
    assert set(layers) == linears and steps == [1, 1]
    assert all(q.method == spec.method and q.bits == spec.bits for q in layers.values())
    assert record["method"] == spec.method and record["storage_bits_per_weight"] > spec.bits
    assert record["runtime_bits_per_weight"] >= record["storage_bits_per_weight"] - 1
    assert (record["calibration"] is None) == (spec.method == "rtn")
    if record["calibration"]:
        assert "pydoc_data" in record["calibration"]["source"] and record["calibration"]["seq_len"] == 64


def test_bad_specs():
    with pytest.raises(QuantizationError, match="method"):
        make_quantizer(QuantSpec("awq", 4))
    with pytest.raises(QuantizationError, match="bits"):
        make_quantizer(QuantSpec("spqr", 2))
