"""Frozen, validated configuration dataclasses (no jax), one module per concern:

  model.py         ModelConfig, read from a Hugging Face config.json (or GGUF metadata); ConfigError
  quantization.py  what `quantization=` asks for: QuantSpec, KeepGGUFQuantization, parse_quantization
  engine.py        SpeculativeConfig and EngineConfig, made of one group per concern (load, scheduler, cache,
                   parallel, kernels, speculative) handed down whole to the part that reads it; field metadata
                   documents every option and the command-line flags are generated from it (cli_args.py)

Import from here: `from jaxinfer.config import EngineConfig`.
"""
from jaxinfer.config.model import (  # noqa: F401
    ConfigError, RopeScaling, ModelConfig)
from jaxinfer.config.quantization import (  # noqa: F401
    QUANT_METHODS, INT4_GROUP_SIZES, MATMUL_BACKENDS, QuantizationError, QuantSpec, KeepGGUFQuantization,
    parse_quantization, checkpoint_quantization, check_checkpoint_compatible)
from jaxinfer.config.engine import (  # noqa: F401
    SPEC_METHODS, SpeculativeConfig, DTYPES, LoadConfig, SchedulerConfig, CacheConfig, ParallelConfig,
    DistributedConfig, KernelConfig, GROUPS, EngineConfig)
