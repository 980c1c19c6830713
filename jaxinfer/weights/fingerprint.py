"""A cheap identity of a (large) weights file: what the prepared-weights cache is keyed by (weights/prepared.py).

fingerprint = sha256(size, mtime_ns, first 1 MiB, last 1 MiB): reads 2 MiB whatever the file's size, and changes
when the file is replaced, rewritten or touched (a changed mtime is a miss even for identical bytes: cheap to
redo, never wrong). A file edited in its middle with its size and mtime restored by hand is the one case it misses.
"""
from __future__ import annotations

import hashlib
import os

_SAMPLE = 1 << 20


def file_fingerprint(path: str | os.PathLike) -> str:
    """Hex digest of the file's size, mtime and its first and last MiB (see the module docstring)."""
    path = os.fspath(path)
    st = os.stat(path)
    h = hashlib.sha256(f"{st.st_size}:{st.st_mtime_ns}:".encode())
    with open(path, "rb") as f:
        h.update(f.read(_SAMPLE))
        if st.st_size > _SAMPLE:
            f.seek(max(_SAMPLE, st.st_size - _SAMPLE))
            h.update(f.read(_SAMPLE))
    return h.hexdigest()
