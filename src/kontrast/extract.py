"""Extract room: from encoder features to what is compared (heads, predictors).

One builder, :func:`mlp`, makes every projection head and predictor:
SimCLR's 2-layer head, MoCo v2's MLP, BYOL's projector and predictor differ
only in their dims and where batch-norm sits.
"""

from __future__ import annotations

from typing import Sequence

import torch.nn as nn


def mlp(dims: Sequence[int], *, norm: bool = True, last_norm: bool = False, bias_last: bool = True) -> nn.Sequential:
    """``Linear -> [BN] -> ReLU`` for each hidden layer, then a final ``Linear [-> BN]``.

    ``dims = (in, hidden..., out)``. ``norm`` puts BatchNorm1d after each hidden
    Linear (SimCLR v2, BYOL); ``last_norm`` adds an affine-free BN after the
    output (SimSiam / MoCo v3 style).
    """
    if len(dims) < 2:
        raise ValueError("mlp needs at least (in, out) dims")
    layers: list[nn.Module] = []
    for d_in, d_out in zip(dims[:-2], dims[1:-1]):
        layers.append(nn.Linear(d_in, d_out, bias=not norm))
        if norm:
            layers.append(nn.BatchNorm1d(d_out))
        layers.append(nn.ReLU(inplace=True))
    layers.append(nn.Linear(dims[-2], dims[-1], bias=bias_last and not last_norm))
    if last_norm:
        layers.append(nn.BatchNorm1d(dims[-1], affine=False))
    return nn.Sequential(*layers)
