import numpy as np

from edge.export.evaluate import perplexity, token_nll
from edge.export.pipeline import export_model
from edge.package import load_package
from tiny_models import reference_logits, tiny_llama


def test_token_nll_is_minus_log_softmax():
    logits = np.array([[1.0, 2.0, 3.0], [0.0, 0.0, 0.0]])
    expected = [-np.log(np.exp(1) / np.exp([1, 2, 3]).sum()), np.log(3)]
    np.testing.assert_allclose(token_nll(logits, np.array([0, 2])), expected)


def test_perplexity_equals_the_reference_models(tmp_path):
    """Windows of 16 tokens, steps of 5 rows: the stitching must reproduce the reference NLL of every token."""
    model, imported = tiny_llama(seed=2)
    package = load_package(export_model("tiny", tmp_path / "p", quant="fp32", model=imported))
    ids = np.random.default_rng(0).integers(0, 96, 40)
    nll = []
    for start in range(0, 39, 16):
        window = [int(t) for t in ids[start:start + 16]]
        ref = reference_logits(model, window)
        nll.append(token_nll(ref[: len(window) - 1], np.array(window[1:])))
    expected = float(np.exp(np.concatenate(nll).mean()))
    assert abs(perplexity(package, ids, window=16, rows_per_step=5, threads=1) - expected) < 1e-4 * expected
