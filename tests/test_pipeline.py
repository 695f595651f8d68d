"""The export pipeline's calibrated methods: the package's graph computes exactly the quantized layers it reports."""

from __future__ import annotations

import numpy as np
import pytest

from edge.export import pipeline
from edge.model import Decoder
from edge.package import load_package
from tiny_models import max_rel_error, reference_logits, tiny_llama


@pytest.mark.parametrize("method, bits", [("spqr", 3), ("decoupleq", 2)])
def test_calibrated_package_follows_its_quantized_layers(tmp_path, monkeypatch, method, bits):
    import torch

    from edge.export.quant import methods

    captured = {}
    original = methods.quantize_model

    def quantize_model(*args, **kwargs):  # keep what the pipeline quantized, to build the reference from it
        layers, record = original(*args, **kwargs)
        captured.update(layers)
        return layers, record

    monkeypatch.setattr(methods, "quantize_model", quantize_model)
    model, imported = tiny_llama(seed=1, hidden_size=128, intermediate_size=256)
    out = pipeline.export_model("tiny", tmp_path / "p", quant=method, bits=bits, model=imported,
                                accuracy_level=0)  # fp32 compute: the graph terms themselves are checked exactly
    package = load_package(out)
    q = package.manifest["quantization"]
    assert q["method"] == method and q["bits"] == bits and q["calibration"]["split"] == "calibration"
    assert 0 < q["storage_bits_per_weight"] < bits + 1.5
    from edge.export.quant.rtn import quantize_rtn

    with torch.no_grad():
        for name, p in model.named_parameters():
            if name in captured:
                p.copy_(torch.from_numpy(captured[name].dequantize()))
            elif name == "model.embed_tokens.weight":  # tied: embedding and head are RTN int4
                p.copy_(torch.from_numpy(quantize_rtn(p.detach().numpy(), 4, 32).dequantize()))
    ids = [int(t) for t in np.random.default_rng(0).integers(0, 96, 10)]
    logits = Decoder(package, context_length=32, threads=1).step(ids, logits_rows=list(range(10)))
    assert max_rel_error(logits, reference_logits(model, ids)) < 1e-4
