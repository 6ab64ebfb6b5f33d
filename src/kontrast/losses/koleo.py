"""The KoLeo regulariser (Sablayrolles et al. 2019, "Spreading vectors for similarity search",
https://arxiv.org/abs/1806.03198, eq. 4), as DINOv2 applies it to the class tokens (Oquab et al. 2023,
https://arxiv.org/abs/2304.07193, section 4): the Kozachenko-Leonenko entropy estimator's differentiable part,

    L = -1/n sum_i log(d_i + eps),   d_i = min_{j != i} ||x_i - x_j||,   x L2-normalised,

which pushes every point away from its nearest neighbour: the batch spreads uniformly over the sphere.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kontrast.precision import at_least_float32


def koleo(x: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """KoLeo of ``x [n, D]`` (normalised here), 0-d; the nearest neighbour is chosen without gradient."""
    x = F.normalize(at_least_float32(x), dim=1, eps=eps)  # [n, D]
    with torch.no_grad():
        cos = x @ x.T  # [n, n]
        cos.fill_diagonal_(-2.0)  # never oneself
        nearest = cos.argmax(dim=1)  # [n] the largest cosine: the smallest distance on the sphere
    distance = (x - x[nearest]).norm(dim=1)  # [n] d_i
    return -torch.log(distance + eps).mean()
