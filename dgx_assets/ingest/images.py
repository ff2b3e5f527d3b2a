"""Deciding whether a file is a usable image: plain Python, run inside Spark's Python workers.

Each file gets a status (`valid` or a reason class) and a human-readable reason; nothing raises, so one
bad file never fails a Spark task. Sizes are checked from the header before any pixel is decoded, which
is what stops a decompression bomb.
"""

from __future__ import annotations

import hashlib
import io
import posixpath
import warnings
from dataclasses import dataclass

from PIL import Image, UnidentifiedImageError
from pydantic import BaseModel, ConfigDict, Field, model_validator

SUPPORTED_FORMATS = frozenset({"PNG", "JPEG", "BMP", "TIFF"})
IMAGE_EXTENSIONS = ("png", "jpg", "jpeg", "bmp", "tif", "tiff")
EXTENSION_FORMATS = {"png": "PNG", "jpg": "JPEG", "jpeg": "JPEG", "bmp": "BMP", "tif": "TIFF", "tiff": "TIFF"}

# Reason classes a file can be quarantined under (status column); `valid` is the only good one.
VALID = "valid"
EMPTY = "empty"
NOT_AN_IMAGE = "not_an_image"
CORRUPTED = "corrupted"
DECODE_ERROR = "decode_error"
UNSUPPORTED = "unsupported"
TOO_LARGE = "too_large"
ZERO_SIZE = "zero_size"
UNREADABLE = "unreadable"  # listed, then gone or forbidden when its worker came to read it
# Entries the landing listing refuses (landing.py): recorded with these statuses, never opened.
SYMLINK = "symlink"
SPECIAL_FILE = "special_file"
UNLISTABLE = "unlistable"
BAD_NAME = "bad_name"  # a name that is not valid UTF-8: no partition key, Parquet string or log line can hold it
REFUSED_STATUSES = (SYMLINK, SPECIAL_FILE, UNLISTABLE, BAD_NAME)
STATUSES = (
    VALID,
    EMPTY,
    NOT_AN_IMAGE,
    CORRUPTED,
    DECODE_ERROR,
    UNSUPPORTED,
    TOO_LARGE,
    ZERO_SIZE,
    UNREADABLE,
    *REFUSED_STATUSES,
)

SPLITS = ("train", "validation", "test")
# The split of a production image (a file directly in its batch folder, no label folder): kept, featurised and
# scored, never trained, validated or tested on.
UNLABELLED = "unlabelled"


class ValidationLimits(BaseModel):
    """Sizes past which a file is quarantined `too_large`, checked from the header before any pixel is decoded."""

    model_config = ConfigDict(frozen=True)

    max_pixels: int = Field(
        default=50_000_000, gt=0, description="Width × height past which a file is treated as a decompression bomb"
    )
    max_side: int = Field(default=30_000, gt=0, description="Longest width or height accepted, in pixels")
    max_file_bytes: int = Field(default=256 * 1024 * 1024, gt=0, description="Largest file read, in bytes")


class IngestSettings(ValidationLimits):
    """raw_images: what a landed file must be to count as valid, how images split, how big the Parquet files are."""

    validation_share: float = Field(
        default=0.15, ge=0, lt=1, description="Share of images in the validation split (stable: from the content hash)"
    )
    test_share: float = Field(default=0.15, ge=0, lt=1, description="Share of images in the test split")
    target_file_mb: int = Field(
        default=128, gt=0, description="About how much image data one Spark partition, and so one Parquet file, holds"
    )

    @model_validator(mode="after")
    def _train_split_left(self) -> IngestSettings:
        if self.validation_share + self.test_share >= 1:
            raise ValueError(
                f"validation_share ({self.validation_share}) + test_share ({self.test_share}) must be below 1: "
                "nothing would be left to train on"
            )
        return self

    @property
    def target_file_bytes(self) -> int:
        return self.target_file_mb * 1024 * 1024


@dataclass
class ImageVerdict:
    """One file's decode outcome: its status (valid or why not), the reason, and what the header said."""

    status: str
    reason: str
    format: str | None = None
    width: int | None = None
    height: int | None = None
    mode: str | None = None

    def as_dict(self) -> dict:
        return dict(vars(self))  # shallow: dataclasses.asdict deep-copies, and this runs once per file


_TRUNCATION_HINTS = (
    "truncated",
    "broken data stream",
    "unrecognized data stream",
    "crc",
    "unexpected end",
    "premature end",
    "incomplete",
    "decompressing data",
)
_SIGNATURES = {
    b"\x89PNG\r\n\x1a\n": "PNG",
    b"\xff\xd8\xff": "JPEG",
    b"BM": "BMP",
    b"II*\x00": "TIFF",
    b"MM\x00*": "TIFF",
}


def inspect_image(data: bytes, filename: str = "", limits: ValidationLimits = ValidationLimits()) -> ImageVerdict:
    """Decode `data` fully and say whether it is a usable image, and if not, why."""
    if not data:
        return ImageVerdict(EMPTY, "the file has zero bytes")
    if len(data) > limits.max_file_bytes:
        return ImageVerdict(TOO_LARGE, f"{len(data)} bytes is over the {limits.max_file_bytes}-byte limit")
    try:
        with warnings.catch_warnings():
            # Our own pixel limit below decides; Pillow's warning between 1x and 2x its default is noise here.
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data))
    except Image.DecompressionBombError as error:
        return ImageVerdict(TOO_LARGE, f"decompression bomb refused from the header: {error}")
    except UnidentifiedImageError:
        return _unidentified(data)
    except Exception as error:  # a malformed header can raise nearly anything inside a plugin
        return _decode_failure(error, stage="header")

    with image:
        fmt, (width, height), mode = image.format, image.size, image.mode
        described = {"format": fmt, "width": width, "height": height, "mode": mode}
        if fmt not in SUPPORTED_FORMATS:
            return ImageVerdict(UNSUPPORTED, f"{fmt} is not one of {', '.join(sorted(SUPPORTED_FORMATS))}", **described)
        if width <= 0 or height <= 0:
            return ImageVerdict(ZERO_SIZE, f"the image is {width}x{height}", **described)
        if width * height > limits.max_pixels or max(width, height) > limits.max_side:
            return ImageVerdict(
                TOO_LARGE,
                f"{width}x{height} exceeds the limit of {limits.max_pixels} pixels / {limits.max_side} per side "
                "(decompression bomb refused from the header, pixels not decoded)",
                **described,
            )
        try:
            image.load()
        except Exception as error:
            return _decode_failure(error, stage="pixels", **described)

    return ImageVerdict(VALID, _extension_note(filename, fmt), **described)


def _unidentified(data: bytes) -> ImageVerdict:
    """Pillow refused the header: a known signature means a damaged image, anything else is not an image."""
    fmt = next((name for magic, name in _SIGNATURES.items() if data.startswith(magic)), None)
    if fmt is None:
        return ImageVerdict(NOT_AN_IMAGE, "the content is not an image format Pillow recognises")
    if fmt == "PNG" and data[12:16] == b"IHDR" and len(data) >= 24:
        width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
        if width == 0 or height == 0:
            return ImageVerdict(ZERO_SIZE, f"the PNG header says {width}x{height}", format=fmt, width=width, height=height)
    return ImageVerdict(CORRUPTED, f"the file starts like a {fmt} but its header cannot be read", format=fmt)


def _decode_failure(error: Exception, stage: str, **described) -> ImageVerdict:
    message = f"{type(error).__name__}: {error}"
    lowered = message.lower()
    if isinstance(error, (SyntaxError, EOFError)) or any(hint in lowered for hint in _TRUNCATION_HINTS):
        return ImageVerdict(CORRUPTED, f"truncated or corrupt data while reading the {stage}: {message}", **described)
    return ImageVerdict(DECODE_ERROR, f"could not decode the {stage}: {message}", **described)


def _extension_note(filename: str, fmt: str) -> str:
    extension = posixpath.splitext(filename)[1].lstrip(".").lower()
    declared = EXTENSION_FORMATS.get(extension)
    if declared and declared != fmt:
        return f"extension .{extension} holds {fmt} data (decoded by content)"
    return ""


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def split_for(sha256: str, validation: float = 0.15, test: float = 0.15) -> str:
    """A stable train/validation/test assignment from the content hash: same bytes, same split."""
    bucket = int(sha256[:8], 16) / 0x1_0000_0000
    if bucket < test:
        return "test"
    if bucket < test + validation:
        return "validation"
    return "train"


def split_of(sha256: str, label: str | None, settings: IngestSettings) -> str:
    """A labelled image's stable split, or `unlabelled` for a production image (no label folder)."""
    if label is None:
        return UNLABELLED
    return split_for(sha256, settings.validation_share, settings.test_share)


def label_from_path(path: str, batch_path: str) -> str | None:
    """`<landing>/<batch>/<label>/<file>`: the folder right under the batch, or None for a file directly in it.

    Both arguments are compared by their path part, since Spark writes `file:/x` where we write `file:///x`.
    """
    relative = path_inside(path)[len(path_inside(batch_path).rstrip("/")) + 1 :]
    parts = relative.split("/")
    return parts[0] if len(parts) >= 2 else None


def path_inside(uri: str) -> str:
    """`file:/a/b`, `file:///a/b` or `hdfs://nn:8020/a/b` -> `/a/b`: the path part, as a pyarrow filesystem wants it.

    Hadoop writes paths unescaped, so this is string surgery, not URL parsing: a `#`, `?` or `%` in a file
    name stays as it is.
    """
    scheme, colon, rest = uri.partition(":")
    if not colon or "/" in scheme:  # a plain path
        return uri
    if rest.startswith("//"):
        rest = "/" + rest[2:].partition("/")[2]
    return rest
