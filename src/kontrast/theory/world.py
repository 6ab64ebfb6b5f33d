"""A small world whose augmentation graph is known exactly, and its spectral ground truth.

HaoChen et al. 2021 (https://arxiv.org/abs/2106.04156) describe augmentation by a graph: the
weight ``pi(x, x')`` is the probability that ``(x, x')`` is drawn as a positive pair. Their
Theorem 3.2: the spectral contrastive loss is minimised by ``f(x) = pi(x)^(-1/2) U_k(x) Lambda^(1/2) R``
with ``U_k`` the top-k eigenvectors of the normalised adjacency ``D^(-1/2) pi D^(-1/2)`` and any
invertible ``R``: spectral clustering, learned. Tan et al. 2023 (https://arxiv.org/abs/2303.15103)
argue InfoNCE does the same on the graph its kernel defines.

Here the world is ``n`` objects in ``k`` planted clusters: features ``x_i = prototype_c + noise``
in ``R^dim``, and an augmentation kernel ``pi(i, j) ∝ exp(-|x_i - x_j|^2 / (2 bandwidth^2))``
(a view of an object is a nearby object). Everything is float64 and exact: no sampling is needed
to know the truth; training samples positive pairs from ``pi``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kontrast.errors import UserError
from kontrast.evaluate.clustering import normalized_adjacency, spectral_clustering, spectral_embedding

__all__ = ["World", "make_world", "graph", "sample_pairs", "normalized_adjacency", "spectral_embedding",
           "spectral_clustering"]


@dataclass(frozen=True)
class World:
    """A finite augmentation graph.

    features:  [n, dim] float64, what an encoder (MLP) sees of each object
    labels:    [n] int64, planted cluster of each object
    adjacency: [n, n] float64, ``pi``: symmetric, non-negative, sums to 1
    """

    features: torch.Tensor
    labels: torch.Tensor
    adjacency: torch.Tensor

    @property
    def n(self) -> int:
        return self.adjacency.shape[0]

    @property
    def degrees(self) -> torch.Tensor:
        """``pi(x) = sum_x' pi(x, x')``, the marginal of one view: [n]."""
        return self.adjacency.sum(1)


def make_world(
    n: int = 240, k: int = 4, dim: int = 8, separation: float = 2.5, spread: float = 1.0,
    bandwidth: float = 1.0, seed: int = 0,
) -> World:
    """``n`` objects in ``k`` equal planted clusters (the last may be smaller).

    Prototypes sit evenly on a circle of radius ``separation`` (first two coordinates), each
    object adds Gaussian noise of std ``spread``; ``bandwidth`` is the augmentation kernel's length scale (larger:
    more cross-cluster positive pairs, a smaller eigengap).
    """
    if k < 2 or n < 2 * k:
        raise UserError(f"a world needs k >= 2 clusters and n >= 2k objects, got n={n}, k={k}")
    if dim < 2 or min(separation, spread, bandwidth) <= 0:
        raise UserError("a world needs dim >= 2 and positive separation, spread and bandwidth")
    g = torch.Generator().manual_seed(seed)
    angles = torch.arange(k, dtype=torch.float64) * (2 * torch.pi / k)  # [k]
    prototypes = torch.zeros(k, dim, dtype=torch.float64)  # [k, dim]: a circle in the first two dims
    prototypes[:, 0], prototypes[:, 1] = separation * angles.cos(), separation * angles.sin()
    labels = torch.arange(n) * k // n  # [n] contiguous blocks
    features = prototypes[labels] + spread * torch.randn(n, dim, generator=g, dtype=torch.float64)  # [n, dim]
    d2 = torch.cdist(features, features).pow(2)  # [n, n]
    weights = torch.exp(-d2 / (2 * bandwidth**2))  # [n, n]
    return World(features, labels, weights / weights.sum())


def graph(weights: torch.Tensor) -> World:
    """A world from a hand-built symmetric weight matrix (features = one-hot, one cluster)."""
    weights = torch.as_tensor(weights, dtype=torch.float64)
    n = weights.shape[0]
    if weights.shape != (n, n) or not torch.equal(weights, weights.T) or (weights < 0).any() or weights.sum() <= 0:
        raise ValueError("graph weights must be a symmetric non-negative [n, n] matrix with positive sum")
    if (weights.sum(1) == 0).any():
        raise ValueError("every vertex needs at least one edge (a zero degree has no normalisation)")
    return World(torch.eye(n, dtype=torch.float64), torch.zeros(n, dtype=torch.long), weights / weights.sum())


def sample_pairs(world: World, batch: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """``batch`` positive pairs ``(i, j) ~ pi`` (with replacement): two [batch] int64 tensors."""
    flat = torch.multinomial(world.adjacency.flatten(), batch, replacement=True, generator=generator)  # [B]
    return flat // world.n, flat % world.n
