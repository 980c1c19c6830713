"""The JAXINFER_* on / off switches read from the environment, with one spelling of "off" for all of them:
"0", "false", "no" or "off" (any case, surrounding spaces ignored); anything else set means on. Also the one
check of a positive number of seconds that settings from the environment and the command line share. Imports
nothing but os (runner/xla_env.py reads its switch before jax starts)."""
from __future__ import annotations

import os
from collections.abc import Mapping

OFF_VALUES = ("0", "false", "no", "off")


def is_off(value: str) -> bool:
    return value.strip().lower() in OFF_VALUES


def switch(name: str, default: bool = True, environ: Mapping[str, str] | None = None) -> bool:
    """Whether switch `name` is on: `default` when unset."""
    value = (os.environ if environ is None else environ).get(name)
    return default if value is None else not is_off(value)


def auto_switch(name: str, environ: Mapping[str, str] | None = None) -> bool | None:
    """A switch whose default the caller decides (e.g. by backend): None when unset or "auto", else as switch()."""
    value = (os.environ if environ is None else environ).get(name)
    return None if value is None or value.strip().lower() == "auto" else not is_off(value)


def positive_seconds(text: str, name: str | None = None) -> float:
    """float(text) when it is a positive number of seconds, else a ValueError naming the value (and `name`, the
    setting it came from)."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:  # (also NaN)
        where = f"{name}=" if name else ""
        raise ValueError(f"{where}{text!r} is not a positive number of seconds (e.g. 0.0005)")
    return value
