"""jaxinfer: a small, fast LLM inference engine on JAX/XLA.

    import jaxinfer
    llm = jaxinfer.LLM()                                   # default: SmolLM2-135M-Instruct
    out = llm.generate(["Hello"], jaxinfer.SamplingParams(max_tokens=32))
    print(out[0].outputs[0].text)
"""
from jaxinfer.api import LLM, generate
from jaxinfer.config import EngineConfig, SpeculativeConfig
from jaxinfer.outputs import CompletionOutput, Logprob, RequestOutput
from jaxinfer.sampling_params import SamplingParams

__all__ = ["LLM", "generate", "SamplingParams", "RequestOutput", "CompletionOutput", "Logprob", "EngineConfig",
           "SpeculativeConfig"]
__version__ = "0.1.0"
