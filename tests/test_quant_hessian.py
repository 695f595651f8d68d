import numpy as np
import pytest

from edge.export.quant import QuantizationError
from edge.export.quant.hessian import HessianAccumulator, check_hessian, damped, inverse_cholesky, weighted_error


def test_accumulates_batches_like_one_matmul():
    rng = np.random.default_rng(0)
    xs = [rng.normal(size=(3, 5, 8)).astype(np.float32) for _ in range(4)]
    acc = HessianAccumulator(8)
    for x in xs:
        acc.add(x)
    flat = np.concatenate([x.reshape(-1, 8) for x in xs]).astype(np.float64)
    np.testing.assert_allclose(acc.mean(), flat.T @ flat / len(flat), rtol=1e-5, atol=1e-6)
    with pytest.raises(QuantizationError):
        HessianAccumulator(3).mean()


def test_inverse_cholesky_factor():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(100, 6))
    h, dead = damped(x.T @ x)
    u = inverse_cholesky(h)
    np.testing.assert_allclose(u.T @ u, np.linalg.inv(h), atol=1e-10)
    assert np.allclose(u, np.triu(u)) and not dead.any()


def test_weighted_error_is_output_error():
    rng = np.random.default_rng(2)
    x = rng.normal(size=(50, 6))
    w, w2 = rng.normal(size=(3, 6)), rng.normal(size=(3, 6))
    out = np.square(x @ w.T - x @ w2.T).sum(axis=0)
    np.testing.assert_allclose(weighted_error(w, w2, x.T @ x), out)


def test_bad_hessians():
    with pytest.raises(QuantizationError, match="shape"):
        check_hessian(np.eye(3), 4)
    with pytest.raises(QuantizationError, match="NaN"):
        check_hessian(np.full((2, 2), np.nan), 2)
