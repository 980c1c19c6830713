"""Which quantized matmul runs: per model backend, and per step size M at trace time.

Each engine bucket is traced with a static token count M (the x passed to a QuantLinear is [M, K]), so picking
the implementation by M here is a compile-time choice per bucket, with no runtime branching.

Model backends (the `quantized_matmul` option after quant.resolve_backend) and their weight layouts
(pallas_kernels/quantized_matmul/reference.py):
  'reference'                jnp float32 reference (the CPU default)                    int8 [K, N] / int4 packed
  'pallas' | 'pallas-interpret'  the Pallas-Triton kernel at every M                    int8 [K, N] / int4 packed
  'xla'                      XLA dequantize + dot at every M                            int8 [K, N] / int4 packed
  'w8a8'                     int8 only: W8A8 through XLA's int8 dot at every M (activations quantized per token:
                             different numerics from weight-only int8)                  int8 [K, N]
  'xla-nk'                   int8 only: int8 [N, K] weights (K contiguous, like fp8's); the formulation per weight
                             size and M from PATHS[('int8', 'xla-nk')] (weights of fewer than LARGE_WEIGHT
                             elements) / PATHS[('int8', 'xla-nk', 'large')]           int8 [N, K]
  'xla-int4'                 int4 only: XLA-native int4 [K, N] (packed s4) weights; the formulation per M from
                             PATHS[('int4', 'xla-int4')]                                int4 native
  'triton-int4'              int4 only (the int4-g128 default on other GPUs and under TP / DP): packed uint8
                             [N, K/2] weights (K contiguous; same nibble order); the small-M kernel at M <= 16, XLA
                             dequantize + dot above (PATHS[('int4', 'triton-int4')])
                                                                                        int4 packed-nk
  'mosaic-int8'              int8 only, opt-in (measured slower than 'xla-nk'): 'xla-nk''s int8 [N, K] weights
                             and table, the Mosaic GPU int8 kernel (mosaic_int8.py) at M <= 16 on Hopper
                                                                                        int8 [N, K]
  'xla-nk-w8a8'              int8 only, opt-in: 'xla-nk''s int8 [N, K] weights, the small-M kernel at M <= 16 and
                             W8A8 (XLA's int8 dot, activations quantized per token) above   int8 [N, K]
  'mosaic-int4'              int4 group 128 only (the default on one Hopper GPU): signed int4 [N, K] weights (K
                             contiguous); Mosaic GPU tensor-core kernels on a Hopper GPU: mosaic_int4.py at M <=
                             128, mosaic_int4_wide.py above (PATHS[('int4', 'mosaic-int4')])  int4 native-nk
  'mosaic-int4-w4a8'         int4 only, opt-in: 'mosaic-int4''s weights and kernels below W4A8_MIN_TOKENS, W4A8 through
                             XLA's fp8 dot from it (xla_fused.int4_native_nk_w4a8_xla: the weights rounded to e4m3
                             per output channel once a step, the activations per token)    int4 native-nk
  'auto'                     resolves to GPU_DEFAULT[method] on GPU (int8: 'xla-nk', int4-g128: 'triton-int4'; on
                             one Hopper GPU int4-g128: HOPPER_INT4_DEFAULT, 'mosaic-int4');
                             PATHS[(method, 'auto')] picks
                             per M among the paths of the int8 [K, N] / int4 packed layout for 'auto' itself
PATHS[(method, backend)] = ((max_m, path), ...): the first row with M <= max_m is used. The defaults reproduce the
behaviour before the table (the Pallas kernel at every M); fill the table from the "suggested table" lines that
benchmarks/kernels/quantized_matmul.py prints on the GPU. GPU_DEFAULT[method] is the backend `auto` resolves to
on GPU. Under tensor parallelism a layer's kernels=False turns the small-M kernel paths into their XLA fallbacks
(path_for), since XLA's partitioner would gather a pallas_call's weights whole onto every device.
"""
from __future__ import annotations

from pallas_kernels.quantized_matmul import kernel as qmm_kernel
from pallas_kernels.quantized_matmul import kernel_nk as qmm_kernel_nk
from pallas_kernels.quantized_matmul import mosaic_int4 as qmm_mosaic
from pallas_kernels.quantized_matmul import mosaic_int4_wide as qmm_mosaic_wide
from pallas_kernels.quantized_matmul import mosaic_int8 as qmm_mosaic8
from pallas_kernels.quantized_matmul import reference as qmm_ref
from pallas_kernels.quantized_matmul import triton_small_m as qmm_triton
from pallas_kernels.quantized_matmul import xla as qmm_xla
from pallas_kernels.quantized_matmul import xla_fused as qmm_fused

ANY_M = 1 << 30
W4A8_MIN_TOKENS = 2048  # 'mosaic-int4-w4a8': steps of at least this many tokens run W4A8 (PATHS below)
PATHS = {
    # H200 sweep 2026-12-02 (results/kernel-quantized-matmul-2026-12-02.json, 8B shapes, geomean vs bf16): XLA's
    # dequantize + dot 1.02x at M=1, 1.15x at M=16, 0.75x at M=256 (the Pallas kernel 0.59x there): XLA at every M.
    # int4: the Pallas kernel stays (0.97x / 0.93x / 0.37x; the native-int4 XLA forms were slower).
    ("int8", "auto"): ((ANY_M, "xla"),),
    ("int4", "auto"): ((ANY_M, "pallas"),),
    ("int4", "xla-int4"): ((16, "int4-grouped"), (ANY_M, "int4-dequant")),
    # int8 [N, K] (results/kernel-quantized-matmul-nk-2026-12-02.json, geomean speed-up vs bf16 at M = 1 / 16 / 2048):
    # small weights convert 1.11 / 1.10 / 0.84 (mixed 1.06 / 0.81 / 0.51), large convert 1.32 / 1.44 / 0.85 (mixed
    # 1.34 / 1.06 / 0.51); the [K, N] convert ('xla') 1.07 / 1.11 / 0.84. In the engine (step_profile decode-b1,
    # M = 16): 4.02 ms per step against 4.39 ms for 'xla' and 4.91 ms for bf16, so 'xla-nk' is the int8 default.
    # W8A8 (w8a8-nk) is the fastest form on the large weights (1.79 / 1.45 / 1.45) but rounds the activations:
    # +3.2% perplexity on SmolLM2 with W8A8 everywhere (results/quality-w8a8-cpu-2026-12-02.json; weight-only int8
    # +0.05%, the int8 bound +1%), so this weight-only backend does not use it ('w8a8' does, on [K, N] weights).
    # At M <= 16 the small-M kernel below wins on the small weights too (kernel_nk, results/kernel-int8-nk-pallas-
    # 999c7de-2026-12-03.json, M = 1 / 16: qkv 16.2 / 17.2 us vs XLA's 21.0 / 20.4, o 14.5 / 14.6 vs 17.0 / 14.5).
    ("int8", "xla-nk"): ((16, "pallas-nk"), (ANY_M, "convert-nk")),
    # The small-M kernel (kernel_nk.py, the Pallas-Triton form of triton_small_m.py) at M <= 16 on the large
    # weights. Per op on the H200 against XLA's convert-nk (results/kernel-int8-nk-pallas-999c7de-2026-12-03.json,
    # M = 1): gate_up 48.3 vs 69.9 us, down 26.1 vs 35.2, lm_head 161 vs 212; in the engine the batch-1 int8 step
    # went from 3.88 to 3.17 ms. The same kernel through jax-triton ('triton-nk') was as fast per op on the large
    # weights but made the engine's step slower (5.25 vs 3.89 ms), hence the Pallas port. Where the kernel
    # cannot run it falls back to convert-nk (path_for).
    ("int8", "xla-nk", "large"): ((16, "pallas-nk"), (ANY_M, "convert-nk")),
    # int4 on [N, K/2] packed weights ('triton-int4', the GPU int4 default): the small-M kernel at M <= 16, XLA
    # dequantize + dot above. Its jax-triton form ('triton-int4-nk') decoded batch 1 at 90.8 tok/s against 182.1
    # for 'auto' (results/quantized-decode-jax-triton-76be10a-2026-12-03.json); the Pallas port ('pallas-int4-nk')
    # at 255.9 against 198.7 (results/quantized-decode-pallas-nk-e29a522-2026-12-03.log).
    ("int4", "triton-int4"): ((16, "pallas-int4-nk"), (ANY_M, "xla-packed-nk")),
    # int4 on signed int4 [N, K] weights ('mosaic-int4'): the Mosaic GPU tensor-core kernel up to its MAX_M = 128
    # tokens, XLA's dequantize + dot above. M = 1 (H200, results/kernel-quantized-matmul-mosaic-int4-22841b2-
    # 2026-12-04.json): gate_up 36.7 us vs 54.8 for 'pallas-int4-nk' and 76.1 for the bf16 dot, down 21-31 vs
    # 35.9 / 39.9, qkv 14.5 vs 20.2 / 22.5, o 11-13 vs 15.5 / 21.6. M = 32 / 64 / 128 (H100, results/kernel-quantized-
    # matmul-int4-large-m-29a3906-2026-12-05.json, us a call, kernel / XLA dequantize + dot / bf16 dot): gate_up
    # 43.6 / 123.8 / 96.8, 61.7 / 143.9 / 89.9, 130.7 / 208.4 / 103.7; down 25.5 / 70.3 / 48.3, 32.0 / 80.4 / 55.6,
    # 60.9 / 110.0 / 55.4; qkv 15.9 / 31.9 / 25.7, 27.8 / 36.4 / 27.5, 48.0 / 50.5 / 31.0; o 15.8 / 22.8 / 19.0,
    # 19.1 / 26.1 / 20.2, 31.9 / 34.2 / 22.9; lm_head 155 / 1006 / 370, 216 / 1025 / 376, 412 / 1050 / 380. The
    # kernel beats the XLA path on every shape at every M measured (1.05-6.5x); at M = 128 it was 0.65-0.92x the bf16
    # dot (which the int4 model does not have), 0.86-1.07x with the large-M split (mosaic_int4.LARGE_M_TARGET_CTAS).
    # Above 128 tokens (2026-12-05 c) the many-token Mosaic kernel (mosaic_int4_wide.py: scales applied to the
    # weight tile in registers, one accumulator) instead of XLA's dequantize + dot, which writes and re-reads the
    # whole bf16 weight. Per layer (gate_up + down + qkv + o, H100, fc17463, results/kernel-quantized-matmul-int4-
    # wide-fc17463-2026-12-05.json, us; kernel / XLA / bf16 dot): M = 256 273 / 558 / 284, M = 512 506 / 685 / 422,
    # M = 2048 1,546 / 1,661 / 1,449: faster than XLA's form on every shape, still 0.83-0.94x the bf16 dot from 512.
    # From 17 tokens too (2026-12-05 d, H100, 2f9142a, results/kernel-quantized-matmul-int4-small-m-2f9142a-2026-12-05
    # .json, the layer's four projections summed, us, mosaic_int4.py / this kernel): M = 16 86.1 / 81.7 (mixed by
    # shape: gate_up 36.6 / 38.5), M = 32 97.7 / 86.1, M = 64 117.2 / 113.8, M = 128 202.2 / 153.7 (bf16 dot 197.1).
    ("int4", "mosaic-int4"): ((16, "mosaic-int4-nk"), (ANY_M, "mosaic-int4-wide-nk")),
    # int8 [N, K] ('mosaic-int8', opt-in): 'xla-nk' with the Mosaic GPU int8 kernel (mosaic_int8.py) in place of the
    # Pallas-Triton one at M <= 16. Measured and not adopted (H100, 29a3906, results/quantized-decode-mosaic-int8-
    # 2026-12-05.json): batch 1 225.8 tok/s against 250.7 for 'xla-nk', batch 16 3,093 against 3,817; per op at
    # M = 1 / 16 it ties or trails 'pallas-nk' (gate_up 57.7 vs 57.5 us, down 31.4 vs 30.1, lm_head 216 vs 204).
    ("int8", "mosaic-int8"): ((16, "mosaic-nk"), (ANY_M, "convert-nk")),
    # int8 [N, K] ('xla-nk-w8a8', opt-in): 'xla-nk' at M <= 16, XLA's int8 x int8 dot above, activations quantized
    # per token. Offline int8 runs at 0.77-0.80x bf16 weight-only (convert + dot above 16 tokens: the int8 weight
    # read, converted and re-read as bf16), where W8A8 on the [N, K] weights measured 1.43-1.47x the bf16 dot per op
    # at M = 2048 (H200, results/kernel-quantized-matmul-nk-2026-12-02.json) and W8A8 on the large weights ran
    # offline at 1.11x bf16 in the engine (12-02). W8A8 everywhere cost +2.6-3.2% perplexity on SmolLM2 (bound +1%);
    # with SmoothQuant's scales folded into the weights (weights/smoothquant.py, alpha 0.5) W8A8 measured
    # +0.85% (results/quality-w8a8-smoothquant-cpu-2026-12-06.json; only at 0.5: 0.45 / 0.55 gave +2.05 / +1.09%).
    # In the engine (H100, 8B shape, results/quantized-decode-w8a8b-6d706d2-2026-12-06.json): offline 384 x 512/128
    # 1.08x bf16 (weight-only 'xla-nk' 0.83x). W8A8 at M <= 16 too (probes/w8a8_decode.py) decoded batch 1 at 1.30x
    # bf16 against the kernel's 1.45x (results/quantized-decode-w8a8-all-m-20f692a-2026-12-06.json), hence the split.
    # The default for SmoothQuant-smoothed checkpoints (config.smoothed_checkpoint_spec).
    ("int8", "xla-nk-w8a8"): ((16, "pallas-nk"), (ANY_M, "w8a8-nk")),
    # fp8 e4m3 [N, K] ('xla', the GPU default): weight-only through the int8 small-M kernel at M <= 16 (e4m3 -> bf16
    # in registers; the activations are not rounded to e4m3), W8A8 through XLA's fp8 dot above. Batch-1 step on an
    # H100 (12-07 h, probes/step_profile.py --shapes decode-b1 --quantization fp8, device time a step): 4.84 ms with
    # the fp8 dot at every M (its activation quantization: 74 reductions and 66 converts a step), 4.68 ms with this
    # table (results/step-profile-fp8-b1{,-nk}-*-2026-12-07.json); bf16 5.91 ms.
    ("fp8", "xla"): ((16, "pallas-nk"), (ANY_M, "xla")),
    # int4 native-nk ('mosaic-int4-w4a8', opt-in): W4A8 from W4A8_MIN_TOKENS. Why (issue 20's offline int4 >= 1.0x
    # bf16): the many-token Mosaic kernel stays at 0.83-0.94x the bf16 dot from 512 tokens (above), offline 0.87x
    # bf16 (H200, 12-05 d), two designs of it short; the fp8 dot at M = 2,048 is 1.72x the bf16 dot per layer (H100,
    # 12-07 h, results/kernel-quantized-matmul-fp8out-e7c792b-2026-12-07.json: 827 vs 1,423 us) and the int4 -> e4m3
    # pass reads ~3.5 GB and writes ~7 GB a step on the 8B shape (~3 ms at the H100's bandwidth, an estimate), so
    # it can pay only in steps of many tokens. Per op (H100, 12-07 j, results/kernel-quantized-matmul-w4a8-10dde75-
    # 2026-12-07.json), x the bf16 dot: M = 2,048 W4A8 1.17-1.61x (the Mosaic kernel 0.90-0.99x), M = 512 W4A8
    # 0.71-0.83x (Mosaic 0.80-1.01x): hence from 2,048 tokens (512 before; 1,024 not measured). Quality (SmolLM2-135M,
    # CPU, benchmarks/quality.py, steps of 512 tokens: W4A8 on every prompt chunk): perplexity 42.12 against 38.26
    # for weight-only int4-g64 RTN (+10.1%; bf16 23.77; fp8 W8A8 costs +2.7% over bf16), results/quality-w4a8{,-base}-
    # 1949b45-cpu-2026-12-07.json: hence opt-in.
    ("int4", "mosaic-int4-w4a8"): ((16, "mosaic-int4-nk"), (W4A8_MIN_TOKENS - 1, "mosaic-int4-wide-nk"),
                                   (ANY_M, "w4a8-nk")),
}
# Weights of at least this many elements take the 'large' table: 32M int8 weights are 32 MB, so past it a weight
# no longer sits in the 50 MB L2 beside the activations (the 8B shapes: qkv 25M and o 17M below, down 59M,
# gate_up 117M and lm_head 525M above), and the per-token activation quantization (one small fusion) is worth
# the int8 GEMM's bandwidth.
LARGE_WEIGHT = 32 << 20
# int4 'triton-int4' (results/quantized-decode-pallas-nk-e29a522-2026-12-03.log, 8B shape, H200): batch 1 255.9 tok/s
# against 198.7 for 'auto' (the [K/2, N] Pallas kernel) and 233.2 for bf16; batch 16 3,287 against 3,025 and 3,404.
GPU_DEFAULT = {"int8": "xla-nk", "int4": "triton-int4", "fp8": "xla"}
# int4 group 128 on ONE Hopper GPU (models/quant_linear.resolve_backend): the Mosaic GPU kernel. In the engine on the
# H200, one process (results/quantized-decode-mosaic-int4-2026-12-05.json, 8B shape, int8 LM head): batch-1 median
# step 3.62 ms against 4.36 for 'triton-int4' and 4.27 for bf16 (1.12x bf16 vs 0.97x), batch 16 3,822 tok/s against
# 3,265 and 3,382 (1.13x vs 0.97x); offline 384 x 512/128 4,487 output tok/s = 0.74x bf16 ('triton-int4' 0.59x on
# 12-03). Elsewhere (other GPUs, tensor / data parallelism: its native int4 layout is single-device) GPU_DEFAULT.
HOPPER_INT4_DEFAULT = "mosaic-int4"
# int4 group sizes that take GPU_DEFAULT['int4']: the small-M kernel's tensor-core form (M = 2..16) needs g = 128,
# and below it the [N, K/2] layout would fall back to XLA's dequantize + dot (4.5x the bf16 dot at M = 16), so
# other group sizes (GGUF Q4_0 / Q4_1's 32, int4-g64) keep 'auto', the [K/2, N] Pallas kernel at every M.
GPU_INT4_DEFAULT_GROUPS = (128,)

# Paths each weight layout can run (a table row naming another layout's path is an error, check_tables).
LAYOUT_PATHS = {
    ("int8", "kn"): ("reference", "pallas", "pallas-interpret", "xla", "xla-mixed", "w8a8"),
    ("int8", "nk"): ("reference-nk", "convert-nk", "mixed-nk", "w8a8-nk", "triton-nk", "pallas-nk", "mosaic-nk"),
    ("int4", "packed"): ("reference", "pallas", "pallas-interpret", "xla"),
    ("int4", "native"): ("reference-native", "int4-dequant", "int4-grouped", "int4-grouped-mixed"),
    ("int4", "packed-nk"): ("reference-packed-nk", "xla-packed-nk", "triton-int4-nk", "pallas-int4-nk"),
    ("int4", "native-nk"): ("reference-native-nk", "int4-dequant-nk", "mosaic-int4-nk", "mosaic-int4-wide-nk",
                            "w4a8-nk"),
    ("fp8", "nk"): ("reference", "xla", "pallas-nk"),
}
# A small-M kernel path where its kernel cannot run (`kernel_runs`) becomes this one.
KERNEL_FALLBACK = {"triton-nk": "convert-nk", "triton-int4-nk": "xla-packed-nk", "pallas-nk": "convert-nk",
                   "pallas-int4-nk": "xla-packed-nk", "mosaic-int4-nk": "int4-dequant-nk", "mosaic-nk": "convert-nk",
                   "mosaic-int4-wide-nk": "int4-dequant-nk"}


def kernel_runs(path: str, M: int, K: int | None, N: int | None, group_size: int | None = None) -> bool:
    """Whether a KERNEL_FALLBACK path's kernel runs for this call: a GPU backend, JAXINFER_TRITON not "0" (the
    escape hatch, and the benchmarks' switch for the XLA peer), jax-triton for the 'triton-*' paths, and a shape
    the Pallas kernel takes for the 'pallas-*' ones."""
    if path.startswith("triton-"):
        return qmm_triton.usable()
    if K is None or N is None or not qmm_triton.kernels_enabled():
        return False
    if path == "mosaic-int4-nk":
        return qmm_mosaic.usable() and qmm_mosaic.supports(M, K, N, group_size)
    if path == "mosaic-int4-wide-nk":
        return qmm_mosaic_wide.usable() and qmm_mosaic_wide.supports(M, K, N, group_size)
    if path == "mosaic-nk":
        return qmm_mosaic8.usable() and qmm_mosaic8.supports(M, K, N)
    if path == "pallas-int4-nk":
        return qmm_kernel_nk.int4_supports(M, K, N, group_size, qmm_kernel_nk.int4_config_for(M, K, N, group_size))
    return qmm_kernel_nk.supports(K, N, qmm_kernel_nk.config_for(M, K, N))


def weight_layout_of(method: str, backend: str) -> str:
    """The device layout a resolved model backend runs on: int4 'native' for 'xla-int4', else int4 'packed';
    int8 'nk' for 'xla-nk', else 'kn'; fp8 'nk' (e4m3 [N, K])."""
    if method == "int4":
        return {"xla-int4": "native", "triton-int4": "packed-nk", "mosaic-int4": "native-nk",
                "mosaic-int4-w4a8": "native-nk"}.get(backend, "packed")
    if method == "int8":
        return "nk" if backend in ("xla-nk", "mosaic-int8", "xla-nk-w8a8") else "kn"
    return "nk"


def path_for(method: str, backend: str, M: int, K: int | None = None, N: int | None = None,
             group_size: int | None = None, kernels: bool = True) -> str:
    """The implementation for one call: `backend` is the model's resolved backend, M the static token count.
    A 'pallas' pick for a shape the kernel does not take (K, N given) becomes 'xla'. kernels=False (a layer
    under tensor parallelism, where XLA's partitioner would gather a pallas_call's weights whole onto every
    device) turns every KERNEL_FALLBACK path into its XLA fallback."""
    if method == "fp8":
        if backend == "reference":
            return "reference"
        path = _lookup(PATHS[("fp8", "xla")], M)
        return path if path != "pallas-nk" or (kernels and kernel_runs(path, M, K, N)) else "xla"
    if backend in ("xla-int4", "triton-int4", "mosaic-int4", "mosaic-int4-w4a8"):
        path = _lookup(PATHS[("int4", backend)], M)
    elif backend in ("mosaic-int8", "xla-nk-w8a8"):
        path = _lookup(PATHS[("int8", backend)], M)
    elif backend == "xla-nk":
        large = K is not None and N is not None and K * N >= LARGE_WEIGHT
        path = _lookup(PATHS[("int8", "xla-nk", "large") if large else ("int8", "xla-nk")], M)
    elif backend == "auto":
        path = _lookup(PATHS[(method, "auto")], M)
    elif backend == "reference" and method == "int4":
        path = "reference"
    else:
        path = backend
    if path == "pallas" and K is not None and not qmm_kernel.supports(method, K, N, group_size):
        path = "xla"
    if path in KERNEL_FALLBACK and not (kernels and kernel_runs(path, M, K, N, group_size)):
        path = KERNEL_FALLBACK[path]
    return path


def _lookup(rows, M: int) -> str:
    for max_m, path in rows:
        if M <= max_m:
            return path
    raise ValueError(f"quantized matmul path table {rows} has no row for M={M}; end it with ANY_M")


def check_tables():
    """Every table row names a path of its backend's layout, and ends with an ANY_M row (ValueError if not)."""
    for (method, backend, *_), rows in PATHS.items():
        allowed = LAYOUT_PATHS[(method, weight_layout_of(method, backend))]
        bad = [p for _, p in rows if p not in allowed]
        if bad:
            raise ValueError(f"PATHS[{(method, backend, *_)}] names {bad}, not paths of the {method} "
                             f"{weight_layout_of(method, backend)} layout {allowed}")
        if rows[-1][0] < ANY_M or list(rows) != sorted(rows):
            raise ValueError(f"PATHS[{(method, backend, *_)}] must be sorted by max_m and end with ANY_M, got {rows}")


def quantized_matmul(x, method: str, q, scale, offset=None, *, group_size=None, backend="reference",
                     out_dtype=None, kernels: bool = True):
    """One entry point over every implementation (see the module docstring); x [..., K] -> [..., N].
    kernels: whether the small-M kernel paths may run (path_for)."""
    M = x.size // x.shape[-1]
    K = x.shape[-1]
    nk = method == "fp8" or weight_layout_of(method, backend) in ("nk", "packed-nk", "native-nk")
    N = q.shape[0] if nk else q.shape[-1]
    path = path_for(method, backend, M, K, N, group_size, kernels)
    if method == "fp8":
        if path == "pallas-nk":  # weight-only: the e4m3 weights through the int8 small-M kernel
            return qmm_kernel_nk.int8_matmul_nk(x, q, scale, out_dtype=out_dtype)
        fn = qmm_ref.fp8_matmul_reference if path == "reference" else qmm_xla.fp8_matmul_xla
        return fn(x, q, scale, out_dtype=out_dtype)
    if method == "int8" and nk:
        if path == "reference-nk":
            return qmm_ref.int8_matmul_reference(x, q.T, scale, out_dtype=out_dtype)
        if path == "triton-nk":
            return qmm_triton.int8_matmul_nk(x, q, scale, out_dtype=out_dtype)
        if path == "pallas-nk":
            return qmm_kernel_nk.int8_matmul_nk(x, q, scale, out_dtype=out_dtype)
        if path == "mosaic-nk":
            return qmm_mosaic8.int8_matmul_mosaic(x, q, scale, out_dtype=out_dtype)
        if path in ("convert-nk", "mixed-nk", "w8a8-nk"):
            fn = {"convert-nk": qmm_fused.int8_convert_xla, "mixed-nk": qmm_fused.int8_mixed_xla,
                  "w8a8-nk": qmm_fused.int8_w8a8_xla}[path]
            return fn(x, q, scale, layout="nk", out_dtype=out_dtype)
    elif method == "int8":
        if path == "reference":
            return qmm_ref.int8_matmul_reference(x, q, scale, out_dtype=out_dtype)
        if path == "xla":
            return qmm_xla.int8_matmul_xla(x, q, scale, out_dtype=out_dtype)
        if path == "xla-mixed":
            return qmm_fused.int8_mixed_xla(x, q, scale, out_dtype=out_dtype)
        if path == "w8a8":
            return qmm_fused.int8_w8a8_xla(x, q, scale, out_dtype=out_dtype)
        if path in ("pallas", "pallas-interpret"):
            return qmm_kernel.int8_matmul(x, q, scale, out_dtype=out_dtype, interpret=path == "pallas-interpret")
    elif method == "int4" and weight_layout_of("int4", backend) == "native":
        if path == "reference-native":
            return qmm_ref.int4_native_matmul_reference(x, q, scale, offset, group_size=group_size,
                                                        out_dtype=out_dtype)
        if path == "int4-dequant":
            return qmm_fused.int4_native_dequant_xla(x, q, scale, offset, group_size=group_size,
                                                     out_dtype=out_dtype)
        if path in ("int4-grouped", "int4-grouped-mixed"):
            return qmm_fused.int4_native_grouped_xla(x, q, scale, offset, group_size=group_size,
                                                     out_dtype=out_dtype, mixed=path == "int4-grouped-mixed")
    elif method == "int4" and weight_layout_of("int4", backend) == "native-nk":
        if path == "reference-native-nk":
            return qmm_ref.int4_native_matmul_reference(x, q.T, scale, offset, group_size=group_size,
                                                        out_dtype=out_dtype)
        if path == "int4-dequant-nk":
            return qmm_fused.int4_native_nk_dequant_xla(x, q, scale, offset, group_size=group_size,
                                                        out_dtype=out_dtype)
        if path == "mosaic-int4-nk":
            return qmm_mosaic.int4_matmul_mosaic(x, q, scale, offset, group_size=group_size, out_dtype=out_dtype)
        if path == "mosaic-int4-wide-nk":
            return qmm_mosaic_wide.int4_matmul_mosaic_wide(x, q, scale, offset, group_size=group_size,
                                                           out_dtype=out_dtype)
        if path == "w4a8-nk":
            return qmm_fused.int4_native_nk_w4a8_xla(x, q, scale, offset, group_size=group_size, out_dtype=out_dtype)
    elif method == "int4" and weight_layout_of("int4", backend) == "packed-nk":
        if path == "reference-packed-nk":
            return qmm_ref.int4_matmul_reference(x, q.T, scale, offset, group_size=group_size, out_dtype=out_dtype)
        if path == "xla-packed-nk":
            return qmm_xla.int4_matmul_xla_nk(x, q, scale, offset, group_size=group_size, out_dtype=out_dtype)
        if path == "triton-int4-nk":
            return qmm_triton.int4_matmul_nk(x, q, scale, offset, group_size=group_size, out_dtype=out_dtype)
        if path == "pallas-int4-nk":
            return qmm_kernel_nk.int4_matmul_nk(x, q, scale, offset, group_size=group_size, out_dtype=out_dtype)
    elif method == "int4":
        if path == "reference":
            return qmm_ref.int4_matmul_reference(x, q, scale, offset, group_size=group_size, out_dtype=out_dtype)
        if path == "xla":
            return qmm_xla.int4_matmul_xla(x, q, scale, offset, group_size=group_size, out_dtype=out_dtype)
        if path in ("pallas", "pallas-interpret"):
            return qmm_kernel.int4_matmul(x, q, scale, offset, group_size=group_size, out_dtype=out_dtype,
                                          interpret=path == "pallas-interpret")
    raise ValueError(f"no {method} quantized matmul path {path!r} for backend {backend!r}; the paths of each "
                     f"layout are {LAYOUT_PATHS}")


check_tables()
