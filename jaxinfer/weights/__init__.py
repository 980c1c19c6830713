"""Model weights and their formats: safetensors / Hugging Face, GGUF, pre-quantized checkpoints, quantize-on-load,
AWQ, orbax checkpoints, the default model, dummy presets. The network itself is jaxinfer/models/."""
