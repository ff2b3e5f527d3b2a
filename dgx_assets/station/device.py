"""The device side of the edge contract (edge/convert.py's docstring): its tensor names and its decoding.

numpy and Pillow only, so the edge runtime (`pip install '.[edge]'`) runs it without TensorFlow or pydantic.
"""

from __future__ import annotations

import io

import numpy as np

SIGNATURE_KEY = "serving_default"
INPUT_NAME = "image"
OUTPUT_NAME = "probabilities"


def decode_to_raw(content: bytes, raw_height: int, raw_width: int, channels: int) -> np.ndarray:
    """What the device does: decode an image file to uint8 [raw_height, raw_width, channels]."""
    from PIL import Image

    if channels not in (1, 3):
        raise ValueError(f"edge models take 1 (grey) or 3 (RGB) channels, not {channels}")
    with Image.open(io.BytesIO(content)) as image:
        image.load()
        if image.mode in ("I;16", "I;16B", "I;16L", "I"):
            # 16-bit sensors: scale to 8 bits as image_features does, rather than clipping above 255.
            wide = np.asarray(image, dtype=np.float64)
            full_scale = 65535.0 if image.mode.startswith("I;16") else max(1.0, float(wide.max()))
            image = Image.fromarray(np.round(wide / full_scale * 255.0).astype(np.uint8), mode="L")
        image = image.convert("L" if channels == 1 else "RGB")
        if image.size != (raw_width, raw_height):
            image = image.resize((raw_width, raw_height), Image.Resampling.BILINEAR)
        pixels = np.asarray(image, dtype=np.uint8)
    return pixels.reshape(raw_height, raw_width, channels)
