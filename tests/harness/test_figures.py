"""harness.output.figures: every plot saved at one resolution, a PNG as a 256-colour palette image."""

from __future__ import annotations

import io

import numpy as np
from matplotlib.figure import Figure
from PIL import Image

from harness.output.figures import FIGURE_DPI, repack, save_figure


def _figure() -> Figure:
    fig = Figure(figsize=(6, 4))
    ax = fig.subplots()
    x = np.linspace(0, 10, 400)
    for k in range(6):
        ax.plot(x, np.sin(x + k), label=f"series {k}")
    ax.set_title("a plot with text, lines and a legend")
    ax.legend()
    return fig


def test_a_png_is_a_palette_image_of_the_figure_smaller_than_full_colour(tmp_path):
    fig = _figure()
    save_figure(fig, tmp_path / "plot.png")
    full = io.BytesIO()
    fig.savefig(full, dpi=FIGURE_DPI, format="png")
    with Image.open(tmp_path / "plot.png") as saved, Image.open(full) as reference:
        assert saved.mode == "P" and saved.size == reference.size == (6 * FIGURE_DPI, 4 * FIGURE_DPI)
        # the picture is kept: each pixel within a few levels of the full-colour one on average
        diff = np.abs(np.asarray(saved.convert("RGB"), dtype=float) - np.asarray(reference.convert("RGB"), dtype=float))
        assert diff.mean() < 2.0
    assert (tmp_path / "plot.png").stat().st_size < 0.6 * len(full.getvalue())


def test_other_formats_are_written_as_matplotlib_writes_them(tmp_path):
    save_figure(_figure(), tmp_path / "plot.svg")
    assert (tmp_path / "plot.svg").read_text().lstrip().startswith("<?xml")


def test_repack_rewrites_a_full_colour_png_in_place(tmp_path):
    path = tmp_path / "old.png"
    _figure().savefig(path, dpi=FIGURE_DPI)
    before = path.stat().st_size
    repack(path)
    with Image.open(path) as image:
        assert image.mode == "P"
    assert path.stat().st_size < before
