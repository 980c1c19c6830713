"""Whole compiled programs on disk, so a warm start skips tracing, lowering and compiling.

JAX's persistent compilation cache (runner/compile_options.py enable_compilation_cache) saves only XLA's compile:
every start still traces and lowers each step program (seconds per bucket on a 2-core CPU). This cache stores the
compiled executable itself (`jax.experimental.serialize_executable`) under a key of everything the program depends
on, and loads it back without tracing:

  key = sha256(jax / jaxlib versions, backend + platform version + device kind and count, XLA_FLAGS, whether the
               allocator reports memory statistics (BFC) or not (CPU, VMM),
               a digest of jaxinfer's and pallas_kernels' source, the program's name, and `parts`: the caller's
               config reprs and the abstract input signature (shapes, dtypes, shardings of every argument))

Invariants:
  * never crash: an entry that fails to read, unpickle or load is deleted and the program is compiled fresh; a
    store that fails is logged and ignored. A hit gives the same executable as a fresh compile (bitwise-identical
    outputs: tests/test_startup_caches.py).
  * only freshly compiled executables are stored: XLA:CPU mis-serialized executables that were themselves
    deserialized (from JAX's persistent cache), so a miss compiles under a JAX cache key of its own and stores
    the result only when JAX's cache did not serve it (_compile_fresh).
  * a program that cannot be serialized (store fails) is marked `<key>.plain` and from then on compiled the
    ordinary way, through JAX's persistent cache (which the fresh compiles of this module never write).
  * entries are written atomically (temp file + os.replace); the directory is trimmed to `max_bytes` (oldest
    first) after each store.

Where: $JAXINFER_CACHE/programs (default ~/.cache/jaxinfer/programs). On by default on CPU and GPU (DEFAULT_BACKENDS);
JAXINFER_PROGRAM_CACHE=0 / 1 forces it off / on.

Prefetch (prefetch(), `jaxinfer generate`): a program's key needs the built runner (weights' shapes, KV pool), so
on its own a warm start loads its programs only after imports, weights and runner. A start of the same command
needs the programs the previous one used, so the keys a process uses are written to `<hint>.hint` (a hash of the
command's configuration and model file, keys in first-use order) and the next start under that hint loads the
first of them (its first step's) on a thread right after `import jax`, beside the rest of start-up (deserializing
runs outside the GIL); load() then takes the prefetched executable instead of reading the file. A hint only says what to load early: a program is still taken by its
full key, onto the same devices, and a stale hint costs a load nobody takes.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import os
import pickle
import tempfile
import threading
from concurrent.futures import Future
from typing import Any, Callable

import jax

from jaxinfer.env_switch import switch

log = logging.getLogger("jaxinfer")

DEFAULT_MAX_BYTES = 4 << 30  # programs of the 8B shape are ~10-50 MB each
_SUFFIX = ".jxp"
_HINT_SUFFIX = ".hint"
MAX_HINT_KEYS = 4  # keys recorded per hint (`jaxinfer generate` uses 2: its prompt's bucket and the decode bucket)
_lock = threading.Lock()


def cache_root() -> str:
    return os.environ.get("JAXINFER_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "jaxinfer")


# Backends the cache is on for by default: XLA:CPU (jax 0.10, tests/test_startup_caches.py) and the GPU (jax 0.11 on
# the H200, tests/test_startup_caches_gpu.py; warm start-up of the 8B shape 13.5 s with JAX's cache alone -> 8.8 s,
# benchmarks/results/gpu-program-cache-803e7a6-2026-12-03.log).
DEFAULT_BACKENDS = ("cpu", "gpu")


def program_cache_enabled(backend: str | None = None) -> bool:
    """JAXINFER_PROGRAM_CACHE=1 / 0 turns it on / off; unset: on for DEFAULT_BACKENDS only."""
    if os.environ.get("JAXINFER_PROGRAM_CACHE") is not None:
        return switch("JAXINFER_PROGRAM_CACHE")
    return (backend or jax.default_backend()) in DEFAULT_BACKENDS


@functools.lru_cache(maxsize=None)
def source_digest() -> str:
    """sha256 over the source of jaxinfer/ and pallas_kernels/ (what a traced program can depend on)."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # jaxinfer/
    h = hashlib.sha256()
    for root in (here, os.path.join(os.path.dirname(here), "pallas_kernels")):
        for d, dirs, files in sorted(os.walk(root)):
            dirs.sort()
            for f in sorted(files):
                if f.endswith(".py"):
                    p = os.path.join(d, f)
                    h.update(os.path.relpath(p, os.path.dirname(here)).encode())
                    with open(p, "rb") as fh:
                        h.update(fh.read())
    return h.hexdigest()


# Environment switches read while a step is traced, so they change the program under the same source and config:
# a process with JAXINFER_TRITON=0 (XLA's forms instead of the small-M kernels) must not load programs compiled with
# the kernels. (Seen on the H200, 2026-12-04, with a since-removed switch: the other setting's program was loaded.)
# Each is on unless set to "0".
TRACE_ENV = ("JAXINFER_TRITON", "JAXINFER_NK_EXACT_ROWS", "JAXINFER_FP8_FUSED_QUANT")
# ... and the off-by-default ones, read with env_switch.switch(name, default=False)
TRACE_ENV_OFF = ("JAXINFER_SPLIT_CAUSAL", "JAXINFER_TRITON_PREFILL")


def _environment() -> str:
    return _environment_for(tuple(os.environ.get(k, "1") != "0" for k in TRACE_ENV)
                            + tuple(switch(k, default=False) for k in TRACE_ENV_OFF))


@functools.lru_cache(maxsize=None)
def _environment_for(trace_env: tuple) -> str:
    import jaxlib

    dev = jax.devices()[0]
    # The allocator in force, not only XLA_FLAGS: runner/xla_env.py's command-buffer mode (VMM allocator, no memory
    # statistics) takes effect only if jaxinfer was imported before jax started; a process that started jax first
    # has the same XLA_FLAGS but the default allocator, and must not share programs with one that did not.
    allocator = "stats" if dev.memory_stats() else "no-stats"
    return repr((jax.__version__, getattr(jaxlib, "__version__", "?"), jax.default_backend(),
                 getattr(dev.client, "platform_version", "?"), dev.device_kind, jax.device_count(),
                 os.environ.get("XLA_FLAGS", ""), allocator, source_digest(), trace_env))


def abstract_signature(tree) -> str:
    """Shapes, dtypes and shardings of a pytree of arrays / ShapeDtypeStructs, and its structure (no values)."""
    leaves, treedef = jax.tree.flatten(tree)
    sig = [(tuple(x.shape), str(x.dtype), repr(getattr(x, "sharding", None))) for x in leaves]
    return repr((str(treedef), sig))


def program_key(name: str, *parts: Any) -> str:
    h = hashlib.sha256()
    for p in (name, _environment()) + tuple(parts):
        h.update(repr(p).encode())
        h.update(b"\0")
    return h.hexdigest()


_tls = threading.local()  # .jax_cache_hits: JAX persistent-cache hits seen by this thread
_listening = False


def _on_event(event: str, **_):
    if event == "/jax/compilation_cache/cache_hits":
        _tls.jax_cache_hits = getattr(_tls, "jax_cache_hits", 0) + 1


def _compile_fresh(lower_and_compile: Callable[[], Any]) -> tuple[Any, bool]:
    """(compiled, fresh): fresh is False when JAX's persistent cache served the executable (a deserialized one,
    which must not be serialized again: XLA:CPU's re-serialization lost functions, and the reloaded program
    failed at run time with "Function wrapped_slice.3 not found").

    JAX's cache cannot be switched off for one thread (its "used" decision is made once per process), so the
    compile runs with two thread-local options: source metadata in JAX's cache key (a key the ordinary compiles
    of the same program never use) and a minimum compile time no compile reaches (so JAX never writes that key):
    the lookup misses and the program is compiled fresh, and stored only here."""
    global _listening
    if not _listening:
        with contextlib.suppress(Exception):
            jax.monitoring.register_event_listener(_on_event)
            _listening = True
    _tls.jax_cache_hits = 0
    with contextlib.ExitStack() as stack:
        with contextlib.suppress(Exception):  # a JAX without these options: compile as usual (hits not stored)
            from jax._src import config as jcfg

            stack.enter_context(jcfg.compilation_cache_include_metadata_in_key(True))
            stack.enter_context(jcfg.persistent_cache_min_compile_time_secs(1e12))
        compiled = lower_and_compile()
    return compiled, _listening and _tls.jax_cache_hits == 0


class ProgramCache:
    """A directory of serialized compiled programs (see the module docstring for keys and invariants)."""

    def __init__(self, directory: str | None = None, max_bytes: int = DEFAULT_MAX_BYTES):
        self.directory = directory or os.path.join(cache_root(), "programs")
        self.max_bytes = max_bytes
        self.hits = self.misses = self.failures = 0
        self.prefetched = 0  # hits served by prefetch()

    def _path(self, key: str) -> str:
        return os.path.join(self.directory, key + _SUFFIX)

    def load(self, key: str, devices=None):
        """The compiled program stored under `key` (loaded onto `devices`, default: the first device), or None
        (missing, or unreadable: then it is deleted). A program prefetch() loaded for this directory and these
        devices is taken instead of reading the file again."""
        path = self._path(key)
        devices = list(devices or jax.devices()[:1])
        compiled = _take_prefetched(self.directory, key, devices)
        if compiled is not None:
            self.prefetched += 1
        else:
            try:
                with open(path, "rb") as f:
                    payload, in_tree, out_tree = pickle.load(f)
            except FileNotFoundError:
                return None
            except Exception as e:  # noqa: BLE001  truncated / corrupted / written by another version
                return self._drop(path, e)
            try:
                compiled = _deserialize(payload, in_tree, out_tree, devices)
            except Exception as e:  # noqa: BLE001
                return self._drop(path, e)
        with contextlib.suppress(OSError):
            os.utime(path)  # recently used: trimmed last
        return compiled

    def _drop(self, path: str, err: Exception):
        self.failures += 1
        log.warning("program cache: cannot load %s (%s: %s); compiling instead", os.path.basename(path),
                    type(err).__name__, str(err)[:200])
        with contextlib.suppress(OSError):
            os.remove(path)
        return None

    def store(self, key: str, compiled) -> bool:
        """Serialize `compiled` (a freshly compiled jax.stages.Compiled) under `key`; False when it cannot be
        (then a `<key>.plain` marker says so: the next start compiles it through JAX's own cache instead)."""
        tmp = None
        try:
            from jax.experimental.serialize_executable import serialize

            payload, in_tree, out_tree = serialize(compiled)
            blob = pickle.dumps((payload, in_tree, out_tree), protocol=pickle.HIGHEST_PROTOCOL)
            os.makedirs(self.directory, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=key[:16], suffix=".part", dir=self.directory)
            with os.fdopen(fd, "wb") as f:
                f.write(blob)
            os.replace(tmp, self._path(key))
        except Exception as e:  # noqa: BLE001  e.g. programs with host callbacks or closed-over constants
            log.debug("program cache: not storing %s (%s: %s)", key[:16], type(e).__name__, e)
            if tmp is not None:
                with contextlib.suppress(OSError):
                    os.remove(tmp)
            with contextlib.suppress(OSError):
                os.makedirs(self.directory, exist_ok=True)
                open(os.path.join(self.directory, key + ".plain"), "w").close()
            return False
        self.trim()
        return True

    def trim(self) -> None:
        """Delete the least recently used entries until the directory holds at most max_bytes."""
        with _lock:
            try:
                entries = [(e.stat().st_mtime, e.stat().st_size, e.path) for e in os.scandir(self.directory)
                           if e.name.endswith(_SUFFIX)]
            except OSError:
                return
            total = sum(s for _, s, _ in entries)
            for _, size, path in sorted(entries):
                if total <= self.max_bytes:
                    break
                with contextlib.suppress(OSError):
                    os.remove(path)
                    total -= size

    def get_or_compile(self, key: str, lower_and_compile: Callable[[], Any], devices=None):
        """The program under `key` from disk, else `lower_and_compile()`, stored for the next start when it was
        compiled fresh (not served by JAX's persistent cache: _compile_fresh)."""
        compiled = self.load(key, devices)
        if compiled is not None:
            self.hits += 1
            _note_used(self.directory, key)
            return compiled
        self.misses += 1
        if os.path.exists(os.path.join(self.directory, key + ".plain")):  # cannot be serialized: JAX's cache only
            return lower_and_compile()
        compiled, fresh = _compile_fresh(lower_and_compile)
        if fresh:
            if self.store(key, compiled):
                _note_used(self.directory, key)
        else:
            log.debug("program cache: %s came from JAX's compilation cache; not stored", key[:16])
        return compiled


def _deserialize(payload, in_tree, out_tree, devices):
    from jax.experimental.serialize_executable import deserialize_and_load

    return deserialize_and_load(payload, in_tree, out_tree, execution_devices=list(devices))


# ---- prefetch (module docstring) ------------------------------------------------------------------------------
_prefetched: dict[tuple[str, str], tuple[Future, list]] = {}  # (directory, key) -> (Future, devices)
_hint: dict | None = None  # the hint this process records its keys under: {"path", "directory", "keys"}


def hint_name(*parts: Any) -> str:
    """The hint of a start: a hash of what makes two starts need the same programs (the caller's parts, e.g. the
    configuration and the model file's identity)."""
    h = hashlib.sha256()
    for p in parts:
        h.update(repr(p).encode())
        h.update(b"\0")
    return h.hexdigest()[:32]


def prefetch(hint: str, count: int = 1, directory: str | None = None, devices=None) -> list[str]:
    """Start loading (one thread per program) the first `count` programs the last process under `hint` used,
    onto `devices` (default: the first device), and record the keys this process uses under `hint`
    (ProgramCache.get_or_compile) for the next one. Returns the keys being loaded. Call it once the backend may
    be initialized (after any jax.distributed.initialize); a program that fails to load here is left to
    ProgramCache.load, which deletes it if it is damaged.

    count 1 (`jaxinfer generate`: its prompt's program; the decode program loads after the first token): on the
    2-core box, shared, the first byte of a warm start came after 3.15 s with one program prefetched, 3.48 s
    with both (they slowed the imports beside them), 3.88 s with none (benchmarks/README.md)."""
    global _hint
    directory = directory or os.path.join(cache_root(), "programs")
    path = os.path.join(directory, hint + _HINT_SUFFIX)
    keys = []
    with contextlib.suppress(OSError, ValueError):
        with open(path, encoding="ascii") as f:
            keys = [k for k in f.read().split() if len(k) == 64 and all(c in "0123456789abcdef" for c in k)]
    keys = list(dict.fromkeys(keys))[:count]
    with _lock:
        _prefetched.clear()
        _hint = {"path": path, "directory": directory, "keys": []}
    devices = list(devices or jax.devices()[:1])
    for key in keys:
        fut: Future = Future()
        with _lock:
            _prefetched[directory, key] = (fut, devices)
        threading.Thread(target=_prefetch_one, args=(os.path.join(directory, key + _SUFFIX), devices, fut),
                         name="jaxinfer-prefetch", daemon=True).start()
    return keys


def _prefetch_one(path: str, devices: list, fut: Future) -> None:
    try:
        with open(path, "rb") as f:
            payload, in_tree, out_tree = pickle.load(f)
        fut.set_result(_deserialize(payload, in_tree, out_tree, devices))
    except Exception as e:  # noqa: BLE001  missing / damaged: ProgramCache.load finds out again (and deletes it)
        log.debug("program cache: prefetch of %s failed (%s: %s)", os.path.basename(path), type(e).__name__, e)
        fut.set_result(None)


def _take_prefetched(directory: str, key: str, devices: list):
    """The program prefetch() loaded (or is loading: then wait for it) for `key` onto `devices`, or None."""
    with _lock:
        entry = _prefetched.pop((directory, key), None)
    if entry is None or entry[1] != devices:
        return None
    return entry[0].result()


def _note_used(directory: str, key: str) -> None:
    """Record `key` under this process's hint (first use first): what the next start prefetches."""
    with _lock:
        h = _hint
        if h is None or h["directory"] != directory or key in h["keys"] or len(h["keys"]) >= MAX_HINT_KEYS:
            return
        h["keys"].append(key)
        tmp = None
        try:
            os.makedirs(directory, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix="hint", suffix=".part", dir=directory)
            with os.fdopen(fd, "w", encoding="ascii") as f:
                f.write("\n".join(h["keys"]) + "\n")
            os.replace(tmp, h["path"])
        except OSError as e:
            log.debug("program cache: hint not written (%s)", e)
            if tmp is not None:
                with contextlib.suppress(OSError):
                    os.remove(tmp)


def clear(directory: str | None = None) -> int:
    """Delete every stored program; returns how many were removed."""
    directory = directory or os.path.join(cache_root(), "programs")
    n = 0
    with contextlib.suppress(FileNotFoundError):
        for e in os.scandir(directory):
            if e.name.endswith((_SUFFIX, ".plain", _HINT_SUFFIX)):
                with contextlib.suppress(OSError):
                    os.remove(e.path)
                    n += 1
    return n
