"""One configuration route: grouped, frozen config objects (jaxinfer/config/), flat keywords routed to their group
(EngineConfig.from_options, what LLM(**options) uses), and command-line flags generated from the same fields
(cli_args.py) for `jaxinfer generate`, `jaxinfer serve` and the benchmarks."""
import argparse
import dataclasses

import pytest

import jaxinfer
from jaxinfer.cli_args import add_engine_args, config_from_args, flag_names
from jaxinfer.config import GROUPS, ConfigError, EngineConfig, SpeculativeConfig


def _parser(**defaults):
    p = argparse.ArgumentParser()
    add_engine_args(p, **defaults)
    return p


def _fields():
    return [(g, f) for g, cls in GROUPS.items() for f in dataclasses.fields(cls)]


def test_every_field_is_documented_and_a_flag():
    for group, f in _fields():
        assert f.metadata.get("help"), f"{group}.{f.name} has no help text"
        if f.metadata.get("cli", True):
            assert f.name in flag_names()
    helptext = _parser().format_help()
    for _, f in _fields():
        assert "--" + f.name.replace("_", "-") in helptext
    assert "--speculative-config" in helptext and "--coordinator-address" in helptext


def test_no_flags_give_the_config_defaults():
    assert config_from_args(_parser().parse_args([])) == EngineConfig()


def test_flags_reach_their_group():
    a = _parser().parse_args(["--model", "m", "--dtype", "float32", "-tp", "2", "--max-num-seqs", "8",
                              "--no-async-scheduling", "--kv-cache-dtype", "int8", "--page-size", "32",
                              "--attention-backend", "reference", "--quantization", "int8", "--quantize-lm-head"])
    c = config_from_args(a)
    assert (c.load.model, c.load.dtype, c.load.quantization, c.load.quantize_lm_head) == ("m", "float32", "int8", True)
    assert c.parallel.tensor_parallel_size == 2
    assert (c.scheduler.max_num_seqs, c.scheduler.async_scheduling) == (8, False)
    assert (c.cache.kv_cache_dtype, c.cache.page_size, c.kernels.attention_backend) == ("int8", 32, "reference")
    assert config_from_args(_parser().parse_args(["--speculative-config", '{"method": "ngram"}'])).speculative == \
        SpeculativeConfig("ngram")


def test_a_scripts_defaults_and_bad_values():
    a = _parser(model="llama3-8b", load_format="dummy", max_model_len=1024).parse_args([])
    c = config_from_args(a)
    assert (c.load.model, c.load.load_format, c.scheduler.max_model_len) == ("llama3-8b", "dummy", 1024)
    with pytest.raises(ConfigError, match=r"unknown engine flag\(s\) \['max_num_seq'\]"):
        _parser(max_num_seq=3)
    with pytest.raises(SystemExit):  # argparse names the choices
        _parser().parse_args(["--kv-cache-dtype", "int3"])
    with pytest.raises(ConfigError, match="page_size must be a power of two"):
        config_from_args(_parser().parse_args(["--page-size", "24"]))


def test_flat_keywords_route_to_groups_and_unknown_ones_are_named():
    c = EngineConfig.from_options(max_num_seqs=3, num_pages=64, quantized_matmul="xla", quantization="int8",
                                  speculative_config={"method": "ngram"}, seed=5)
    assert (c.scheduler.max_num_seqs, c.cache.num_pages, c.kernels.quantized_matmul) == (3, 64, "xla")
    assert c.quant_spec.method == "int8" and c.speculative == SpeculativeConfig("ngram") and c.seed == 5
    r = c.replace(num_pages=8, speculative_config=None)
    assert (r.cache.num_pages, r.speculative, r.scheduler.max_num_seqs) == (8, None, 3)
    for bad in ("enforce_eager", "not_an_option"):  # enforce_eager was accepted and never read: gone
        with pytest.raises(ConfigError, match=rf"unknown option\(s\) \['{bad}'\]"):
            EngineConfig.from_options(**{bad: True})
    with pytest.raises(ConfigError, match="max_num_batched_tokens \\(8\\) must be >= query_tile \\(16\\)"):
        EngineConfig.from_options(max_num_batched_tokens=8)


def test_speculative_config_is_public():
    assert jaxinfer.SpeculativeConfig is SpeculativeConfig and "SpeculativeConfig" in jaxinfer.__all__
