"""Weighted k-nearest-neighbour classification on frozen features.

Wu, Xiong, Yu & Lin, "Unsupervised Feature Learning via Non-Parametric Instance
Discrimination", CVPR 2018, https://arxiv.org/abs/1805.01978 (section 3.4): the k most
cosine-similar training samples vote for their class with weight ``exp(sim / τ)``.
The same protocol (k=200, τ=0.1) is the monitor of lightly's and solo-learn's benchmarks,
so numbers are comparable with theirs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def class_votes(
    sims: torch.Tensor, neighbour_labels: torch.Tensor, temperature: float, num_classes: int
) -> torch.Tensor:
    """Sum of ``exp(sim / τ)`` per class: sims, labels ``[M, k]`` -> votes ``[M, num_classes]``."""
    weights = (sims / temperature).exp()  # [M, k]
    votes = torch.zeros(len(sims), num_classes, dtype=weights.dtype, device=weights.device)
    return votes.scatter_add_(1, neighbour_labels, weights)  # [M, C]


def knn_predict(
    train_features: torch.Tensor,
    train_labels: torch.Tensor,
    test_features: torch.Tensor,
    *,
    k: int = 200,
    temperature: float = 0.1,
    num_classes: int | None = None,
    chunk_size: int = 1024,
) -> torch.Tensor:
    """Predicted class of every test sample by weighted kNN: ``[M, D]`` -> int64 ``[M]``.

    Features are L2-normalised, so the dot product is the cosine similarity. ``k`` is
    clipped to the number of training samples. Test samples are scored ``chunk_size`` at a
    time, so memory stays at ``chunk_size × N`` similarities. Computed in float32 on the
    device the features live on.

    Args:
        train_features: ``[N, D]``; train_labels: int ``[N]``; test_features: ``[M, D]``.
        num_classes: defaults to ``max(train_labels) + 1``.
    """
    train = F.normalize(train_features.float(), dim=1)  # [N, D]
    test = F.normalize(test_features.float(), dim=1)  # [M, D]
    labels = train_labels.long().to(train.device)  # [N]
    num_classes = int(labels.max()) + 1 if num_classes is None else num_classes
    k = min(k, len(train))
    preds = []
    for chunk in test.split(chunk_size):
        sims = chunk @ train.T  # [m, N] cosine similarities
        top_sims, top_idx = sims.topk(k, dim=1)  # [m, k]
        votes = class_votes(top_sims, labels[top_idx], temperature, num_classes)  # [m, C]
        preds.append(votes.argmax(dim=1))  # [m]
    return torch.cat(preds) if preds else torch.empty(0, dtype=torch.long)


def knn_top1(
    train_features: torch.Tensor,
    train_labels: torch.Tensor,
    test_features: torch.Tensor,
    test_labels: torch.Tensor,
    **kw,
) -> float:
    """Top-1 accuracy of ``knn_predict`` (same keyword arguments) on ``test_labels``."""
    preds = knn_predict(train_features, train_labels, test_features, **kw)
    return (preds.cpu() == test_labels.cpu().long()).float().mean().item()
