"""Command-line flags generated from the configuration's fields; shared by `jaxinfer generate`, `jaxinfer serve`
(serving/server.py) and the benchmarks.

Every field of EngineConfig's groups (config/engine.py: load, scheduler, cache, parallel, kernels) whose metadata does
not say cli=False becomes one flag named after it (max_num_seqs -> --max-num-seqs), with the field's type,
default, choices and help; booleans get --flag / --no-flag. Speculative decoding is one JSON flag
(--speculative-config, the fields of SpeculativeConfig), and the multi-host flags come from DistributedConfig.

    add_engine_args(parser, model="llama3-8b", load_format="dummy")  # a script's own defaults
    config = config_from_args(parser.parse_args())                    # -> EngineConfig, validated
    llm = LLM(config=config)
"""
from __future__ import annotations

import argparse
import dataclasses
import json

from jaxinfer.config import GROUPS, ConfigError, DistributedConfig, EngineConfig

_TITLES = {"load": "model and weights", "scheduler": "scheduling", "cache": "KV cache",
           "parallel": "parallelism (README: several GPUs and hosts)", "kernels": "kernels",
           "distributed": "several hosts"}
_TYPES = {"int": int, "float": float, "str": str}
SPECULATIVE_FLAG = "speculative_config"


def _cli_fields(cls) -> list[dataclasses.Field]:
    return [f for f in dataclasses.fields(cls) if f.metadata.get("cli", True)]


def _groups() -> dict[str, type]:
    return {**GROUPS, "distributed": DistributedConfig}


def flag_names() -> list[str]:
    """Every option add_engine_args adds (argparse dest names)."""
    return [f.name for cls in _groups().values() for f in _cli_fields(cls)] + [SPECULATIVE_FLAG]


def add_engine_args(parser: argparse.ArgumentParser, *, only: tuple[str, ...] | None = None, **defaults):
    """Add the config's flags to `parser` (only: just these options). defaults: a caller's own default per option
    (e.g. model="llama3-8b"); an option that is not a flag is a ConfigError naming it."""
    known = flag_names()
    unknown = sorted(set(defaults) - set(known)) + sorted(set(only or ()) - set(known))
    if unknown:
        raise ConfigError(f"unknown engine flag(s) {unknown}; the flags are {sorted(known)}")
    for group, cls in _groups().items():
        fields = [f for f in _cli_fields(cls) if only is None or f.name in only]
        if not fields:
            continue
        g = parser.add_argument_group(_TITLES[group])
        for f in fields:
            _add_field(g, f, defaults.get(f.name, f.default))
    if only is None or SPECULATIVE_FLAG in only:
        spec = parser.add_argument_group("speculative decoding")
        spec.add_argument("--speculative-config", type=json.loads, default=defaults.get(SPECULATIVE_FLAG),
                          metavar="JSON",
                          help='speculative decoding, e.g. \'{"method": "ngram", "num_speculative_tokens": 4}\' '
                               '(fields of jaxinfer.SpeculativeConfig)')


def _add_field(group, f: dataclasses.Field, default):
    names = ["--" + f.name.replace("_", "-"), *f.metadata.get("aliases", ())]
    help_ = f.metadata.get("help", "")
    kind = str(f.type).replace(" | None", "").strip()
    if kind == "bool":
        group.add_argument(*names, dest=f.name, action=argparse.BooleanOptionalAction, default=default, help=help_)
        return
    if kind not in _TYPES:
        raise TypeError(f"config field {f.name} has type {f.type!r}, which has no command-line form; give it "
                        "metadata cli=False or a type among int, float, str, bool")
    shown = "" if default is None else " (default: %(default)s)"  # a None default is described by the help
    group.add_argument(*names, dest=f.name, type=_TYPES[kind], default=default, choices=f.metadata.get("choices"),
                       help=help_ + shown)


def config_from_args(args: argparse.Namespace) -> EngineConfig:
    """The EngineConfig of parsed flags (every option add_engine_args added; the others keep their defaults)."""
    engine_options = set(EngineConfig.option_names())
    return EngineConfig.from_options(**{name: getattr(args, name) for name in flag_names()
                                        if name in engine_options and hasattr(args, name)})


def as_flags(args: argparse.Namespace) -> list[str]:
    """The parsed engine options written back as flags (to start another process with the same configuration,
    e.g. a benchmark starting `jaxinfer serve`); options left at None are omitted."""
    out = []
    for name in flag_names():
        value = getattr(args, name, None)
        flag = "--" + name.replace("_", "-")
        if value is None:
            continue
        if isinstance(value, bool):
            out.append(flag if value else "--no-" + name.replace("_", "-"))
        else:
            out += [flag, json.dumps(value) if name == SPECULATIVE_FLAG else str(value)]
    return out


def init_distributed(args: argparse.Namespace) -> bool:
    """Join the multi-host job given by the flags or JAXINFER_* environment (no-op when neither is set)."""
    from jaxinfer.parallel import initialize_distributed

    d = DistributedConfig(**{f.name: getattr(args, f.name) for f in dataclasses.fields(DistributedConfig)})
    return initialize_distributed(d.coordinator_address, d.num_processes, d.process_id)
