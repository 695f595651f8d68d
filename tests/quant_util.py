"""Shared inputs for the quantization tests."""

import numpy as np


def correlated_hessian(k: int, seed: int, samples: int = 2048) -> np.ndarray:
    """X^T X of correlated inputs with unequal channel scales, like a real layer's (not the identity)."""
    rng = np.random.default_rng(seed)
    mix = rng.normal(size=(k, k)) / np.sqrt(k) + np.eye(k)
    x = (rng.normal(size=(samples, k)) @ mix) * np.exp(0.5 * rng.normal(size=k))
    return x.T @ x / len(x)
