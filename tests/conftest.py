"""Test-wide settings: offline hub, a repo-local cache (default model + XLA cache)."""
import os

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("JAXINFER_CACHE", os.path.join(_REPO, ".cache"))
