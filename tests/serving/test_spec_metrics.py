"""Speculative decoding on the serving surface: the CLI/server flag reaches the engine options, and /metrics
exports the engine's acceptance counters (no model needed)."""
import types

from prometheus_client import generate_latest

from serving.async_engine import EngineStats
from serving.cli import build_parser
from serving.server import _Metrics


def test_speculative_config_flag():
    from jaxinfer import SpeculativeConfig
    from jaxinfer.cli_args import config_from_args

    a = build_parser().parse_args(["--speculative-config", '{"method": "ngram", "num_speculative_tokens": 3}'])
    assert config_from_args(a).speculative == SpeculativeConfig(method="ngram", num_speculative_tokens=3)
    assert config_from_args(build_parser().parse_args([])).speculative is None


def test_spec_metrics_exported():
    aeng = types.SimpleNamespace(stats=EngineStats(spec={"num_draft_tokens": 40, "num_accepted_tokens": 30,
                                                         "acceptance_rate": 0.75}))
    text = generate_latest(_Metrics(aeng).registry).decode()
    assert "jaxinfer_spec_num_draft_tokens 40.0" in text and "jaxinfer_spec_acceptance_rate 0.75" in text
    aeng.stats = EngineStats()  # speculation off: zeros
    assert "jaxinfer_spec_num_accepted_tokens 0.0" in generate_latest(_Metrics(aeng).registry).decode()
