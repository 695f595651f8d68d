import numpy as np
import pytest

from edge.export.quant import QuantizationError
from edge.export.quant.outliers import SparseOutliers


def test_csr_round_trip_and_matmul():
    rng = np.random.default_rng(0)
    mask = rng.random((6, 10)) < 0.2
    delta = rng.normal(size=(6, 10)).astype(np.float32)
    sp = SparseOutliers.from_dense(mask, delta)
    assert sp.row_ptr.dtype == np.int32 and sp.col.dtype == np.int32 and sp.values.dtype == np.float16
    assert sp.nnz == mask.sum() and sp.row_ptr[-1] == sp.nnz
    dense = np.where(mask, delta, 0).astype(np.float16).astype(np.float32)
    np.testing.assert_array_equal(sp.to_dense(), dense)
    x = rng.normal(size=(2, 3, 10)).astype(np.float32)
    np.testing.assert_allclose(sp.matmul(x), x @ dense.T, atol=1e-5)


def test_malformed():
    with pytest.raises(QuantizationError):
        SparseOutliers(np.zeros(3, np.int32), np.zeros(1, np.int32), np.zeros(2, np.float16), (4, 4))
