"""`jaxinfer serve` / `python -m serving`: the server's command line (engine options, server limits, --host /
--port / ...) and its process: build the LLM, freeze start-up objects out of the GC, run the aiohttp app of
serving/server.py until SIGTERM."""
from __future__ import annotations

import argparse
import logging
import os
import sys

from aiohttp import web

from jaxinfer.env_switch import positive_seconds
from jaxinfer.runner.call_thread import switch_interval_s
from serving.limits import add_limit_args, limits_from_args
from serving.server import create_app

log = logging.getLogger("serving")


def build_parser() -> argparse.ArgumentParser:
    from jaxinfer.cli_args import add_engine_args

    p = argparse.ArgumentParser(prog="jaxinfer serve", description="OpenAI-compatible HTTP server")
    add_engine_args(p)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--served-model-name", default=None)
    p.add_argument("--max-waiting", type=int, default=None,
                   help="refuse (503) requests beyond max_num_seqs + this many; default: no limit")
    p.add_argument("--no-warmup", action="store_true", help="compile buckets on first use instead of at start")
    p.add_argument("--shutdown-grace", type=float, default=10.0,
                   help="seconds running requests may finish after SIGTERM; streams still running then end with "
                        "finish_reason 'length' and [DONE]")
    add_limit_args(p)
    p.add_argument("--profile", default=None, metavar="DIR",
                   help="write a jax.profiler trace of the serving run (start to shutdown) to DIR")
    p.add_argument("--switch-interval", type=_positive_seconds, default=None, metavar="S",
                   help="the interpreter's thread switch interval (sys.setswitchinterval; default "
                        "JAXINFER_SWITCH_INTERVAL or 0.0001): the engine's compiled call re-takes the GIL many times "
                        "a step and, while the event loop runs Python, waits up to this long each time "
                        "(benchmarks/probes/call_gil.py). Python's own 0.005 served 11%% fewer requests at 64 req/s "
                        "offered (8B, H100, 12-07 e)")
    return p


def _positive_seconds(text: str) -> float:
    try:
        return positive_seconds(text)
    except ValueError as e:  # (argparse shows an ArgumentTypeError's own message)
        raise argparse.ArgumentTypeError(str(e)) from None


def apply_switch_interval(seconds: float) -> None:
    """--switch-interval: the process's interval now, and JAXINFER_SWITCH_INTERVAL for the engine about to be built,
    whose call thread (on by default with a GPU) would set its own at its first call."""
    os.environ["JAXINFER_SWITCH_INTERVAL"] = repr(seconds)
    sys.setswitchinterval(seconds)


def main(argv=None) -> int:
    a = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    from jaxinfer import LLM
    from jaxinfer.cli_args import config_from_args, init_distributed

    try:  # (before the engine: a bad JAXINFER_SWITCH_INTERVAL is an error like a bad flag)
        apply_switch_interval(a.switch_interval if a.switch_interval is not None else switch_interval_s())
        config = config_from_args(a)
        if init_distributed(a):
            raise ValueError("jaxinfer serve runs on one host (tensor/data parallel over its devices); across "
                             "hosts run the offline API or `jaxinfer generate` on every host (README)")
        llm = LLM(config=config, warmup=not a.no_warmup)
    except (ValueError, TypeError, FileNotFoundError, MemoryError) as e:  # same contract as `jaxinfer generate`
        print(f"jaxinfer serve: error: {e}", file=sys.stderr)
        return 2
    try:
        limits = limits_from_args(a)
    except ValueError as e:
        print(f"jaxinfer serve: error: {e}", file=sys.stderr)
        return 2
    app = create_app(llm, a.served_model_name, a.max_waiting, a.shutdown_grace, limits)
    # The server lives until exit and so do the objects of start-up: take them out of the cyclic GC for good, so
    # its full collections stop walking ~270k objects in the middle of engine steps (engine/gc_freeze.py).
    import gc

    from jaxinfer.engine.gc_freeze import raise_young_threshold

    gc.collect()
    gc.freeze()
    raise_young_threshold()  # (for good, as the freeze: fewer young collections a streaming step, gc_freeze.py)
    if a.profile:
        import jax

        jax.profiler.start_trace(a.profile)
    # run_app maps SIGTERM/SIGINT to a graceful shutdown (on_shutdown -> AsyncEngine.shutdown) and returns.
    try:
        web.run_app(app, host=a.host, port=a.port, shutdown_timeout=a.shutdown_grace + 5, print=log.info)
    finally:
        if a.profile:
            jax.profiler.stop_trace()
    return 0
