"""Prepared weights: a GGUF file's dequantized, re-laid-out tensors (and its parsed metadata) kept on disk, so a
second start reads them back memory-mapped instead of parsing the file and dequantizing every tensor again.

Layout under $JAXINFER_CACHE/prepared (default ~/.cache/jaxinfer/prepared):
  <fingerprint>/meta.json                 {"source": realpath, "hf_config": {...}, "tokenizer": {...}}
  <fingerprint>/<variant>/manifest.json   {"version", "variant", "tensors": [[path, file, dtype, shape], ...]}
  <fingerprint>/<variant>/t0000.npy ...   one array per module parameter, in the module's layout and dtype
fingerprint: weights/fingerprint.py (size, mtime, head and tail of the file); variant: the target dtype plus a
digest of the loader's source (a change of layout code is a miss, never a wrong hit).

Invariants:
  * a hit gives exactly the arrays a fresh load computes (tests/test_startup_caches.py); the loader still
    checks every shape against the model.
  * entries are written into a temporary directory and renamed into place (a crash leaves no half entry; the
    manifest is the last file written); anything unreadable is a miss (and is deleted).
  * the whole cache stays under JAXINFER_PREPARED_CACHE_MAX_GB (default 8): least recently used entries go first,
    an entry larger than the cap is never written; storing an entry of a file deletes the entries of older
    versions of that same file.
  * JAXINFER_PREPARED_CACHE=0 turns it off (nothing read or written).
Delete the directory to clear it (or call clear()).
"""
from __future__ import annotations

import atexit
import contextlib
import functools
import hashlib
import json
import logging
import os
import shutil
import tempfile
import threading
from typing import Any

import numpy as np

from jaxinfer.env_switch import switch
from jaxinfer.weights.fingerprint import file_fingerprint

log = logging.getLogger("jaxinfer")

VERSION = 1
_lock = threading.Lock()
_writers: list[threading.Thread] = []
# Background writes wait for this (set by the runner's first completed step, release_writes(), or at exit):
# writing ~0.5 GB beside start-up's compiles made the cold start of the default model 17 s instead of 10 s of
# compiling on 2 cores.
_released = threading.Event()
RELEASE_TIMEOUT_S = 120.0


def enabled() -> bool:
    return switch("JAXINFER_PREPARED_CACHE")


def root() -> str:
    base = os.environ.get("JAXINFER_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "jaxinfer")
    return os.path.join(base, "prepared")


def max_bytes() -> int:
    return int(float(os.environ.get("JAXINFER_PREPARED_CACHE_MAX_GB", "8")) * (1 << 30))


@functools.lru_cache(maxsize=None)
def _layout_digest() -> str:
    """sha256 of the code that decides the prepared arrays' layout (loader, GGUF readers, architecture map)."""
    here = os.path.dirname(os.path.abspath(__file__))
    files = [os.path.join(here, f) for f in ("loader.py", "gguf.py", "gguf_reader.py")]
    files.append(os.path.join(os.path.dirname(here), "models", "registry.py"))
    h = hashlib.sha256(str(VERSION).encode())
    for p in files:
        with open(p, "rb") as f:
            h.update(f.read())
    return h.hexdigest()[:16]


def weights_variant(dtype) -> str:
    """The directory name of the float weights in `dtype` (a numpy / jnp dtype or its name)."""
    return f"{np.dtype(dtype).name}-{_layout_digest()}"


@functools.lru_cache(maxsize=8)
def _fingerprint(path: str, size: int, mtime_ns: int) -> str:
    return file_fingerprint(path)[:32]


def _entry_dir(path: str) -> str:
    st = os.stat(path)
    return os.path.join(root(), _fingerprint(os.path.realpath(path), st.st_size, st.st_mtime_ns))


# ---- metadata (hf_config, tokenizer) ------------------------------------------------------------------------
def load_metadata(path: str) -> dict:
    """The cached metadata of a GGUF file ({} when none or disabled)."""
    if not enabled():
        return {}
    try:
        with open(os.path.join(_entry_dir(path), "meta.json"), encoding="utf-8") as f:
            meta = json.load(f)
        return meta if meta.get("version") == VERSION else {}
    except (OSError, ValueError):
        return {}


def store_metadata(path: str, **fields: Any) -> None:
    """Merge `fields` into the file's meta.json (atomically); errors are logged, never raised."""
    if not enabled():
        return
    try:
        d = _entry_dir(path)
        with _lock:
            meta = load_metadata(path) or {"version": VERSION, "source": os.path.realpath(path)}
            meta.update(fields)
            os.makedirs(d, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix="meta.", suffix=".part", dir=d)
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(meta, f)
            os.replace(tmp, os.path.join(d, "meta.json"))
        _drop_other_versions(path, d)
    except OSError as e:
        log.debug("prepared cache: metadata not stored (%s)", e)


# ---- weights ------------------------------------------------------------------------------------------------
def load_weights(path: str, variant: str) -> dict[tuple, np.ndarray] | None:
    """{module path: read-only memory-mapped array} of a stored variant, or None (a miss)."""
    if not enabled():
        return None
    d = os.path.join(_entry_dir(path), variant)
    try:
        with open(os.path.join(d, "manifest.json"), encoding="utf-8") as f:
            manifest = json.load(f)
        if manifest.get("version") != VERSION or manifest.get("variant") != variant:
            raise ValueError(f"manifest of version {manifest.get('version')}, variant {manifest.get('variant')}")
        out = {}
        for p, fname, dtype, shape in manifest["tensors"]:
            raw = np.load(os.path.join(d, fname), mmap_mode="r")
            arr = raw.view(_dtype(dtype))
            if tuple(arr.shape) != tuple(shape):
                raise ValueError(f"{fname} has shape {arr.shape}, manifest says {shape}")
            out[tuple(p)] = arr
        with contextlib.suppress(OSError):
            os.utime(os.path.join(d, "manifest.json"))  # recently used: trimmed last
        return out
    except FileNotFoundError:
        return None
    except Exception as e:  # noqa: BLE001  a damaged entry: drop it and load from the file
        log.warning("prepared cache: ignoring %s (%s: %s)", d, type(e).__name__, e)
        shutil.rmtree(d, ignore_errors=True)
        return None


def _dtype(name: str):
    try:
        return np.dtype(name)
    except TypeError:  # bfloat16 & co. live in ml_dtypes
        import ml_dtypes

        return np.dtype(getattr(ml_dtypes, name))


def store_weights(path: str, variant: str, arrays: dict[tuple, np.ndarray], background: bool = True) -> None:
    """Write `arrays` ({module path: host array}) as the file's `variant` (on a non-daemon thread when
    background: it starts once release_writes() is called (or after RELEASE_TIMEOUT_S), and the process waits for
    it at exit; never raises)."""
    if not enabled():
        return
    size = sum(a.nbytes for a in arrays.values())
    if size > max_bytes():
        log.info("prepared cache: %.2f GiB of weights exceed the %.2f GiB cap; not stored", size / 2**30,
                 max_bytes() / 2**30)
        return
    if background:
        if not _writers:
            atexit.register(wait_for_writes)
        t = threading.Thread(target=_write_when_released, args=(path, variant, arrays), daemon=True,
                             name="jaxinfer-prepared-write")
        t.start()
        _writers.append(t)
    else:
        _write(path, variant, arrays)


def release_writes() -> None:
    """Let the background writes start (the engine's first step is done: start-up's compiles are over)."""
    _released.set()


def wait_for_writes() -> None:
    """Release and join the background writers (tests; registered to run at exit)."""
    _released.set()
    while _writers:
        _writers.pop().join()


def _write_when_released(path: str, variant: str, arrays: dict[tuple, np.ndarray]) -> None:
    _released.wait(RELEASE_TIMEOUT_S)
    _write(path, variant, arrays)


def _write(path: str, variant: str, arrays: dict[tuple, np.ndarray]) -> None:
    tmp = None
    try:
        base = _entry_dir(path)
        final = os.path.join(base, variant)
        if os.path.exists(os.path.join(final, "manifest.json")):
            return
        os.makedirs(base, exist_ok=True)
        tmp = tempfile.mkdtemp(prefix=variant + ".", suffix=".part", dir=base)
        tensors = []
        for i, (p, a) in enumerate(arrays.items()):
            a = np.ascontiguousarray(a)
            fname = f"t{i:04d}.npy"
            raw = a.view(f"u{a.dtype.itemsize}") if a.dtype.kind == "V" or a.dtype.name == "bfloat16" else a
            np.save(os.path.join(tmp, fname), raw, allow_pickle=False)
            tensors.append([list(p), fname, a.dtype.name, list(a.shape)])
        with open(os.path.join(tmp, "manifest.json"), "w", encoding="utf-8") as f:
            json.dump({"version": VERSION, "variant": variant, "tensors": tensors}, f)
        try:
            os.rename(tmp, final)
            tmp = None
        except OSError:  # another process stored it first
            pass
        _drop_other_versions(path, base)
        trim()
    except Exception as e:  # noqa: BLE001  a full disk or a read-only cache: loading still worked
        log.warning("prepared cache: weights not stored (%s: %s)", type(e).__name__, e)
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


def _drop_other_versions(path: str, keep: str) -> None:
    """Delete the entries of earlier versions of the same file (same realpath, other fingerprint)."""
    src = os.path.realpath(path)
    with contextlib.suppress(OSError):
        for e in os.scandir(root()):
            if e.is_dir() and e.path != keep:
                try:
                    with open(os.path.join(e.path, "meta.json"), encoding="utf-8") as f:
                        other = json.load(f).get("source")
                except (OSError, ValueError):
                    continue
                if other == src:
                    shutil.rmtree(e.path, ignore_errors=True)


def _dir_bytes(d: str) -> int:
    return sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(d) for f in fs)


def trim(limit: int | None = None) -> None:
    """Delete least recently used weight variants until the cache holds at most `limit` bytes (max_bytes())."""
    limit = max_bytes() if limit is None else limit
    entries = []
    with contextlib.suppress(OSError):
        for fp in os.scandir(root()):
            if fp.is_dir():
                for v in os.scandir(fp.path):
                    m = os.path.join(v.path, "manifest.json")
                    if v.is_dir() and os.path.exists(m):
                        entries.append((os.path.getmtime(m), _dir_bytes(v.path), v.path))
    total = sum(s for _, s, _ in entries)
    for _, size, d in sorted(entries):
        if total <= limit:
            break
        shutil.rmtree(d, ignore_errors=True)
        total -= size


def clear() -> None:
    """Delete the whole prepared-weights cache."""
    shutil.rmtree(root(), ignore_errors=True)
