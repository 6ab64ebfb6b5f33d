"""Theory lab: contrastive-learning claims checked on small worlds where the truth is exact.

* :mod:`kontrast.theory.spectral`: contrastive learning is spectral clustering of the
  augmentation graph (HaoChen et al. 2021; Tan et al. 2023); world in :mod:`kontrast.theory.world`,
  figure and JSON in :mod:`kontrast.theory.spectral_report`.
* :mod:`kontrast.theory.mi`: InfoNCE lower-bounds mutual information by ``log N - L`` (CPC).

``kontrast theory spectral`` and ``kontrast theory mi`` run them and write PNG + JSON.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields
from typing import Any


def run_experiment(name: str, args: dict[str, Any], log: Callable[[str], None] = print) -> dict:
    """Run experiment ``name`` ("spectral" or "mi") with the given settings (None = default) into ``args["out"]``."""
    if name == "spectral":
        from kontrast.theory.spectral import SpectralConfig as cls
        from kontrast.theory.spectral_report import write_spectral as write
    elif name == "mi":
        from kontrast.theory.mi import MIConfig as cls
        from kontrast.theory.mi import write_mi as write
    else:
        raise ValueError(f"unknown theory experiment {name!r}")
    settings = {f.name: args[f.name] for f in fields(cls) if args.get(f.name) is not None}
    return write(cls(**settings), args.get("out") or "runs/theory", log=log)
