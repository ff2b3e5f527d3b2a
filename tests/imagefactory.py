"""Real image bytes for tests: every form raw_images must accept, and every kind of bad file it must refuse."""

from __future__ import annotations

import io
import struct
import zlib
from pathlib import Path

import numpy as np
from PIL import Image


def encode(image: Image.Image, fmt: str, **params) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **params)
    return buffer.getvalue()


def gradient(size=(64, 48), seed=0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0 : size[1], 0 : size[0]]
    return ((x * 3 + y * 2 + rng.integers(0, 40, size=(size[1], size[0]))) % 256).astype(np.uint8)


def valid_images(seed: int = 0) -> dict[str, bytes]:
    """name -> bytes for every supported format and pixel form, including a file whose extension lies."""
    grey = gradient(seed=seed)
    rgb = np.stack([grey, np.roll(grey, 5, axis=1), 255 - grey], axis=-1)
    rgba = np.concatenate([rgb, np.full(grey.shape + (1,), 200, np.uint8)], axis=-1)
    return {
        "grey.png": encode(Image.fromarray(grey, "L"), "PNG"),
        "rgb.jpg": encode(Image.fromarray(rgb, "RGB"), "JPEG", quality=90),
        "rgba.png": encode(Image.fromarray(rgba, "RGBA"), "PNG"),
        "palette.png": encode(Image.fromarray(rgb, "RGB").convert("P", palette=Image.Palette.ADAPTIVE), "PNG"),
        "sixteen_bit.png": encode(Image.fromarray(grey.astype(np.uint16) * 257), "PNG"),
        "cmyk.jpg": encode(Image.fromarray(rgb, "RGB").convert("CMYK"), "JPEG"),
        "grey.bmp": encode(Image.fromarray(grey, "L"), "BMP"),
        "rgb.tif": encode(Image.fromarray(rgb, "RGB"), "TIFF"),
        "sixteen_bit.tiff": encode(Image.fromarray(grey.astype(np.uint16) * 257), "TIFF"),
        "png_named.jpg": encode(Image.fromarray(np.ascontiguousarray(grey[::-1]), "L"), "PNG"),  # the extension lies
    }


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def png_header_only(width: int, height: int) -> bytes:
    """A PNG whose header claims `width`x`height` (a bomb when huge) with almost no pixel data."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    idat = zlib.compress(b"\0" * 64)
    return b"\x89PNG\r\n\x1a\n" + _png_chunk(b"IHDR", ihdr) + _png_chunk(b"IDAT", idat) + _png_chunk(b"IEND", b"")


def bad_files() -> dict[str, tuple[bytes, str]]:
    """name -> (bytes, the status raw_images must give it)."""
    good_png = encode(Image.fromarray(gradient(), "L"), "PNG")
    good_jpg = encode(Image.fromarray(gradient(), "L"), "JPEG")
    corrupt_middle = bytearray(good_png)
    corrupt_middle[len(good_png) // 2 : len(good_png) // 2 + 40] = b"\xff" * 40
    return {
        "truncated.png": (good_png[: len(good_png) // 2], "corrupted"),
        "truncated.jpg": (good_jpg[: len(good_jpg) // 3], "corrupted"),
        "scrambled.png": (bytes(corrupt_middle), "corrupted"),
        "notes.png": (b"this is a text file, not an image\n" * 20, "not_an_image"),
        "empty.jpg": (b"", "empty"),
        "animation.png": (encode(Image.fromarray(gradient(), "L"), "GIF"), "unsupported"),
        "bomb.png": (png_header_only(100_000, 100_000), "too_large"),  # Pillow's own limit refuses it
        "over_limit.png": (png_header_only(9_000, 9_000), "too_large"),  # only our 50 Mpx limit refuses it
        "zero_width.png": (png_header_only(0, 10), "zero_size"),
    }


def write_batch(landing: Path, batch: str, labels=("defective", "functional"), seed: int = 0, bad: bool = True) -> dict:
    """A landing batch folder; returns {relative path: expected status}."""
    expected = {}
    for index, label in enumerate(labels):
        folder = landing / batch / label
        folder.mkdir(parents=True, exist_ok=True)
        for name, data in valid_images(seed=seed * 10 + index).items():
            (folder / name).write_bytes(data)
            expected[f"{label}/{name}"] = "valid"
    if bad:
        folder = landing / batch / labels[0]
        for name, (data, status) in bad_files().items():
            (folder / name).write_bytes(data)
            expected[f"{labels[0]}/{name}"] = status
    return expected


def write_mostly_corrupt_batch(landing: Path, batch: str = "bad") -> None:
    """Six truncated PNGs and one good one under `<landing>/<batch>/defective/`: 1 in 7 valid, below the gate."""
    folder = landing / batch / "defective"
    folder.mkdir(parents=True)
    for index in range(6):
        (folder / f"broken{index}.png").write_bytes(bad_files()["truncated.png"][0])
    (folder / "good.png").write_bytes(valid_images()["grey.png"])
