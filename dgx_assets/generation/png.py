"""What a generated image must be before it enters the table: a decodable PNG of the size asked for, under a
file name that is safe whatever the prompt's id holds."""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import re

from dgx_assets.generation.table import CORRUPTED, DECODE_ERROR, VALID


def safe_file_name(prompt_id: str | None, request_key: str) -> str:
    """A file name that is safe on any filesystem whatever the id holds ('../../etc/passwd', '', 'a/b').

    Readable part from the id, plus a hash that keeps different ids (and different prompts under the
    same id) from ever sharing a file.
    """
    readable = re.sub(r"[^A-Za-z0-9._-]+", "_", prompt_id or "").strip("._-")[:60] or "prompt"
    digest = hashlib.sha256(f"{prompt_id}\x1f{request_key}".encode("utf-8", "replace")).hexdigest()[:12]
    return f"{readable}-{digest}.png"


def classify_image(payload_b64: str | None, width: int, height: int) -> tuple[str, bytes | None, str | None]:
    """(status, PNG bytes for valid images, reason) for one reply's image."""
    from PIL import Image, UnidentifiedImageError

    try:
        data = base64.b64decode(payload_b64 or "", validate=True)
    except (binascii.Error, ValueError):
        return DECODE_ERROR, None, "the reply's image is not valid base64"
    if not data:
        return DECODE_ERROR, None, "the reply's image is empty"
    try:
        image = Image.open(io.BytesIO(data))
        kind = image.format
    except UnidentifiedImageError:
        return DECODE_ERROR, None, f"not an image: {len(data)} bytes starting {data[:8].hex()}"
    except Exception as error:  # any decoder failure is a classification, not a crash
        return DECODE_ERROR, None, f"not an image: {type(error).__name__}: {error}"[:300]
    try:
        image.verify()  # chunk CRCs and structure
        with Image.open(io.BytesIO(data)) as decoded:
            decoded.load()  # every pixel: a truncated stream fails here
            size = decoded.size
            if kind != "PNG":  # the PNG files and the table hold PNG whatever the server sent
                buffer = io.BytesIO()
                decoded.save(buffer, format="PNG")
                data = buffer.getvalue()
    except Exception as error:
        return CORRUPTED, None, f"damaged {kind}: {type(error).__name__}: {error}"[:300]
    if size != (width, height):
        return CORRUPTED, None, f"image is {size[0]}x{size[1]}, asked for {width}x{height}"
    return VALID, data, None
