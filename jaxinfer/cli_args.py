"""Model and engine flags shared by `jaxinfer generate`, `jaxinfer serve` (serving/server.py) and the benchmarks.

add_model_args(parser) adds them; engine_kwargs(args) turns the parsed flags back into LLM(...) keywords;
init_distributed(args) joins a multi-host job from the parallelism flags.
"""
from __future__ import annotations

import argparse
import json


def add_model_args(p: argparse.ArgumentParser):
    p.add_argument("--model", default=None,
                   help="checkpoint dir, *.gguf file, hub id, or preset (with --load-format dummy); "
                        "default: SmolLM2-135M-Instruct")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])
    p.add_argument("--load-format", default="auto", choices=["auto", "dummy"])
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--num-pages", type=int, default=None)
    p.add_argument("--page-size", type=int, default=16)
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--max-num-batched-tokens", type=int, default=2048)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    p.add_argument("--quantization", default=None,
                   help="quantize weights on load: int8 | int4 | int4-g64 | int4-g32 | int4-asym | fp8 (W8A8); "
                        "gguf: keep a GGUF file's own Q4_0 / Q4_1 / Q4_K weights quantized")
    p.add_argument("--quantize-lm-head", action="store_true", help="quantize the LM head too (untied models)")
    par = p.add_argument_group("parallelism (README: several GPUs and hosts)")
    par.add_argument("--tensor-parallel-size", "-tp", type=int, default=1, help="devices one model is split over")
    par.add_argument("--data-parallel-size", "-dp", type=int, default=1,
                     help="model replicas on disjoint devices; requests go to the least-loaded one")
    par.add_argument("--coordinator-address", default=None,
                     help="multi-host: HOST:PORT of process 0 (env JAXINFER_COORDINATOR_ADDRESS)")
    par.add_argument("--num-processes", type=int, default=None, help="multi-host: env JAXINFER_NUM_PROCESSES")
    par.add_argument("--process-id", type=int, default=None, help="multi-host: env JAXINFER_PROCESS_ID")
    p.add_argument("--kv-cache-dtype", default="auto", choices=["auto", "fp8", "int8"],
                   help="KV cache storage: the model dtype, or fp8 / int8 with per-token scales (~2x the pages)")
    p.add_argument("--speculative-config", type=json.loads, default=None, metavar="JSON",
                   help='speculative decoding, e.g. \'{"method": "ngram", "num_speculative_tokens": 4}\' '
                        '(fields of jaxinfer.config.SpeculativeConfig)')


def engine_kwargs(a) -> dict:
    return dict(dtype=a.dtype, load_format=a.load_format, max_model_len=a.max_model_len, num_pages=a.num_pages,
                page_size=a.page_size, max_num_seqs=a.max_num_seqs,
                max_num_batched_tokens=a.max_num_batched_tokens, gpu_memory_utilization=a.gpu_memory_utilization,
                quantization=a.quantization, quantize_lm_head=a.quantize_lm_head,
                tensor_parallel_size=a.tensor_parallel_size, data_parallel_size=a.data_parallel_size,
                kv_cache_dtype=a.kv_cache_dtype, speculative_config=a.speculative_config)


def init_distributed(a) -> bool:
    """Join the multi-host job given by the flags or JAXINFER_* environment (no-op when neither is set)."""
    from jaxinfer.parallel import initialize_distributed

    return initialize_distributed(a.coordinator_address, a.num_processes, a.process_id)
