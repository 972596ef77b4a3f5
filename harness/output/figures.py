"""Writing a plot: every figure the harness draws is saved here, at one resolution.

A PNG is written with a 256-colour palette. The plots are lines, markers and text on white, so
the palette keeps them sharp while the file is about a third of matplotlib's full-colour one;
result folders are committed beside their code and their size counts."""

from __future__ import annotations

import io
from pathlib import Path

FIGURE_DPI = 110


def save_figure(fig, path: str | Path) -> None:
    """Save fig at FIGURE_DPI; a .png as a palette image, any other suffix as matplotlib writes it."""
    path = Path(path)
    if path.suffix.lower() != ".png":
        fig.savefig(path, dpi=FIGURE_DPI)
        return
    from PIL import Image  # matplotlib's own dependency

    buffer = io.BytesIO()
    fig.savefig(buffer, dpi=FIGURE_DPI, format="png")
    buffer.seek(0)
    _write_palette(Image.open(buffer), path)


def _write_palette(image, path: Path) -> None:
    from PIL import Image

    with image:
        palette = image.convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT)
    palette.save(path, format="png", optimize=True)


def repack(path: str | Path) -> None:
    """Rewrite a PNG already on disk as save_figure writes one (plots saved before it, or by hand)."""
    from PIL import Image

    path = Path(path)
    _write_palette(Image.open(path), path)


if __name__ == "__main__":
    import sys

    for name in sys.argv[1:]:  # python -m harness.output.figures FILE.png ...
        repack(name)
