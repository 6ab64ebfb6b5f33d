"""Methods: each one small file composing the rooms. ``METHODS`` lists them."""

from __future__ import annotations

from kontrast.registry import Registry

METHODS = Registry("method")

# Registration happens on import; keep this list in sync with the files.
from kontrast.methods import byol, moco_v2, simclr  # noqa: E402,F401
from kontrast.methods import clip, infomin, swav  # noqa: E402,F401  (zoo B)
from kontrast.methods import instdisc, kernel_infonce, moco_v1, moco_v3  # noqa: E402,F401  (zoo A)
from kontrast.methods import simclr_v2, simsiam, spectral  # noqa: E402,F401  (zoo A)
from kontrast.methods import amdim, cpc, cpc_v2, yadim  # noqa: E402,F401  (local and predictive)
from kontrast.methods.base import Method  # noqa: E402

__all__ = ["METHODS", "Method"]
