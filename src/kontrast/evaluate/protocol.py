"""The evaluation protocol: frozen, pooled encoder features -> weighted kNN and linear probe.

Never the projection head: what is measured is the encoder's representation,
as in every SSL benchmark table (lightly, solo-learn).
"""

from __future__ import annotations

from dataclasses import replace

import torch
import torch.nn as nn

from kontrast.config import EvalConfig
from kontrast.data import Samples
from kontrast.errors import UserError
from kontrast.evaluate.clustering import cluster_scores
from kontrast.evaluate.features import extract_features, raw_pixel_features
from kontrast.evaluate.knn import knn_top1
from kontrast.evaluate.linear import linear_probe
from kontrast.evaluate.options import EvalOptions


def _check_labels(train: Samples, test: Samples) -> None:
    if train.labels is None or test.labels is None:
        raise UserError(f"evaluation needs labelled data, but {train.name} has no class folders")


def score_features(
    train_x: torch.Tensor, train_y: torch.Tensor, test_x: torch.Tensor, test_y: torch.Tensor,
    cfg: EvalConfig, *, linear: bool = True, clustering: bool = False,
) -> dict[str, float]:
    """kNN top-1 (and linear-probe top-1, and k-means of the test features against their labels)."""
    out = {"knn_top1": knn_top1(train_x, train_y, test_x, test_y, k=cfg.knn_k, temperature=cfg.knn_temperature)}
    if linear:
        probe = linear_probe(train_x, train_y, test_x, test_y, epochs=cfg.linear_epochs,
                             weight_decay=cfg.linear_weight_decay)
        out["linear_top1"], out["linear_weight_decay"] = probe["top1"], probe["weight_decay"]
        if "val_top1" in probe:
            out["linear_val_top1"] = probe["val_top1"]  # on the held-out tenth of the training split
    if clustering:
        out.update(cluster_scores(test_x, test_y))
    return out


def evaluate_encoder(
    encoder: nn.Module, train: Samples, test: Samples, cfg: EvalConfig, options: EvalOptions, *, mean, std,
) -> dict[str, float]:
    """Extract features of both splits with ``encoder`` (its inputs normalised by ``mean`` and ``std``; None for
    sequences) and score them: kNN top-1, and the linear probe and the clustering where ``options`` asks for them
    (its fine-tuning is :func:`kontrast.evaluate.finetune.finetune_top1`'s)."""
    _check_labels(train, test)
    kw = dict(mean=mean, std=std, batch_size=cfg.batch_size, device=options.device, precision=options.precision)
    train_x = extract_features(encoder, train.x, **kw)
    test_x = extract_features(encoder, test.x, **kw)
    if options.linear_weight_decay is not None:
        cfg = replace(cfg, linear_weight_decay=options.linear_weight_decay)
    return score_features(train_x, train.labels, test_x, test.labels, cfg, linear=options.linear,
                          clustering=options.clustering)


def evaluate_raw_pixels(train: Samples, test: Samples, cfg: EvalConfig, *, linear: bool = True) -> dict[str, float]:
    """The no-learning baseline: flattened pixels."""
    _check_labels(train, test)
    return score_features(
        raw_pixel_features(train.x), train.labels, raw_pixel_features(test.x), test.labels, cfg, linear=linear
    )
