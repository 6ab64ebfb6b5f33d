"""Momentum (EMA) target networks: MoCo's key encoder, BYOL's target.

theta_target <- m * theta_target + (1 - m) * theta_online, with no gradient.
"""

from __future__ import annotations

import copy
import math

import torch
import torch.nn as nn

from kontrast.encoders.vit import DropPath


def cosine_momentum(base: float, progress: float) -> float:
    """BYOL's schedule: ``1 - (1 - base) * (cos(pi * progress) + 1) / 2``, rising from base to 1.

    Grill et al. 2020, https://arxiv.org/abs/2006.07733, section 3.2; ``progress`` = step / total_steps.
    """
    return 1.0 - (1.0 - base) * (math.cos(math.pi * progress) + 1.0) / 2.0


class MomentumTarget(nn.Module):
    """A frozen copy of ``online`` that follows it by exponential moving average.

    The copy's parameters never receive gradients and are not handed to the
    optimizer; its buffers (BatchNorm statistics) are its own, updated by its
    own forward passes as in MoCo and BYOL. Its stochastic depth is off (DINO's
    teacher is built without it): a target is a function of its input.
    """

    def __init__(self, online: nn.Module):
        super().__init__()
        self.net = copy.deepcopy(online)
        for p in self.net.parameters():
            p.requires_grad_(False)
        for m in self.net.modules():
            if isinstance(m, DropPath):
                m.p = 0.0

    @torch.no_grad()
    def update(self, online: nn.Module, momentum: float) -> None:
        """``target = momentum * target + (1 - momentum) * online`` for every parameter."""
        target_params = list(self.net.parameters())
        online_params = [p.detach() for p in online.parameters()]
        torch._foreach_lerp_(target_params, online_params, 1.0 - momentum)

    @torch.no_grad()
    def forward(self, *args, **kwargs):
        return self.net(*args, **kwargs)
