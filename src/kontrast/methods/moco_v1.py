"""MoCo v1: momentum key encoder + queue, linear head (He et al. 2020, https://arxiv.org/abs/1911.05722).

MoCo v2 (``moco_v2.py``) is MoCo v1 plus an MLP head, blur and tau 0.2; here the same
composition runs with v1's choices: a linear 128-d head (``proj_hidden = 0``), tau 0.07,
momentum 0.999, the asymmetric loss of Algorithm 1 (queries of view 1 vs keys of view 2) and
the InstDisc-style views (crop 0.2-1, jitter 0.4 incl. hue, grayscale, no blur); only view 1 goes
through the query encoder and only view 2 through the key encoder, the two forwards that loss uses.
Shuffling BN is emulated on one device as on 8 GPUs: each view cut into 8 BN groups, the keys' groups
drawn at random (``encoders/batchnorm.py``).
Queue 4096 instead of 65536 for CIFAR-10's 50k images (the authors' CIFAR-10 demo); SGD lr 0.03
per 256 images, weight decay 1e-4 (paper, section 4).
"""

from __future__ import annotations

from dataclasses import dataclass

from kontrast.config import checked
from kontrast.methods.moco_v2 import MoCoV2, MoCoV2Params
from kontrast.registry import METHODS


@dataclass(frozen=True)
class MoCoV1Params(MoCoV2Params):
    """MoCo v2's fields with v1's values where they differ (queue, projection width and BN groups are v2's)."""

    temperature: float = checked(0.07, gt=0)  # tau of the scores q.k / tau
    momentum: float = checked(0.999, ge=0, le=1)  # the key encoder's EMA momentum
    proj_hidden: int = checked(0, ge=0)  # linear head
    symmetric: bool = False
    proj_bn: bool = False  # no hidden layer, so no BN in the head


@METHODS.register("moco_v1")
class MoCoV1(MoCoV2):
    description = "MoCo v1: momentum encoder, queue of negatives, linear head, tau 0.07 (He et al. 2020)"
    recipe = "moco_v1"
    Params = MoCoV1Params
    defaults = {"optim": {"lr": 0.03, "weight_decay": 1e-4}}
