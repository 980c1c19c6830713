"""Llama-family models (Flax NNX), their loaders and the attention dispatch."""
