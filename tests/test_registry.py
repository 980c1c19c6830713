"""The architecture registry (models/registry.py) is the one table of what runs: the loader builds the module it
names, and the config check accepts exactly its architectures and model types."""
import pytest

from jaxinfer.config import ConfigError
from jaxinfer.models import registry
from jaxinfer.models.llama import LlamaForCausalLM
from jaxinfer.weights.loader import load_model, resolve_model
from jaxinfer.weights.presets import preset_config


def test_every_hf_architecture_resolves_to_its_entry():
    for name, arch in registry.ARCHITECTURES.items():
        hf = {**preset_config("tiny-llama"), "model_type": arch.model_type, "architectures": [name]}
        got, cfg = registry.model_config(hf)
        assert got is arch and got.module is LlamaForCausalLM and cfg.model_type == arch.model_type
    assert registry.SUPPORTED_MODEL_TYPES == ("llama", "mistral", "qwen2", "qwen3")
    # without an "architectures" list: the entry of the model_type
    hf = {k: v for k, v in preset_config("tiny-llama").items() if k != "architectures"}
    assert registry.architecture({**hf, "model_type": "qwen3"}).name == "Qwen3ForCausalLM"


@pytest.mark.parametrize("change, message", [
    ({"architectures": ["GPT2LMHeadModel"]}, r"unsupported architecture 'GPT2LMHeadModel'; jaxinfer supports \["),
    ({"model_type": "gpt2"}, r"unsupported model_type 'gpt2'.*jaxinfer supports llama, mistral, qwen2, qwen3"),
])
def test_unknown_families_are_named(change, message):
    with pytest.raises(ConfigError, match=message):
        registry.model_config({**preset_config("tiny-llama"), **change})


def test_loader_builds_the_module_the_registry_names(monkeypatch):
    class Marked(LlamaForCausalLM):
        pass

    entry = registry.ARCHITECTURES["LlamaForCausalLM"]
    monkeypatch.setitem(registry.ARCHITECTURES, "LlamaForCausalLM",
                        registry.Architecture(entry.name, entry.model_type, Marked, entry.weights))
    loaded = load_model(resolve_model("tiny-llama", "dummy"), "float32", progress=False)
    assert type(loaded.module()) is Marked
