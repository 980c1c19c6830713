"""jaxinfer: a small, fast LLM inference engine on JAX/XLA.

    import jaxinfer
    llm = jaxinfer.LLM()                                   # default: SmolLM2-135M-Instruct
    out = llm.generate(["Hello"], jaxinfer.SamplingParams(max_tokens=32))
    print(out[0].outputs[0].text)
"""
from jaxinfer.runner import xla_env as _xla_env

_xla_env.configure()  # before jax starts a backend: GPU command-buffer settings (runner/xla_env.py)

from jaxinfer.api import LLM, generate  # noqa: E402
from jaxinfer.config import EngineConfig, SpeculativeConfig  # noqa: E402
from jaxinfer.outputs import CompletionOutput, Logprob, RequestOutput  # noqa: E402
from jaxinfer.sampling_params import RequestOutputKind, SamplingParams  # noqa: E402

__all__ = ["LLM", "generate", "SamplingParams", "RequestOutputKind", "RequestOutput", "CompletionOutput", "Logprob",
           "EngineConfig", "SpeculativeConfig"]
__version__ = "0.1.0"
