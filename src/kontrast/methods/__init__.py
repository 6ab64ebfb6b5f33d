"""Methods: each one small file composing the rooms. ``METHODS`` lists them."""

from __future__ import annotations

# Registration into METHODS (kontrast.registry) happens on import; keep this list in sync with the files.
from kontrast.methods import (  # noqa: F401
    amdim,
    barlow_twins,
    byol,
    clip,
    cpc,
    cpc_v2,
    dcl,
    dino,
    distill,
    ibot,
    ijepa,
    infomin,
    instdisc,
    kernel_infonce,
    lejepa,
    mae,
    mmcr,
    moco_v1,
    moco_v2,
    moco_v3,
    nnclr,
    siglip,
    simclr,
    simclr_v2,
    simsiam,
    spectral,
    supcon,
    supervised,
    swav,
    vicreg,
    yadim,
)
from kontrast.methods.base import Method
from kontrast.registry import METHODS

__all__ = ["METHODS", "Method"]
