"""The calibration Hessian H = X^T X of a linear layer's inputs, and what the error-feedback methods derive from it.

tr((W - W') H (W - W')^T) is the squared error of the layer's outputs over the calibration inputs, the quantity
GPTQ, SpQR and decoupleQ minimise and the tests compare methods by.
"""

from __future__ import annotations

import numpy as np

from edge.export.quant import QuantizationError


class HessianAccumulator:
    """Running X^T X in float64 over batches of inputs (..., K), so calibration never holds all activations."""

    def __init__(self, k: int):
        self.h = np.zeros((k, k), dtype=np.float64)
        self.count = 0

    def add(self, x: np.ndarray) -> None:
        x = np.asarray(x, dtype=np.float32).reshape(-1, self.h.shape[0])
        self.h += (x.T @ x).astype(np.float64)  # float32 GEMM per batch, float64 sum across batches
        self.count += x.shape[0]

    def mean(self) -> np.ndarray:
        """X^T X / rows: the scale does not change any method's result, but keeps damping and thresholds comparable."""
        if self.count == 0:
            raise QuantizationError("no calibration inputs reached this layer")
        return self.h / self.count


def check_hessian(h: np.ndarray, k: int) -> np.ndarray:
    h = np.asarray(h, dtype=np.float64)
    if h.shape != (k, k):
        raise QuantizationError(f"Hessian has shape {h.shape}, expected {(k, k)} for a layer with {k} inputs")
    if not np.isfinite(h).all():
        raise QuantizationError("the Hessian contains NaN or infinity; the calibration forward pass overflowed")
    return h


def damped(h: np.ndarray, damp: float = 0.01) -> tuple[np.ndarray, np.ndarray]:
    """H + damp * mean(diag) * I, with never-seen inputs (zero diagonal) made harmless; returns (H, dead mask)."""
    h = np.array(h, dtype=np.float64)
    dead = np.diag(h) <= 0
    h[dead, dead] = 1.0
    diag_mean = float(np.mean(np.diag(h)))
    h[np.diag_indices_from(h)] += damp * diag_mean
    return h, dead


def inverse_cholesky(h: np.ndarray) -> np.ndarray:
    """Upper U with H^-1 = U^T U; row i of U is what GPTQ spreads column i's error over the later columns with."""
    try:
        hinv = np.linalg.inv(h)
        return np.linalg.cholesky(hinv).T
    except np.linalg.LinAlgError as exc:
        raise QuantizationError("the damped Hessian is not positive definite; raise the damping") from exc


def weighted_error(w: np.ndarray, w_hat: np.ndarray, h: np.ndarray) -> np.ndarray:
    """Per-row (w - w_hat)^T H (w - w_hat)."""
    e = (np.asarray(w, np.float64) - np.asarray(w_hat, np.float64))
    return np.einsum("nk,nk->n", e @ h, e)
