"""InfoMin: MoCo v2 with the InfoMin augmentation (Tian et al. 2020, https://arxiv.org/abs/2005.10243).

"What Makes for Good Views for Contrastive Learning?": views should share the label
information and as little else as possible; the authors' "InfoMin Aug" reduces the mutual
information between views with stronger crops (from 8% of the area) and RandAugment
(n=2, m=10, mstd=0.5) on top of MoCo v2's colour pipeline (recipe ``infomin`` in
``kontrast.augment.views``; the ops live in ``kontrast.augment.randaugment``). Everything
else is MoCo v2 (``kontrast.methods.moco_v2``), with its CIFAR defaults. The paper's best
ImageNet model also adds a jigsaw branch; that is not part of this recipe.
"""

from __future__ import annotations

from kontrast.methods import METHODS
from kontrast.methods.moco_v2 import MoCoV2


@METHODS.register("infomin")
class InfoMin(MoCoV2):
    description = "InfoMin: MoCo v2 with InfoMin Aug (strong crops + RandAugment) (Tian et al. 2020)"
    recipe = "infomin"
