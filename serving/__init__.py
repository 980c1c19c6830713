"""OpenAI-compatible HTTP serving for jaxinfer: `python -m serving` or `jaxinfer serve`."""
from serving.server import create_app, main

__all__ = ["create_app", "main"]
