"""Test helper: raw GGUF Q4_K super-blocks built byte by byte after llama.cpp's `block_q4_K` (gguf-py can read
Q4_K but cannot quantize to it), shared by the format-reader and the kept-quantized tests."""
import numpy as np


def q4_k_raw(rng, n_out: int, n_in: int, *, d_range=(0.001, 0.01), min_scale: int = 1) -> np.ndarray:
    """uint8 [n_out, n_in / 256 * 144] of random Q4_K super-blocks: f16 d and dmin (uniform in d_range), 12 bytes of
    6-bit (scale, min) pairs for the 8 sub-blocks (scales drawn from [min_scale, 64): 0 gives a constant sub-block),
    128 bytes of nibbles."""
    nb = n_in // 256
    d = rng.uniform(*d_range, (n_out, nb)).astype(np.float16)
    dmin = rng.uniform(*d_range, (n_out, nb)).astype(np.float16)
    sc = rng.integers(min_scale, 64, (n_out, nb, 8)).astype(np.uint8)
    mn = rng.integers(0, 64, (n_out, nb, 8)).astype(np.uint8)
    scales = np.zeros((n_out, nb, 12), np.uint8)
    scales[..., 0:4] = (sc[..., 0:4] & 63) | ((sc[..., 4:8] >> 4) << 6)
    scales[..., 4:8] = (mn[..., 0:4] & 63) | ((mn[..., 4:8] >> 4) << 6)
    scales[..., 8:12] = (sc[..., 4:8] & 0xF) | ((mn[..., 4:8] & 0xF) << 4)
    q = rng.integers(0, 16, (n_out, nb, 4, 2, 32)).astype(np.uint8)
    qs = (q[:, :, :, 0] | (q[:, :, :, 1] << 4)).reshape(n_out, nb, 128)
    return np.concatenate([d[..., None].view(np.uint8), dmin[..., None].view(np.uint8), scales, qs],
                          -1).reshape(n_out, -1)
