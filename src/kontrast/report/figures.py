"""The report's figures, each drawn with matplotlib (Agg) and returned as PNG bytes.

Every function takes plain tensors and lists (nothing of a run), so each can be tested alone.
"""

from __future__ import annotations

import io
from collections.abc import Sequence

import torch

from kontrast.plotting import pyplot
from kontrast.report.metrics import CURVES, Curve, metric_series

DPI = 100
MAX_LEGEND = 20  # more classes than this: colours without a legend
SAME, OTHER = "#1a7f37", "#cf222e"  # a neighbour's caption: same class as its query, or not


def figure_png(fig, dpi: int = DPI) -> bytes:
    """The figure as PNG bytes; the figure is freed."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi, bbox_inches="tight", facecolor="white")
    pyplot().close(fig)
    return buffer.getvalue()


def curves_png(records: list[dict], curves: Sequence[Curve] = CURVES) -> bytes | None:
    """One panel per curve whose metric the log holds, against step; None when it holds none of them."""
    panels = [(c, *metric_series(records, c.key)) for c in curves]
    panels = [p for p in panels if p[1]]
    if not panels:
        return None
    plt = pyplot()
    cols = min(3, len(panels))
    rows = -(-len(panels) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.4 * cols, 3.2 * rows), squeeze=False)
    for ax, (curve, steps, values) in zip(axes.flat, panels):
        ax.plot(steps, values, marker="o" if len(steps) <= 30 else None, ms=3, lw=1.4, color="#0969da")
        ax.set_title(curve.title, fontsize=11)
        ax.set_xlabel("step")
        ax.set_ylabel(curve.ylabel)
        if curve.log_y:
            ax.set_yscale("log")
        ax.grid(alpha=0.3)
        ax.ticklabel_format(axis="y", style="sci", scilimits=(-3, 4))
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    fig.tight_layout()
    return figure_png(fig)


def map_png(points: torch.Tensor, labels: torch.Tensor | None, classes: Sequence[str], title: str,
            axis_name: str = "PCA", marked: torch.Tensor | None = None) -> bytes:
    """Scatter of ``[N, 2]`` points, one colour per label with a legend (up to :data:`MAX_LEGEND` classes);
    ``marked`` (bool ``[N]``, e.g. the test split's rows) drawn as crosses, the rest as dots."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 6))
    size = 28 if len(points) <= 200 else 10 if len(points) <= 1000 else 5
    x, y = points[:, 0].tolist(), points[:, 1].tolist()
    shape = ["x" if m else "o" for m in marked.tolist()] if marked is not None else ["o"] * len(x)
    if labels is None:
        for form in sorted(set(shape)):
            keep = [i for i in range(len(x)) if shape[i] == form]
            ax.scatter([x[i] for i in keep], [y[i] for i in keep], s=size, color="#0969da", alpha=0.7,
                       marker=form, linewidths=0 if form == "o" else 1)
    else:
        ids = sorted(set(labels.tolist()))
        cmap = plt.get_cmap("tab10" if len(ids) <= 10 else "tab20" if len(ids) <= 20 else "turbo")
        for n, label in enumerate(ids):
            keep = (labels == label).nonzero().flatten().tolist()
            name = classes[label] if label < len(classes) else str(label)
            colour = cmap(n if len(ids) <= 20 else n / max(1, len(ids) - 1))
            for form in sorted({shape[i] for i in keep}):
                rows = [i for i in keep if shape[i] == form]
                ax.scatter([x[i] for i in rows], [y[i] for i in rows], s=size, color=colour, alpha=0.75, marker=form,
                           linewidths=0 if form == "o" else 1,
                           label=name if form == min(shape[i] for i in keep) else None)
        if len(ids) <= MAX_LEGEND:
            ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=9, markerscale=1.5, frameon=False)
        else:
            ax.text(1.01, 1.0, f"{len(ids)} classes\n(no legend)", transform=ax.transAxes, va="top", fontsize=9)
    ax.set_title(title, fontsize=11)
    ax.set_xlabel(f"{axis_name} 1")
    ax.set_ylabel(f"{axis_name} 2")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return figure_png(fig)


def _show(ax, image: torch.Tensor) -> None:
    """One ``[3, H, W]`` image (uint8, or float in [0, 1]) without axes."""
    img = image.float().div(255) if image.dtype == torch.uint8 else image.float()
    ax.imshow(img.permute(1, 2, 0).clamp(0, 1).numpy(), interpolation="nearest")
    ax.set_xticks([])
    ax.set_yticks([])


def neighbours_png(images: torch.Tensor, captions: Sequence[str], queries: Sequence[int], indices: torch.Tensor,
                   sims: torch.Tensor, labels: torch.Tensor | None = None) -> bytes:
    """A row per query: the query image, then its neighbours (``indices`` ``[Q, k]``, cosine ``sims``).

    Under each neighbour: its caption and cosine similarity, green when its label is the query's,
    red when not (black without labels).
    """
    plt = pyplot()
    rows, k = len(queries), indices.shape[1]
    fig, axes = plt.subplots(rows, k + 1, figsize=(1.45 * (k + 1), 1.65 * rows), squeeze=False)
    for r, q in enumerate(queries):
        _show(axes[r, 0], images[q])
        axes[r, 0].set_title(f"query\n{captions[q]}", fontsize=8, fontweight="bold")
        for side in axes[r, 0].spines.values():
            side.set(color="#0969da", linewidth=2.5)
        for c in range(k):
            i = int(indices[r, c])
            colour = "black" if labels is None else SAME if int(labels[i]) == int(labels[q]) else OTHER
            _show(axes[r, c + 1], images[i])
            axes[r, c + 1].set_title(f"{captions[i]}\ncos {float(sims[r, c]):.2f}", fontsize=8, color=colour)
    fig.tight_layout()
    return figure_png(fig)


def views_png(originals: torch.Tensor, views: Sequence[torch.Tensor]) -> bytes:
    """A row per image: the original (uint8 ``[B, 3, H, W]``), then each view (``[B, 3, S, S]`` in [0, 1])."""
    plt = pyplot()
    rows, cols = len(originals), 1 + len(views)
    fig, axes = plt.subplots(rows, cols, figsize=(1.5 * cols, 1.55 * rows), squeeze=False)
    for r in range(rows):
        _show(axes[r, 0], originals[r])
        for c, view in enumerate(views, start=1):
            _show(axes[r, c], view[r])
        if r == 0:
            axes[r, 0].set_title(f"original\n{originals.shape[-1]} px", fontsize=8, fontweight="bold")
            for c, view in enumerate(views, start=1):
                axes[r, c].set_title(f"view {c}\n{view.shape[-1]} px", fontsize=8)
    fig.tight_layout()
    return figure_png(fig)
