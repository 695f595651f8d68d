"""The output head's own quantization (export/quant/head.py): GPTQ on the final hidden states, exported as such."""

from __future__ import annotations

import numpy as np
import pytest

from edge.errors import EdgeError
from edge.export import pipeline
from edge.export.quant import QuantizationError
from edge.export.quant import head as head_quant
from edge.export.quant.hessian import weighted_error
from edge.export.quant.rtn import quantize_rtn
from edge.model import Decoder
from edge.package import load_package
from tiny_models import max_rel_error, reference_logits, tiny_gemma3, tiny_llama


def calibration_tokens(imported, sequences: int = 4) -> np.ndarray:
    from edge.export.quant.calibration_text import token_sequences
    from edge.tokenizer import Tokenizer

    encode = Tokenizer(imported.tokenizer_json).encode
    return token_sequences(lambda t: encode(t, add_special_tokens=False), "calibration", sequences, 64)[0]


def test_gptq_head_has_less_logit_error_than_round_to_nearest():
    """Measured on the final hidden states it was calibrated on, and the grid is what the kernel stores: float16
    scales, integer zero points."""
    _, imported = tiny_llama(seed=3, hidden_size=128, intermediate_size=192)
    h = head_quant.head_hessian(imported, calibration_tokens(imported))
    w = np.asarray(imported.tensors["model.embed_tokens.weight"], np.float32)
    assert h.shape == (128, 128) and np.all(np.diag(h) > 0)
    from edge.export.quant.gptq import quantize_gptq

    gptq = quantize_gptq(w, h, 4, 32, half_scales=True)
    rtn = quantize_rtn(w, 4, 32)
    assert np.array_equal(gptq.scales.astype(np.float16).astype(np.float32), gptq.scales) and gptq.offsets is None
    assert weighted_error(w, gptq.dequantize(), h).sum() < 0.8 * weighted_error(w, rtn.dequantize(), h).sum()


def exported_heads(monkeypatch) -> list:
    """Every head weight the export's calibrated head quantizer returns."""
    made = []
    original = head_quant.gptq_head

    def capturing(*args, **kwargs):
        quantize, record = original(*args, **kwargs)
        return (lambda w: made.append(quantize(w)) or made[-1]), record

    monkeypatch.setattr(head_quant, "gptq_head", capturing)
    return made


def test_gemma3_calibration_forward_matches_transformers(tmp_path):
    """The numpy forward the head's Hessian comes from, on Gemma 3: sequences longer than the sliding window, q/k
    norms, the four norms per layer, GELU and both rope bases; its final hidden states give transformers' logits."""
    from edge.export.quant.calibrate import CALIBRATORS, rms_norm

    model, imported = tiny_gemma3(tmp_path)
    ids = [int(t) for t in np.random.default_rng(5).integers(0, 96, 20)]  # window 8
    calibrator = CALIBRATORS["gemma3"](imported, np.array([ids]), lambda name, w, h: None, hessians=False)
    for i in range(imported.config.num_layers):
        calibrator.layer(i)
    cfg = imported.config
    hidden = rms_norm(calibrator.hidden[0], imported.tensors["model.norm.weight"], cfg.rms_norm_eps)
    logits = hidden @ np.asarray(imported.tensors["model.embed_tokens.weight"], np.float32).T
    assert max_rel_error(logits, reference_logits(model, ids)) < 1e-4


@pytest.mark.parametrize("arch", ["llama-tied", "llama-untied", "gemma3"])
def test_export_computes_with_the_calibrated_head(tmp_path, monkeypatch, arch):
    """The default for a quantized Llama-style or Gemma 3 model whose head has weights of its own: tied on
    edge.QMatMul (its own copy; the gather keeps the table's), or untied on stock MatMulNBits. The graph's logits are
    the model's with that head."""
    import torch

    made = exported_heads(monkeypatch)
    if arch == "gemma3":
        model, imported = tiny_gemma3(tmp_path)
    else:
        model, imported = tiny_llama(seed=1, tie=arch == "llama-tied", hidden_size=128, intermediate_size=256)
    kernels = "stock" if arch == "llama-untied" else "edge"
    if kernels == "edge":
        from kernels_util import ensure_library
        ensure_library()
    out = pipeline.export_model("tiny", tmp_path / "p", quant="int4", model=imported, kernels=kernels,
                                accuracy_level=0)
    record = load_package(out).manifest["quantization"]["head"]
    assert record["method"] == "gptq" and record["bits"] == 4 and record["calibration_tokens"] > 0
    assert len(made) == 1
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name == "model.embed_tokens.weight":
                p.copy_(torch.from_numpy(quantize_rtn(p.detach().numpy(), 4, 32).dequantize()))
            elif name.endswith("_proj.weight"):
                p.copy_(torch.from_numpy(quantize_rtn(p.detach().numpy(), 4, 32).dequantize()))
        model.lm_head.weight = torch.nn.Parameter(torch.from_numpy(made[0].dequantize()))  # unties a tied head
    ids = [int(t) for t in np.random.default_rng(0).integers(0, 96, 12)]
    logits = Decoder(load_package(out), context_length=32, threads=1).step(ids, logits_rows=list(range(12)))
    assert max_rel_error(logits, reference_logits(model, ids)) < 1e-4


def test_head_choice_defaults_and_errors(tmp_path, monkeypatch):
    made = exported_heads(monkeypatch)
    _, imported = tiny_llama(seed=2)
    # a tied head on stock ops reads the table: nothing to calibrate by default, an error when asked for
    out = pipeline.export_model("tiny", tmp_path / "a", quant="int4", model=imported)
    assert "head" not in load_package(out).manifest["quantization"] and not made
    with pytest.raises(QuantizationError, match="--kernels edge"):
        pipeline.export_model("tiny", tmp_path / "b", quant="int4", model=imported, head="gptq")
    with pytest.raises(QuantizationError, match="not fp32"):
        pipeline.export_model("tiny", tmp_path / "c", quant="fp32", model=imported, head="gptq")
    with pytest.raises(QuantizationError, match="unknown head"):
        pipeline.export_model("tiny", tmp_path / "d", quant="int4", model=imported, head="awq")
    # an 8-bit table (lossless for a Q8_0 source) is kept as the head unless asked otherwise
    out = pipeline.export_model("tiny", tmp_path / "e", quant="int4", model=imported, kernels="edge", zeros="float")
    assert "head" not in load_package(out).manifest["quantization"] and not made
    assert not any(p.exists() for p in (tmp_path / "b", tmp_path / "c", tmp_path / "d"))


def test_an_architecture_without_a_calibrator_keeps_the_tables_head(tmp_path, monkeypatch):
    from edge.export.quant import calibrate

    monkeypatch.delitem(calibrate.CALIBRATORS, "llama")
    _, imported = tiny_llama(seed=2)
    assert not head_quant.supports_calibrated_head(imported)
    with pytest.raises(QuantizationError, match="Llama-style or Gemma 3"):
        pipeline.export_model("tiny", tmp_path / "g", quant="int4", model=imported, kernels="edge", head="gptq")
    out = pipeline.export_model("tiny", tmp_path / "h", quant="int4", model=imported, kernels="edge")
    assert "head" not in load_package(out).manifest["quantization"]  # the default falls back to the table's


def test_a_calibrated_head_is_refused_by_the_skip_layer_self_draft(tmp_path):
    """The self-draft re-creates the target's tensors to share them, and cannot re-create a calibrated head."""
    from edge.export.self_draft import package_build_options

    _, imported = tiny_llama(seed=2, tie=False)
    out = pipeline.export_model("tiny", tmp_path / "p", quant="int4", model=imported)
    with pytest.raises(EdgeError, match="--head rtn"):
        package_build_options(load_package(out))
    out = pipeline.export_model("tiny", tmp_path / "q", quant="int4", model=imported, head="rtn")
    package_build_options(load_package(out))  # accepted


def test_inputs_the_calibration_never_reached_keep_their_weights():
    """GPTQ zeroes such columns; the head's must come out as round-to-nearest does (here: every input dead)."""
    from edge.export.quant.gptq import quantize_gptq

    w = np.random.default_rng(0).standard_normal((16, 64)).astype(np.float32)
    h = np.zeros((64, 64))
    rtn = quantize_rtn(w, 4, 32)
    revived = quantize_gptq(w, head_quant.revive_dead_inputs(h), 4, 32)
    assert np.abs(quantize_gptq(w, h, 4, 32).dequantize()).max() == 0  # what GPTQ alone would do
    assert np.allclose(revived.dequantize(), rtn.dequantize(), atol=1e-6)
