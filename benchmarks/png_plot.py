"""A dependency-free PNG line chart (numpy + zlib), for machines without matplotlib (the GPU image has none).

Plots series of (x, y) on a log-x / linear-y panel, with a 3x5 pixel font for the title, tick values and the
legend. Crude, but the figures are readable and the exact numbers are in the JSON next to it.
"""
from __future__ import annotations

import math
import struct
import zlib

import numpy as np

_GLYPHS = {  # 3x5, rows top to bottom, bit 2 = left column
    "0": "75557", "1": "26227", "2": "71747", "3": "71717", "4": "55711", "5": "74717", "6": "74757", "7": "71111",
    "8": "75757", "9": "75717", ".": "00002", "/": "11244", "-": "00700", " ": "00000", "(": "24442", ")": "42224",
    "A": "25755", "B": "65656", "C": "74447", "D": "65556", "E": "74647", "F": "74644", "G": "74557", "H": "55755",
    "I": "72227", "J": "11157", "K": "55655", "L": "44447", "M": "57555", "N": "65555", "O": "75557", "P": "75744",
    "Q": "75573", "R": "75655", "S": "74717", "T": "72222", "U": "55557", "V": "55552", "W": "55575", "X": "55255",
    "Y": "55222", "Z": "71247", ":": "02020", "_": "00007", "=": "07070",
}
_COLORS = [(31, 119, 180), (214, 39, 40), (44, 160, 44), (255, 127, 14), (148, 103, 189), (140, 86, 75)]


def _text(img, x, y, s, color=(0, 0, 0), scale=2):
    for ch in s.upper():
        g = _GLYPHS.get(ch, _GLYPHS[" "])
        for r, row in enumerate(g):
            bits = int(row, 16)
            for c in range(3):
                if bits & (4 >> c):
                    img[y + r * scale:y + (r + 1) * scale, x + c * scale:x + (c + 1) * scale] = color
        x += 4 * scale
    return x


def _line(img, x0, y0, x1, y1, color, w=2):
    n = int(max(abs(x1 - x0), abs(y1 - y0))) + 1
    for t in np.linspace(0, 1, n):
        x, y = int(round(x0 + (x1 - x0) * t)), int(round(y0 + (y1 - y0) * t))
        img[max(y - w // 2, 0):y + w - w // 2, max(x - w // 2, 0):x + w - w // 2] = color


def _png(img: np.ndarray) -> bytes:
    h, w, _ = img.shape
    raw = b"".join(b"\x00" + img[i].tobytes() for i in range(h))

    def chunk(tag, data):
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))


def panel(img, x0, y0, w, h, title, series):
    """series: list of (label, xs, ys). Draw one log-x panel with its box at (x0, y0) size (w, h)."""
    xs = [x for _, sx, _ in series for x in sx if x > 0]
    ys = [y for _, _, sy in series for y in sy if y == y]
    if not xs or not ys:
        return
    lx0, lx1 = math.log10(min(xs)), math.log10(max(xs))
    lx1 = lx1 if lx1 > lx0 else lx0 + 1
    ymax = max(ys) * 1.1 or 1.0
    px = lambda x: x0 + 10 + (math.log10(x) - lx0) / (lx1 - lx0) * (w - 20)  # noqa: E731
    py = lambda y: y0 + h - (y / ymax) * h  # noqa: E731
    img[y0:y0 + h, x0] = img[y0 + h, x0:x0 + w] = (0, 0, 0)
    _text(img, x0, y0 - 26, title)
    for x in sorted(set(xs)):
        _text(img, int(px(x)) - 6, y0 + h + 6, f"{x:g}")
    for k in range(5):
        y = ymax * k / 4
        img[int(py(y)), x0:x0 + w:4] = (200, 200, 200)
        _text(img, x0 - 70, int(py(y)) - 5, f"{y:.4g}")
    for i, (label, sx, sy) in enumerate(series):
        color = _COLORS[i % len(_COLORS)]
        pts = [(px(x), py(y)) for x, y in zip(sx, sy) if x > 0 and y == y]
        for (a, b), (c, d) in zip(pts, pts[1:]):
            _line(img, a, b, c, d, color)
        for a, b in pts:
            img[int(b) - 3:int(b) + 4, int(a) - 3:int(a) + 4] = color
        _text(img, x0 + w - 200, y0 + 8 + 16 * i, label, color)


def write_chart(path: str, panels: list[tuple[str, list]], xlabel: str) -> str:
    """panels: [(title, series)], side by side; series as in `panel`."""
    w, h = 520, 360
    img = np.full((h + 130, 90 + len(panels) * (w + 110), 3), 255, np.uint8)
    for k, (title, series) in enumerate(panels):
        x0 = 90 + k * (w + 110)
        panel(img, x0, 60, w, h, title, series)
        _text(img, x0 + w // 2 - 60, h + 100, xlabel)
    with open(path, "wb") as f:
        f.write(_png(img))
    return path
