"""The station judges an upload from its first bytes and its JPEG scans before Pillow decodes anything."""

import io

import pytest
from PIL import Image

from dgx_assets.station.runtime import (
    TooCostlyToDecode,
    UnsupportedFormat,
    check_format,
    check_jpeg_scans,
    count_jpeg_scans,
)


def encoded(format_name: str, **options) -> bytes:
    out = io.BytesIO()
    Image.linear_gradient("L").resize((64, 64)).convert("RGB").save(out, format=format_name, **options)
    return out.getvalue()


@pytest.mark.parametrize("format_name", ["PNG", "JPEG", "BMP", "TIFF"])
def test_what_a_camera_writes_is_taken(format_name):
    assert check_format(encoded(format_name)) == format_name


@pytest.mark.parametrize(("format_name", "named"), [("GIF", "GIF"), ("ICO", "ICO"), ("WEBP", "WEBP"), ("PPM", None)])
def test_other_formats_are_refused_by_their_magic_bytes(format_name, named):
    with pytest.raises(UnsupportedFormat, match=f"a {named} file" if named else "not a known image format"):
        check_format(encoded(format_name))


def test_a_setting_narrows_the_formats():
    with pytest.raises(UnsupportedFormat, match="the station takes PNG"):
        check_format(encoded("JPEG"), formats=("PNG",))


def test_progressive_jpeg_scans_are_counted_and_bounded():
    baseline, progressive = encoded("JPEG"), encoded("JPEG", progressive=True)
    assert count_jpeg_scans(baseline) == 1 and count_jpeg_scans(progressive) > 1
    check_jpeg_scans(progressive, max_scans=64)
    with pytest.raises(TooCostlyToDecode, match="--max-jpeg-scans"):
        check_jpeg_scans(progressive, max_scans=count_jpeg_scans(progressive) - 1)
