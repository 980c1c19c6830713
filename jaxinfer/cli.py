"""The `jaxinfer` command line: generate, info and serve (the server owns its parser: serving/cli.py).

  jaxinfer generate "PROMPT" [--model PATH] [--max-tokens N] [--temperature T] [--seed S] [--chat]
  jaxinfer info [MODEL]
  jaxinfer serve [--model M] [--host 127.0.0.1] [--port 8000] [--max-waiting N] [engine options]
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys

from jaxinfer.cli_args import add_engine_args, config_from_args, init_distributed


def cmd_generate(a) -> int:
    from jaxinfer import LLM, SamplingParams

    params = SamplingParams(max_tokens=a.max_tokens, temperature=a.temperature, top_p=a.top_p, top_k=a.top_k,
                            seed=a.seed)
    config = config_from_args(a)  # validated before anything is loaded
    distributed = init_distributed(a)  # multi-host: every process runs this same command with the same prompt
    if not distributed:
        _prefetch_programs(config)
    # One prompt needs two or three of the buckets: compile those on first use instead of all at start; the
    # prompt's own program compiles while the weights load (_first_request).
    messages = [{"role": "user", "content": a.prompt}]
    llm = LLM(config=config, progress=not a.quiet, warmup=False,
              _first_request=(messages if a.chat else a.prompt, params))
    if a.chat:
        if llm.tokenizer is None:
            raise ValueError("--chat needs a model with a tokenizer and chat template")
        prompt = llm.tokenizer.apply_chat_template(messages)
    else:
        prompt = a.prompt
    # The decode step's program compiles (or loads) on a second thread once the first token is out: until it is
    # ready the decode steps run in the prompt's bucket. Compiled beside the prompt's, it slowed the first token
    # (benchmarks/README.md, start-up caches on CPU).
    llm.runner.compile_in_background([llm.runner.ladder.pick(1, 1)], after_first_step=True,
                                     greedy_only=llm.runner.greedy_for(params))
    printed = 0
    for out in llm.stream(prompt, params):
        text = out.outputs[0].text
        sys.stdout.write(text[printed:])
        sys.stdout.flush()
        printed = len(text)
    sys.stdout.write("\n")
    return 0


def _prefetch_programs(config) -> None:
    """Load the first program the last run of this command used (its prompt's) while this one imports and loads
    its weights (runner/program_cache.py prefetch; a warm start spent ~0.7 s loading its programs after the runner
    was built)."""
    from jaxinfer.runner import program_cache

    par = config.parallel
    if par.tensor_parallel_size > 1 or par.data_parallel_size > 1 or not program_cache.program_cache_enabled():
        return  # (sharded programs are not cached)
    from jaxinfer.weights.default_model import GGUF_FILENAME, cache_dir

    model = config.load.model or os.path.join(cache_dir(), "models", GGUF_FILENAME)
    try:
        st = os.stat(model)
        model = (os.path.realpath(model), st.st_size, st.st_mtime_ns)
    except OSError:  # a hub id or a preset: its name
        pass
    program_cache.prefetch(program_cache.hint_name("generate", repr(config), model))


def cmd_info(a) -> int:
    from jaxinfer.models.registry import model_config
    from jaxinfer.weights.loader import resolve_model

    src = resolve_model(a.model or a.model_pos, a.load_format)
    _, cfg = model_config(src.hf_config)
    n = cfg.num_params()
    info = {
        "model": src.name, "source": src.kind, "path": src.path, "config": {
            k: getattr(cfg, k) for k in ("model_type", "vocab_size", "hidden_size", "intermediate_size",
                                         "num_layers", "num_heads", "num_kv_heads", "head_dim", "rope_theta",
                                         "max_position_embeddings", "tie_word_embeddings", "qkv_bias",
                                         "qk_norm", "sliding_window")},
        "rope_scaling": None if cfg.rope_scaling is None else vars(cfg.rope_scaling),
        "parameters": n,
        "weights_bf16_GB": round(n * 2 / 1e9, 3),
        "weights_f32_GB": round(n * 4 / 1e9, 3),
        "kv_cache_bf16_bytes_per_token": cfg.kv_bytes_per_token(2),
    }
    print(json.dumps(info, indent=2, default=str))
    return 0


def cmd_smoothquant(args) -> int:
    from jaxinfer.tokenizer import Tokenizer
    from jaxinfer.weights.smoothquant import smooth_checkpoint

    tokenizer = Tokenizer.from_pretrained(args.model_pos)  # (the calibration text in the model's own tokens)
    print(json.dumps(smooth_checkpoint(args.model_pos, args.out, tokenizer, alpha=args.alpha,
                                       overwrite=args.overwrite), indent=2))
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="jaxinfer", description="LLM inference on JAX/XLA")
    sub = p.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("generate", help="generate text from a prompt, streamed to stdout")
    g.add_argument("prompt")
    add_engine_args(g)
    g.add_argument("--max-tokens", type=int, default=128)
    g.add_argument("--temperature", type=float, default=0.0)
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--top-k", type=int, default=-1)
    g.add_argument("--seed", type=int, default=None)
    g.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    g.add_argument("--quiet", action="store_true", help="no progress bars or logs")
    # one prompt is one sequence: a KV pool and sampler rows for one (on CPU the pool is sized from it)
    g.set_defaults(fn=cmd_generate, max_num_seqs=1)
    i = sub.add_parser("info", help="print a model's config, parameter count and memory")
    i.add_argument("model_pos", nargs="?", default=None, metavar="MODEL")
    add_engine_args(i, only=("model", "load_format"))
    i.set_defaults(fn=cmd_info)
    sq = sub.add_parser("smoothquant", help="write a SmoothQuant-smoothed float copy of a model (for W8A8 int8: "
                                            "with --quantization int8 a GPU runs it W8A8 above 16 tokens a step)")
    sq.add_argument("model_pos", metavar="MODEL", help="HF directory, GGUF file or jaxinfer orbax checkpoint")
    sq.add_argument("out", help="directory for the smoothed orbax checkpoint")
    sq.add_argument("--alpha", type=float, default=0.5, help="migration strength in [0, 1] (default 0.5)")
    sq.add_argument("--overwrite", action="store_true", help="replace a non-empty OUT")
    sq.set_defaults(fn=cmd_smoothquant)
    sub.add_parser("serve", help="OpenAI-compatible HTTP server (see `jaxinfer serve --help`)", add_help=False)
    return p


def _configure_logging(quiet: bool):
    """jaxinfer's own messages on stderr (INFO, or WARNING with --quiet). The root logger is left alone, so the
    INFO lines of jax (e.g. "Unable to initialize backend 'tpu' ... libtpu.so") stay hidden, as in plain Python.
    (The records still propagate: a CLI process's root logger has no handler, a test's capture sees them.)"""
    log = logging.getLogger("jaxinfer")
    if not any(getattr(h, "_jaxinfer_cli", False) for h in log.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
        handler._jaxinfer_cli = True
        log.addHandler(handler)
    log.setLevel(logging.WARNING if quiet else logging.INFO)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] == "serve":  # the server owns its parser (serving/cli.py) and its event loop
        from serving.cli import main as serve_main

        return serve_main(argv[1:])
    args = build_parser().parse_args(argv)
    _configure_logging(quiet=getattr(args, "quiet", False))
    try:
        return args.fn(args)
    except (ValueError, TypeError, OSError, MemoryError) as e:
        print(f"jaxinfer: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
