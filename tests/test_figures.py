"""How figures are written: the PNG Agg draws, again with a 256-colour palette, the same picture
up to the palette's rounding and a fraction of the file."""

from __future__ import annotations

import io

import numpy as np
from PIL import Image

from wtnmt.analysis.figures import _pyplot, write_palette_png


def drawn_png() -> bytes:
    """Four crossing coloured lines with a legend beside a greyscale map: the colours a κ/α
    figure and an attention map have, and many smoothed edges between them."""
    plt = _pyplot()
    fig, (lines, grid) = plt.subplots(1, 2, figsize=(8, 3))
    x = np.linspace(0, 10, 400)
    for k in range(4):
        lines.plot(x, np.sin(x + k), label=f"branch {k + 1}")
    lines.legend()
    lines.set_title("κ (concatenation weights)")
    grid.imshow(np.random.default_rng(0).random((12, 12)), cmap="Greys", vmin=0, vmax=1)
    fig.tight_layout()
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=110)
    plt.close(fig)
    return png.getvalue()


def rgb(png: bytes | str) -> np.ndarray:
    source = io.BytesIO(png) if isinstance(png, bytes) else png
    with Image.open(source) as image:
        return np.asarray(image.convert("RGB"), dtype=np.int16)


def test_a_figure_is_written_with_a_palette_and_reads_as_drawn(tmp_path):
    png = drawn_png()
    out = tmp_path / "figure.png"
    write_palette_png(png, out)
    with Image.open(out) as written:
        assert written.mode == "P" and len(written.getpalette()) <= 256 * 3
    diff = np.abs(rgb(png) - rgb(str(out)))
    assert diff.shape == rgb(png).shape
    assert diff.mean() < 0.5  # of 255 levels
    assert np.percentile(diff, 99) <= 8
    assert out.stat().st_size < len(png) / 2
