"""``kontrast bench``: how fast this machine runs kontrast, each figure with the command that reproduces it.

    options.py  BenchOptions, the command-line arguments, their checks, the reproducing command line
    report.py   the sections (augment, step, loss, train), ``run_bench`` and ``--json``
    augment.py  batched ``make_views`` vs torchvision's PIL pipeline, per thread
    step.py     one training step by phase, and the share outside the encoder
    runs.py     end-to-end ``kontrast train`` runs in their own processes (images/s, peak RSS)

Comparisons with other libraries and pass/fail targets are not here: benchmarks/vs_peer.py in the
repository builds them on these measurements.
"""

from kontrast.bench.options import ALL_SECTIONS, BenchOptions

__all__ = ["ALL_SECTIONS", "BenchOptions", "main_json", "run_bench"]


def __getattr__(name: str):
    """``run_bench`` and ``main_json`` import torch: loaded on first use, so the CLI's parser stays light."""
    if name in ("run_bench", "main_json"):
        from kontrast.bench import report

        return getattr(report, name)
    raise AttributeError(f"module 'kontrast.bench' has no attribute {name!r}")
