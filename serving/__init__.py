"""OpenAI-compatible HTTP serving for jaxinfer: `python -m serving` or `jaxinfer serve`."""
from serving.cli import main
from serving.server import create_app

__all__ = ["create_app", "main"]
