"""Evaluate room: frozen features, weighted kNN and a linear probe.

    feats = extract_features(encoder, images_uint8, mean=MEAN, std=STD, precision="bf16")
    knn_top1(train_feats, train_labels, test_feats, test_labels, k=200, temperature=0.1)
    linear_probe(train_feats, train_labels, test_feats, test_labels)["top1"]
"""

from kontrast.evaluate.features import extract_features, raw_pixel_features
from kontrast.evaluate.knn import knn_predict, knn_top1
from kontrast.evaluate.linear import linear_probe

__all__ = ["extract_features", "raw_pixel_features", "knn_predict", "knn_top1", "linear_probe"]
