"""InfoMin: MoCo v2 with the InfoMin augmentation (Tian et al. 2020, https://arxiv.org/abs/2005.10243).

"What Makes for Good Views for Contrastive Learning?": views should share the label
information and as little else as possible; the authors' "InfoMin Aug" reduces the mutual
information between views with RandAugment (n=2, m=10, mstd=0.5) and stronger colour
jitter on top of MoCo v2's pipeline (recipe ``infomin`` in ``kontrast.augment.views``; the
ops live in ``kontrast.augment.randaugment``). As in the authors' PyContrast (its ``InfoMin``
preset: MoCo queue, MLP head, augmentation "D"), the crop starts at 20% of the area (their
code uses 8% only with a memory bank) and the temperature is 0.15 instead of MoCo v2's 0.2.
Everything else is MoCo v2 (``kontrast.methods.moco_v2``) with its CIFAR defaults. The
paper's best ImageNet model also adds a jigsaw branch; that is not part of this recipe.
"""

from __future__ import annotations

from dataclasses import dataclass

from kontrast.config import checked
from kontrast.methods.moco_v2 import MoCoV2, MoCoV2Params
from kontrast.registry import METHODS


@dataclass(frozen=True)
class InfoMinParams(MoCoV2Params):
    temperature: float = checked(0.15, gt=0)  # PyContrast's InfoMin preset (nce_t)


@METHODS.register("infomin")
class InfoMin(MoCoV2):
    description = "InfoMin: MoCo v2 with InfoMin Aug (strong crops + RandAugment) (Tian et al. 2020)"
    recipe = "infomin"
    Params = InfoMinParams
