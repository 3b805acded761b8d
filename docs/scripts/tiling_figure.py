"""Draw docs/img/tiling.png: a 2-D value split into tiles along two named axis groups.

The picture shows ``x`` of shape [1024, 784] with dim 0 in the axis group "batch"
(tiles [256, 256, 512], set as a list) and dim 1 in "features" (tile size 300, so
[300, 300, 184]), beside a weight ``w`` of shape [784, 10] whose dim 0 joined the
"features" group through ``x @ w`` and is therefore cut at the same places.

    .venv/bin/python docs/scripts/tiling_figure.py [--out docs/img/tiling.png]

The output depends only on the installed matplotlib: no dates, no random numbers.
"""

from __future__ import annotations

import argparse
import os

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyArrowPatch, Rectangle  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_OUT = os.path.normpath(os.path.join(HERE, "..", "img", "tiling.png"))

BATCH = [256, 256, 512]  # set_axis_group_tiling("batch", [256, 256, 512])
FEATURES = [300, 300, 184]  # set_axis_group_tiling("features", 300) on an extent of 784
W_COLS = 10  # the untiled dim of w
W_DRAWN = 130  # w's 10 columns are drawn this wide (not to scale) so that labels fit

ROW_COLOURS = ["#dbe9f6", "#c6dbef", "#9ecae1"]  # one shade per batch tile
W_COLOUR = "#fdd9b5"
EDGE = "#08306b"


def _edges(sizes: list[int]) -> list[int]:
    out = [0]
    for s in sizes:
        out.append(out[-1] + s)
    return out


def _span_arrow(ax, start: tuple[float, float], end: tuple[float, float]) -> None:
    ax.add_patch(FancyArrowPatch(start, end, arrowstyle="<->", mutation_scale=9, lw=0.9, color="#444444"))


def draw(out: str) -> None:
    plt.rcParams.update({"font.family": "DejaVu Sans", "font.size": 9, "svg.hashsalt": "tiling"})
    fig, ax = plt.subplots(figsize=(9.0, 8.6), dpi=100)
    rows, cols = _edges(BATCH), _edges(FEATURES)
    height, width = rows[-1], cols[-1]

    # x [1024, 784]: row i of tiles is the i-th batch tile, column j the j-th features tile.
    # Data coordinates: x to the right, y downwards (row 0 at the top).
    for i in range(len(BATCH)):
        for j in range(len(FEATURES)):
            x0, y0 = cols[j], rows[i]
            ax.add_patch(Rectangle((x0, y0), FEATURES[j], BATCH[i], facecolor=ROW_COLOURS[i], edgecolor=EDGE, lw=1.4))
            ax.text(x0 + FEATURES[j] / 2, y0 + BATCH[i] / 2,
                    f"tile ({i}, {j})\n{BATCH[i]} x {FEATURES[j]}\nx[{rows[i]}:{rows[i + 1]}, {cols[j]}:{cols[j + 1]}]",
                    ha="center", va="center", fontsize=7.8, color="#08306b")
    ax.text(width / 2, height + 60, "x: shape [1024, 784]", ha="center", va="center", fontsize=11, weight="bold")

    # Tile sizes of "features" along the top, of "batch" along the left.
    for j in range(len(FEATURES)):
        _span_arrow(ax, (cols[j], -30), (cols[j + 1], -30))
        ax.text((cols[j] + cols[j + 1]) / 2, -52, str(FEATURES[j]), ha="center", va="center", fontsize=9)
    ax.text(width / 2, -110, 'dim 1: axis group "features", extent 784\nset_axis_group_tiling("features", 300)',
            ha="center", va="center", fontsize=9.5)
    for i in range(len(BATCH)):
        _span_arrow(ax, (-30, rows[i]), (-30, rows[i + 1]))
        ax.text(-55, (rows[i] + rows[i + 1]) / 2, str(BATCH[i]), ha="center", va="center", fontsize=9, rotation=90)
    ax.text(-135, height / 2, 'dim 0: axis group "batch", extent 1024\nset_axis_group_tiling("batch", [256, 256, 512])',
            ha="center", va="center", fontsize=9.5, rotation=90)

    # w [784, 10]: its dim 0 is in "features" (merged by x @ w), so its rows are cut like x's columns.
    wx = width + 120
    for j in range(len(FEATURES)):
        ax.add_patch(Rectangle((wx, cols[j]), W_DRAWN, FEATURES[j], facecolor=W_COLOUR, edgecolor="#7f2704", lw=1.4))
        ax.text(wx + W_DRAWN / 2, cols[j] + FEATURES[j] / 2, f"tile ({j}, 0)\n{FEATURES[j]} x {W_COLS}",
                ha="center", va="center", fontsize=8.5, color="#7f2704")
    for j in range(len(FEATURES)):
        _span_arrow(ax, (wx + W_DRAWN + 25, cols[j]), (wx + W_DRAWN + 25, cols[j + 1]))
        ax.text(wx + W_DRAWN + 48, (cols[j] + cols[j + 1]) / 2, str(FEATURES[j]), ha="center", va="center",
                fontsize=9, rotation=90)
    ax.text(wx + W_DRAWN / 2, -52, "w: shape [784, 10]", ha="center", va="center", fontsize=11, weight="bold")
    ax.text(wx + W_DRAWN / 2, width + 95,
            'dim 0 joined "features"\nthrough x @ w:\nthe same cuts\n(dim 1 untiled;\ndrawn wider than scale)',
            ha="center", va="center", fontsize=8.5)

    ax.set_xlim(-190, wx + W_DRAWN + 70)
    ax.set_ylim(height + 110, -150)
    ax.set_aspect("equal")
    ax.axis("off")
    fig.tight_layout(pad=0.3)
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    fig.savefig(out, metadata={"Software": None})
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=DEFAULT_OUT, help="PNG to write (default: docs/img/tiling.png)")
    draw(ap.parse_args().out)


if __name__ == "__main__":
    main()
