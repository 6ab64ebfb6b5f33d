"""Manifold capacity: MMCR's loss (Yerxa et al. 2023, "Learning Efficient Coding of Natural Images with Maximum
Manifold Capacity Representations", https://arxiv.org/abs/2303.03307, section 3).

Each image's k views, embedded and L2-normalised, ``z_i1 .. z_ik``, form a manifold; its centroid is
``c_i = 1/k sum_j z_ij``. With C the [N, D] matrix of every image's centroid,

    L = -||C||_*  +  lambda / N sum_i ||Z_i||_*

(``||.||_*`` the nuclear norm, the sum of singular values; ``Z_i`` the [k, D] matrix of image i's views). Maximising
||C||_* spreads the centroids over many directions (capacity) and, since every z has norm 1, pulls each image's views
together (a centroid is longest when its views agree). The second term (lambda > 0) shrinks each manifold further;
the paper's objective is the first term.
"""

from __future__ import annotations

import torch

from kontrast.precision import at_least_float32


def nuclear_norm(x: torch.Tensor) -> torch.Tensor:
    """``||x||_*`` of ``[..., n, d]``: the sum of its singular values, ``[...]`` (float32 at least: the SVD)."""
    return torch.linalg.svdvals(at_least_float32(x)).sum(-1)


def manifold_capacity(z: torch.Tensor, local_weight: float = 0.0, centroids: torch.Tensor | None = None
                      ) -> torch.Tensor:
    """MMCR's loss: 0-d. ``z [N, k, D]``: each image's k normalised views. ``centroids [M, D]`` (default: the
    centroids of z, ``z.mean(1)``): the matrix whose nuclear norm is maximised, e.g. every rank's centroids;
    ``local_weight`` lambda on the mean nuclear norm of each image's own views."""
    if centroids is None:
        centroids = z.mean(1)  # [N, D] c_i = 1/k sum_j z_ij
    loss = -nuclear_norm(centroids)  # -||C||_*
    if local_weight:
        loss = loss + local_weight * nuclear_norm(z).mean()  # lambda / N sum_i ||Z_i||_*
    return loss
