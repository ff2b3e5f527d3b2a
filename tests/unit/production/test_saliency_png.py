"""The review queue's saliency picture: a heatmap blended over the cell, as PNG (no TensorFlow here)."""

import io

import numpy as np
import pytest
from PIL import Image

from dgx_assets.production.saliency import overlay_png

HEIGHT, WIDTH = 60, 80  # not square: height and width must not swap


def _cell() -> np.ndarray:
    return np.random.default_rng(0).integers(0, 256, (HEIGHT, WIDTH), dtype=np.uint8)


def _hot_spot(row: int, column: int) -> np.ndarray:
    y, x = np.mgrid[0:HEIGHT, 0:WIDTH]
    return np.exp(-((y - row) ** 2 + (x - column) ** 2) / 200.0)


def _decoded(png: bytes) -> Image.Image:
    image = Image.open(io.BytesIO(png))
    image.load()
    return image


@pytest.mark.parametrize("shape", [(HEIGHT, WIDTH), (HEIGHT, WIDTH, 1), (HEIGHT, WIDTH, 3)])
def test_the_overlay_is_an_rgb_png_of_the_image_size(shape):
    pixels = np.broadcast_to(_cell()[..., None], (HEIGHT, WIDTH, 3))[..., : shape[-1]] if len(shape) == 3 else _cell()
    image = _decoded(overlay_png(pixels.astype(np.float32), _hot_spot(20, 30)))
    assert (image.format, image.mode, image.size) == ("PNG", "RGB", (WIDTH, HEIGHT))


def test_the_same_input_gives_the_same_bytes_and_other_heat_another_picture():
    cell, heat = _cell(), _hot_spot(20, 30)
    assert overlay_png(cell, heat) == overlay_png(cell.copy(), heat.copy())
    here, there = (np.asarray(_decoded(overlay_png(cell, h))) for h in (heat, _hot_spot(45, 70)))
    assert not np.array_equal(here, there)
    # Each picture is reddest where its own heat is.
    redness = [picture[..., 0].astype(int) - picture[..., 2] for picture in (here, there)]
    assert redness[0][20, 30] > redness[1][20, 30] and redness[1][45, 70] > redness[0][45, 70]


def test_alpha_runs_from_the_image_to_the_colour_map():
    import matplotlib

    cell = _cell()
    plain = np.asarray(_decoded(overlay_png(cell, _hot_spot(20, 30), alpha=0.0)))
    assert np.array_equal(plain, np.repeat(cell[..., None], 3, axis=-1))  # grey, repeated to RGB
    full = np.asarray(_decoded(overlay_png(cell, np.ones((HEIGHT, WIDTH)), alpha=1.0)))
    hottest = np.rint(np.asarray(matplotlib.colormaps["jet"](1.0)[:3]) * 255)
    assert (full == hottest).all()


@pytest.mark.parametrize(
    ("pixels", "heatmap", "alpha", "message"),
    [
        (_cell(), np.zeros((WIDTH, HEIGHT)), 0.4, r"heatmap is \(80, 60\), the image \(60, 80\)"),
        (_cell(), np.full((HEIGHT, WIDTH), np.nan), 0.4, "NaN or infinite"),
        (_cell(), np.full((HEIGHT, WIDTH), 1.5), 0.4, r"must lie in \[0, 1\], got 1.5..1.5"),
        (_cell(), np.zeros((HEIGHT, WIDTH)), 1.2, "alpha must lie in"),
        (np.zeros((HEIGHT, WIDTH, 2)), np.zeros((HEIGHT, WIDTH)), 0.4, "grey .* or RGB"),
        (np.full((HEIGHT, WIDTH), np.inf), np.zeros((HEIGHT, WIDTH)), 0.4, "image holds NaN"),
    ],
)
def test_bad_inputs_are_refused_with_what_is_wrong(pixels, heatmap, alpha, message):
    with pytest.raises(ValueError, match=message):
        overlay_png(pixels, heatmap, alpha)
