"""Figures as files: matplotlib with the Agg backend (no display needed), PNG out.

matplotlib is imported only here and only when a figure is made, so the library and
the training CLI never pay for it.
"""

from __future__ import annotations

from pathlib import Path


def pyplot():
    """``matplotlib.pyplot`` on the non-interactive Agg backend."""
    import matplotlib

    matplotlib.use("Agg")  # write files; never open a window
    import matplotlib.pyplot as plt

    return plt


def save(fig, path: str | Path, dpi: int = 72) -> Path:
    """Write ``fig`` as a PNG (parents created) and free it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi, bbox_inches="tight")
    pyplot().close(fig)
    return path
