"""Model weights and their formats: safetensors / Hugging Face, GGUF, pre-quantized checkpoints, quantize-on-load,
AWQ, orbax checkpoints, the default model, dummy presets, a draft's head cut to the first token ids (head_cut.py).
The network itself is jaxinfer/models/."""
