"""Save / restore a loaded model as an orbax checkpoint, for fast reloads (no GGUF dequantization, no
safetensors conversion, and restore lands straight on the target devices with the target shardings).

Layout of a checkpoint directory:
    <path>/state/                    orbax StandardCheckpointer output: the params pytree (a nested dict of arrays)
    <path>/config.json               the Hugging Face style config dict the model was built from
    <path>/tokenizer.json, ...       tokenizer files (tokenizer.save_pretrained), when a tokenizer was given
    <path>/jaxinfer_checkpoint.json  marker, written last: a directory without it is an interrupted save

The pytree is generic: e.g. `nnx.State.to_pure_dict()` of the model. Integer keys (nnx list indices) are
kept when restoring with an abstract tree; without one, orbax returns them as strings.
"""

from __future__ import annotations

import json
import os
import shutil
from typing import Any

_MARKER = "jaxinfer_checkpoint.json"
_STATE_DIR = "state"
_FORMAT_VERSION = 1
# Files a Hugging Face tokenizer directory may hold; copied when save_checkpoint gets a directory.
_TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
    "chat_template.json", "tokenizer.model", "vocab.json", "merges.txt", "added_tokens.json",
    "generation_config.json",
)  # fmt: skip


def _checkpointer():
    import orbax.checkpoint as ocp  # heavy import, only when checkpoints are used

    return ocp.StandardCheckpointer()


def is_orbax_checkpoint(path: str | os.PathLike) -> bool:
    """True when `path` is a complete checkpoint written by save_checkpoint."""
    path = os.fspath(path)
    return (
        os.path.isfile(os.path.join(path, _MARKER))
        and os.path.isdir(os.path.join(path, _STATE_DIR))
        and os.path.isfile(os.path.join(path, "config.json"))
    )


def save_checkpoint(
    path: str | os.PathLike,
    params_state: Any,
    hf_config: dict,
    tokenizer: Any = None,
    *,
    overwrite: bool = False,
) -> str:
    """Write `params_state` (nested dict of jax arrays), `hf_config` and the tokenizer to directory `path`.

    tokenizer: a transformers tokenizer (saved with save_pretrained), a directory holding tokenizer files
    (copied), or None. Returns the absolute checkpoint path. Raises FileExistsError when `path` already holds
    files and overwrite is False.
    """
    path = os.path.abspath(os.fspath(path))  # orbax requires absolute paths
    if os.path.exists(path) and os.listdir(path):
        if not overwrite:
            raise FileExistsError(
                f"checkpoint directory {path!r} is not empty; pick a new path or pass overwrite=True."
            )
        shutil.rmtree(path)
    os.makedirs(path, exist_ok=True)

    ckpt = _checkpointer()
    ckpt.save(os.path.join(path, _STATE_DIR), params_state)
    ckpt.wait_until_finished()  # save is async; the marker below must only appear after the arrays are on disk

    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(hf_config, f, indent=2, sort_keys=True)
    if tokenizer is None:
        pass
    elif hasattr(tokenizer, "save_pretrained"):
        tokenizer.save_pretrained(path)
    elif os.path.isdir(os.fspath(tokenizer)):
        copied = [n for n in _TOKENIZER_FILES if os.path.isfile(os.path.join(tokenizer, n))]
        if not copied:
            raise ValueError(
                f"tokenizer directory {os.fspath(tokenizer)!r} holds none of {', '.join(_TOKENIZER_FILES)}; "
                "pass the tokenizer object or the directory it was loaded from."
            )
        for name in copied:
            shutil.copy2(os.path.join(tokenizer, name), os.path.join(path, name))
    else:
        raise TypeError(
            f"tokenizer={tokenizer!r} is neither a tokenizer with save_pretrained nor a directory; pass one or None."
        )

    with open(os.path.join(path, _MARKER), "w") as f:
        json.dump({"format": "jaxinfer-orbax", "version": _FORMAT_VERSION, "state": _STATE_DIR}, f)
    return path


def load_checkpoint_config(path: str | os.PathLike) -> dict:
    """The Hugging Face style config dict stored in a checkpoint."""
    _check(path)
    with open(os.path.join(os.fspath(path), "config.json")) as f:
        return json.load(f)


def restore_checkpoint(path: str | os.PathLike, abstract_state: Any = None) -> Any:
    """Restore the params pytree saved by save_checkpoint.

    abstract_state: a pytree matching the saved one whose leaves are jax.ShapeDtypeStruct with `sharding`
    set; arrays are restored straight into those shardings (and dtypes, converting if they differ).
    None restores onto the default device with the saved dtypes (and string keys for int dict keys).
    """
    _check(path)
    state_dir = os.path.join(os.path.abspath(os.fspath(path)), _STATE_DIR)
    return _checkpointer().restore(state_dir, abstract_state)


def _check(path: str | os.PathLike) -> None:
    if not is_orbax_checkpoint(path):
        raise FileNotFoundError(
            f"{os.fspath(path)!r} is not a complete jaxinfer checkpoint (needs {_MARKER}, {_STATE_DIR}/ and "
            "config.json); write one with jaxinfer.weights.checkpoint.save_checkpoint, or re-run an interrupted save."
        )
