"""The network: Llama-family decoder modules (Flax NNX), their layers, the attention dispatch and the architecture
registry. Weights and their file formats are jaxinfer/weights/."""
