"""The numpy calibration forward pass against transformers' Llama, and its sequential use of quantized weights."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from edge.config import ModelConfig  # noqa: E402
from edge.export.quant import QuantizationError  # noqa: E402
from edge.export.quant.calibrate import LlamaCalibrator, calibrate_and_quantize, rms_norm  # noqa: E402
from edge.export.quant.rtn import quantize_rtn  # noqa: E402
from edge.export.source import ImportedModel, SpecialTokens  # noqa: E402


def tiny_llama(seed: int = 0):
    torch.manual_seed(seed)
    hf_cfg = transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, max_position_embeddings=64, rope_theta=10000.0, rms_norm_eps=1e-5,
        tie_word_embeddings=False,
    )
    hf = transformers.LlamaForCausalLM(hf_cfg).eval()
    cfg = ModelConfig(architecture="llama", vocab_size=64, hidden_size=32, intermediate_size=48, num_layers=2,
                      num_heads=4, num_kv_heads=2, head_dim=8, max_context=64, rms_norm_eps=1e-5, rope_theta=10000.0)
    tensors = {k: v.detach().numpy().astype(np.float32) for k, v in hf.state_dict().items()}
    for k in tensors:  # random norms, so a wrong norm weight would show
        if k.endswith("norm.weight"):
            tensors[k] = 1.0 + 0.1 * np.random.default_rng(len(k)).normal(size=tensors[k].shape).astype(np.float32)
    hf.load_state_dict({k: torch.from_numpy(v) for k, v in tensors.items()})
    model = ImportedModel(cfg, tensors, "", SpecialTokens(1, [2]), None)
    return hf, model


def hf_inputs(hf, tokens: np.ndarray) -> dict[str, np.ndarray]:
    """Inputs of every linear layer of the transformers model, captured with forward hooks."""
    seen: dict[str, np.ndarray] = {}
    hooks = [
        mod.register_forward_hook(lambda m, a, o, n=name: seen.__setitem__(n + ".weight", a[0].detach().numpy()))
        for name, mod in hf.named_modules() if isinstance(mod, torch.nn.Linear)
    ]
    with torch.no_grad():
        hf(torch.from_numpy(tokens))
    for h in hooks:
        h.remove()
    return seen


def gram(x: np.ndarray) -> np.ndarray:
    x = x.reshape(-1, x.shape[-1]).astype(np.float64)
    return x.T @ x / len(x)


def test_hessians_match_transformers_without_quantization():
    hf, model = tiny_llama()
    tokens = np.random.default_rng(0).integers(0, 64, size=(3, 20))
    got = {}

    def record(name, w, h):
        got[name] = h
        return None

    calibrate_and_quantize(model, tokens, record, include_head=True, batch=2)
    ref = hf_inputs(hf, tokens)
    assert set(got) == set(ref)
    for name in ref:
        np.testing.assert_allclose(got[name], gram(ref[name]), rtol=1e-4, atol=1e-5, err_msg=name)


def test_later_layers_see_quantized_activations():
    hf, model = tiny_llama(1)
    tokens = np.random.default_rng(1).integers(0, 64, size=(2, 16))
    got, quantized = {}, {}

    def rtn(name, w, h):
        got[name] = h
        quantized[name] = quantize_rtn(w, 2, 16)
        return quantized[name]

    result = calibrate_and_quantize(model, tokens, rtn)
    assert set(result) == {n for n in model.tensors if n.endswith("proj.weight")}
    state = hf.state_dict()
    for name, q in quantized.items():
        state[name] = torch.from_numpy(q.dequantize())
    hf.load_state_dict(state)
    ref = hf_inputs(hf, tokens)
    for name in ("model.layers.1.self_attn.q_proj.weight", "model.layers.1.mlp.down_proj.weight"):
        np.testing.assert_allclose(got[name], gram(ref[name]), rtol=1e-4, atol=1e-5)


def test_rejects_foreign_architecture_and_bad_tokens():
    _, model = tiny_llama()
    with pytest.raises(QuantizationError, match="ids below"):
        LlamaCalibrator(model, np.array([[0, 99]]), lambda *a: None)
    model.config.architecture = "gemma3"
    with pytest.raises(QuantizationError, match="Llama"):
        LlamaCalibrator(model, np.array([[0, 1]]), lambda *a: None)


def test_reference_forward_without_hessians_matches_transformers_logits():
    hf, model = tiny_llama(2)
    tokens = np.random.default_rng(2).integers(0, 64, size=(2, 12))
    seen = []
    cal = LlamaCalibrator(model, tokens, lambda name, w, h: seen.append(h), hessians=False)
    for i in range(model.config.num_layers):
        cal.layer(i)
    w_head = cal.head()
    logits = rms_norm(cal.hidden, model.tensors["model.norm.weight"], 1e-5) @ w_head.T
    with torch.no_grad():
        ref = hf(torch.from_numpy(tokens)).logits.numpy()
    np.testing.assert_allclose(logits, ref, atol=1e-4)
    assert seen and all(h is None for h in seen)
