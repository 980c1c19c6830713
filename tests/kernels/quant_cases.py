"""Shared inputs and error measure of the quantized-matmul tests (CPU and GPU-marked)."""
import numpy as np


def rel_err(a, b) -> float:
    """||a - b|| / ||b|| in float64."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def outlier_weights(K, N, seed=0) -> np.ndarray:
    """f32[K, N] Gaussian weights with a few outlier columns (the case per-channel scales exist for)."""
    rng = np.random.default_rng(seed)
    w = rng.normal(size=(K, N)) * 0.05 * np.where(rng.random(N) < 0.1, 8.0, 1.0)[None, :]
    return w.astype(np.float32)
