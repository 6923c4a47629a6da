"""A loss-curve PNG from numpy and zlib alone (no plotting library needed).

Draws axes, the train-loss line, eval-loss dots and tick labels in a 3x5
pixel digit font scaled 2x: enough to read a curve in the Dagster UI.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Sequence

import numpy as np

_FONT = {  # 3x5 glyphs, rows top to bottom, 3 bits each
    "0": (7, 5, 5, 5, 7),
    "1": (2, 6, 2, 2, 7),
    "2": (7, 1, 7, 4, 7),
    "3": (7, 1, 7, 1, 7),
    "4": (5, 5, 7, 1, 1),
    "5": (7, 4, 7, 1, 7),
    "6": (7, 4, 7, 5, 7),
    "7": (7, 1, 1, 1, 1),
    "8": (7, 5, 7, 5, 7),
    "9": (7, 5, 7, 1, 7),
    ".": (0, 0, 0, 0, 2),
    "-": (0, 0, 7, 0, 0),
    "e": (0, 7, 7, 4, 7),
    " ": (0, 0, 0, 0, 0),
}
_BLUE, _RED, _GREY, _BLACK = (31, 119, 180), (214, 39, 40), (220, 220, 220), (0, 0, 0)


def encode_png(rgb: np.ndarray) -> bytes:
    """uint8 (H, W, 3) -> PNG bytes."""
    h, w, _ = rgb.shape
    raw = b"".join(b"\x00" + rgb[y].tobytes() for y in range(h))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data))
            + kind
            + data
            + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
        )

    header = struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(raw, 9))
        + chunk(b"IEND", b"")
    )


def _text(img: np.ndarray, x: int, y: int, s: str, scale: int = 2) -> None:
    for ch in s:
        glyph = _FONT.get(ch, _FONT[" "])
        for row, bits in enumerate(glyph):
            for col in range(3):
                if bits >> (2 - col) & 1:
                    y0, x0 = y + row * scale, x + col * scale
                    img[max(y0, 0) : y0 + scale, max(x0, 0) : x0 + scale] = _BLACK
        x += 4 * scale


def _line(
    img: np.ndarray, x0: float, y0: float, x1: float, y1: float, color: tuple[int, int, int]
) -> None:
    n = int(max(abs(x1 - x0), abs(y1 - y0))) + 1
    xs = np.rint(np.linspace(x0, x1, n)).astype(int)
    ys = np.rint(np.linspace(y0, y1, n)).astype(int)
    h, w, _ = img.shape
    for dy in (0, 1):
        ok = (ys + dy >= 0) & (ys + dy < h) & (xs >= 0) & (xs < w)
        img[ys[ok] + dy, xs[ok]] = color


def _fmt(v: float) -> str:
    return f"{v:.3g}"


def loss_curve_png(
    train: Sequence[tuple[int, float]],
    evals: Sequence[tuple[int, float]] = (),
    width: int = 640,
    height: int = 360,
) -> bytes:
    """PNG of train loss (blue line) and eval loss (red dots) against step."""
    img = np.full((height, width, 3), 255, np.uint8)
    left, right, top, bottom = 70, width - 20, 20, height - 40
    points = [p for p in (*train, *evals) if np.isfinite(p[1])]
    if not points:
        return encode_png(img)
    steps = np.array([p[0] for p in points], float)
    losses = np.array([p[1] for p in points], float)
    s0, s1 = float(steps.min()), float(max(steps.max(), steps.min() + 1))
    l0, l1 = float(losses.min()), float(losses.max())
    if l1 - l0 < 1e-9:
        l0, l1 = l0 - 0.5, l1 + 0.5

    def px(step: float, loss: float) -> tuple[float, float]:
        return (
            left + (step - s0) / (s1 - s0) * (right - left),
            bottom - (loss - l0) / (l1 - l0) * (bottom - top),
        )

    for k in range(5):
        y = top + k * (bottom - top) / 4
        _line(img, left, y, right, y, _GREY)
        _text(img, 4, int(y) - 5, _fmt(l1 - k * (l1 - l0) / 4))
    _line(img, left, top, left, bottom, _BLACK)
    _line(img, left, bottom, right, bottom, _BLACK)
    _text(img, left - 4, bottom + 10, _fmt(s0))
    label = _fmt(s1)
    _text(img, right - 8 * len(label), bottom + 10, label)
    pts = [px(s, v) for s, v in train if np.isfinite(v)]
    for (xa, ya), (xb, yb) in zip(pts, pts[1:], strict=False):
        _line(img, xa, ya, xb, yb, _BLUE)
    if len(pts) == 1:
        _line(img, pts[0][0] - 2, pts[0][1], pts[0][0] + 2, pts[0][1], _BLUE)
    for s, v in evals:
        if np.isfinite(v):
            x, y = px(s, v)
            img[max(int(y) - 3, 0) : int(y) + 4, max(int(x) - 3, 0) : int(x) + 4] = _RED
    return encode_png(img)
