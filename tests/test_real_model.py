"""End to end on the real default model (SmolLM2-135M-Instruct): exported logits against transformers' own GGUF
loader, and the `edge-run` command a new user types."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from edge.model import Decoder
from edge.package import load_package
from tiny_models import max_rel_error

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def fp32_package(smollm2, tmp_path_factory):
    from edge.export.pipeline import export_model

    return load_package(export_model("smollm2", tmp_path_factory.mktemp("real") / "fp32", quant="fp32",
                                     model=smollm2))


def test_fp32_logits_match_transformers_over_prompt_and_decode(fp32_package, hf_gguf_model, hf_gguf_tokenizer):
    import torch

    ids = hf_gguf_tokenizer("The three primary colours of light are red, green and").input_ids
    with torch.no_grad():
        full = hf_gguf_model.generate(torch.tensor([ids]), max_new_tokens=6, do_sample=False)[0].tolist()
        ref = hf_gguf_model(torch.tensor([full])).logits[0].numpy()
    decoder = Decoder(fp32_package, context_length=128, threads=2)
    n = len(ids)
    assert max_rel_error(decoder.step(ids, logits_rows=list(range(n))), ref[:n]) < 1e-4
    for t in range(n, len(full)):
        step = decoder.step([full[t]])[0]
        assert max_rel_error(step, ref[t]) < 1e-4
        if t + 1 < len(full):
            assert int(np.argmax(step)) == full[t + 1]


def test_edge_run_on_the_default_model_answers():
    """The README's first command: no model argument, so the default model is fetched and exported (cached)."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    result = subprocess.run(
        [sys.executable, "-m", "edge.apps.run", "What is the capital of France? Answer in one word.", "--stats",
         "-n", "16"], capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "Paris" in result.stdout
    assert "tok/s" in result.stderr and "peak RSS" in result.stderr


def test_edge_kernels_package_generates_the_same_tokens_as_stock_ops(smollm2, tmp_path):
    """Issue 6's check: int4 through edge.QMatMul vs the stock MatMulNBits package computing in fp32 (accuracy
    level 0; level 4 quantizes activations to int8 and so differs by design)."""
    from edge.engine import Engine
    from edge.export.pipeline import export_model
    from edge.kernels import library_path

    if library_path() is None:
        pytest.skip("kernel library not built")
    engines = [Engine(export_model("smollm2", tmp_path / name, quant="int4", model=smollm2, **kw),
                      context_length=256, threads=2)
               for name, kw in (("edge", dict(kernels="edge", head="rtn")),  # the stock graph's head: the table
                                ("stock", dict(accuracy_level=0)))]
    for prompt in ("Explain photosynthesis to a child.", "List three uses of copper."):
        messages = [{"role": "user", "content": prompt}]
        outputs = [e.generate(e.template.render(messages), max_tokens=32) for e in engines]
        assert outputs[0] == outputs[1], prompt


def test_speculation_on_edge_kernels_int4_is_identical_to_plain_greedy(smollm2, tmp_path):
    """Batch-invariant QMatMul makes int4 verification steps agree with 1-token steps, so speculative greedy output
    stays identical on quantized weights (the stock MatMulNBits int4 package fails this test on the JSON prompt)."""
    from edge.engine import Engine
    from edge.export.pipeline import export_model
    from edge.kernels import library_path
    from edge.speculative import make_speculator

    if library_path() is None:
        pytest.skip("kernel library not built")
    package = export_model("smollm2", tmp_path / "edge", quant="int4", model=smollm2, kernels="edge",
                           head="rtn")  # any head will do; this one needs no calibration pass
    plain, spec = (Engine(package, context_length=384, threads=2) for _ in range(2))
    spec.speculator = make_speculator("prompt-lookup", spec, None)
    accepted = 0
    for prompt in ("Fix the typos: Teh quick brwon fox jumpd over the lazzy dog and ran awya.",
                   "Repeat this sentence but replace cats with dogs: I love cats because cats are quiet.",
                   "Extract the names as JSON: Alice met Bob and Carol in Paris on Monday.",
                   "Write a Python function that returns the squares of a list of numbers."):
        text = plain.template.render([{"role": "user", "content": prompt}])
        assert spec.generate(text, max_tokens=40) == plain.generate(text, max_tokens=40), prompt
        accepted += spec.stats.speculative.accepted
    assert accepted > 0  # the drafts were really used, not switched off
