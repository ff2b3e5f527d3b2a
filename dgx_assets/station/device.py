"""The device side of the edge contract (edge/convert.py's docstring): its tensor names and its decoding.

numpy and Pillow only, so the edge runtime (`pip install '.[edge]'`) runs it without TensorFlow or pydantic.
"""

from __future__ import annotations

import io
import time

import numpy as np

DECODE_BLOCK_BYTES = 1024  # what the decoder is fed at a time, so the deadline is checked often


class DeadlinePassed(Exception):
    """The decode passed its deadline: raised from the next read the decoder makes."""


class _DeadlineReader(io.BytesIO):
    """The image's bytes, refusing to hand over more once the deadline has passed."""

    def __init__(self, content: bytes, deadline: float | None):
        super().__init__(content)
        self.deadline = deadline

    def check(self) -> None:
        if self.deadline is not None and time.monotonic() > self.deadline:
            raise DeadlinePassed

    def read(self, size: int | None = -1, /) -> bytes:
        self.check()
        return super().read(size)


SIGNATURE_KEY = "serving_default"
INPUT_NAME = "image"
OUTPUT_NAME = "probabilities"


def decode_to_raw(
    content: bytes,
    raw_height: int,
    raw_width: int,
    channels: int,
    formats: tuple[str, ...] | None = None,
    deadline: float | None = None,
    max_pixels: int | None = None,
) -> np.ndarray:
    """What the device does: decode an image file to uint8 [raw_height, raw_width, channels]. The station
    also gives the only ``formats`` opened, a ``deadline`` (time.monotonic(); DeadlinePassed once past it,
    checked each time the decoder reads a block) and ``max_pixels``, its budget of decoded 8-bit pixels."""
    from PIL import Image, ImageMode

    if channels not in (1, 3):
        raise ValueError(f"edge models take 1 (grey) or 3 (RGB) channels, not {channels}")
    source = _DeadlineReader(content, deadline)
    with Image.open(source, formats=formats) as image:
        if max_pixels is not None:  # what will be decoded, whatever the header check read
            described = ImageMode.getmode(image.mode)
            cost = image.width * image.height * len(described.bands) * np.dtype(described.typestr).itemsize
            if cost > max_pixels:
                raise ValueError(f"a {image.width}x{image.height} {image.mode} frame is over the pixel budget")
        image.decodermaxblock = DECODE_BLOCK_BYTES
        image.load()
        source.check()
        if image.mode in ("I;16", "I;16B", "I;16L", "I"):
            # 16-bit sensors: scale to 8 bits as image_features does, rather than clipping above 255.
            wide = np.asarray(image, dtype=np.float64)
            full_scale = 65535.0 if image.mode.startswith("I;16") else max(1.0, float(wide.max()))
            image = Image.fromarray(np.round(wide / full_scale * 255.0).astype(np.uint8), mode="L")
        image = image.convert("L" if channels == 1 else "RGB")
        source.check()
        if image.size != (raw_width, raw_height):
            image = image.resize((raw_width, raw_height), Image.Resampling.BILINEAR)
        pixels = np.asarray(image, dtype=np.uint8)
    return pixels.reshape(raw_height, raw_width, channels)
