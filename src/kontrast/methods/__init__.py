"""Methods: each one small file composing the rooms. ``METHODS`` lists them."""

from __future__ import annotations

# Registration into METHODS (kontrast.registry) happens on import; keep this list in sync with the files.
from kontrast.methods import amdim, byol, clip, cpc, cpc_v2, infomin, instdisc  # noqa: F401
from kontrast.methods import kernel_infonce, moco_v1, moco_v2, moco_v3  # noqa: F401
from kontrast.methods import simclr, simclr_v2, simsiam, spectral, swav, yadim  # noqa: F401
from kontrast.methods import barlow_twins, dcl, dino, nnclr, vicreg  # noqa: F401
from kontrast.methods import ibot, lejepa, mmcr, siglip, supcon  # noqa: F401
from kontrast.methods.base import Method
from kontrast.registry import METHODS

__all__ = ["METHODS", "Method"]
