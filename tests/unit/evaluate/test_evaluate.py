"""Evaluate room: kNN against a naive loop, linear probe sanity, feature extraction."""

import copy

import pytest
import torch
from torch import nn

from kontrast.errors import UserError
from kontrast.evaluate import (
    extract_features,
    knn_predict,
    knn_top1,
    linear_probe,
    raw_pixel_features,
)
from support.reference import naive_knn

MEAN, STD = (0.5, 0.4, 0.3), (0.2, 0.25, 0.3)


def blobs(n_per_class, num_classes, dim, spread, generator):
    """Gaussian blobs around random unit-scale centres: features [n·C, dim], labels [n·C]."""
    centres = torch.randn(num_classes, dim, generator=generator) * 3
    labels = torch.arange(num_classes).repeat_interleave(n_per_class)
    return centres[labels] + spread * torch.randn(len(labels), dim, generator=generator), labels


@pytest.mark.parametrize("k,temperature,chunk", [(5, 0.1, 1024), (20, 0.5, 7), (1, 0.07, 3)])
def test_knn_matches_naive_loop(k, temperature, chunk):
    g = torch.Generator().manual_seed(k)
    train, test = torch.randn(60, 8, generator=g), torch.randn(25, 8, generator=g)
    labels = torch.randint(0, 4, (60,), generator=g)
    got = knn_predict(train, labels, test, k=k, temperature=temperature, chunk_size=chunk)
    assert got.dtype == torch.int64 and got.shape == (25,)
    assert torch.equal(got, naive_knn(train, labels, test, k, temperature, 4))


def test_knn_clips_k_to_train_size():
    g = torch.Generator().manual_seed(0)
    train, test = torch.randn(5, 4, generator=g), torch.randn(6, 4, generator=g)
    labels = torch.tensor([0, 1, 1, 2, 2])
    got = knn_predict(train, labels, test, k=200, temperature=0.1)
    assert torch.equal(got, naive_knn(train, labels, test, 5, 0.1, 3))


def test_knn_is_perfect_on_separated_clusters_and_respects_num_classes():
    g = torch.Generator().manual_seed(0)
    x, y = blobs(30, 5, 16, 0.05, g)
    perm = torch.randperm(len(y), generator=g)
    tr, te = perm[:100], perm[100:]
    assert knn_top1(x[tr], y[tr], x[te], y[te], k=10) == 1.0
    preds = knn_predict(x[tr], y[tr], x[te], k=10, num_classes=9)
    assert torch.equal(preds, y[te])


def test_knn_is_invariant_to_feature_scale():
    g = torch.Generator().manual_seed(1)
    train, test = torch.randn(40, 6, generator=g), torch.randn(10, 6, generator=g)
    labels = torch.randint(0, 3, (40,), generator=g)
    scale = torch.rand(40, 1, generator=g) * 10 + 0.1
    assert torch.equal(
        knn_predict(train, labels, test, k=7), knn_predict(train * scale, labels, test * 3, k=7)
    )


def test_linear_probe_separates_gaussian_blobs():
    g = torch.Generator().manual_seed(0)
    x, y = blobs(200, 4, 32, 1.5, g)
    perm = torch.randperm(len(y), generator=g)
    tr, te = perm[:600], perm[600:]
    result = linear_probe(x[tr], y[tr], x[te], y[te])
    assert result["top1"] >= 0.95 and result["train_top1"] >= 0.95


def test_linear_probe_is_at_chance_on_random_labels():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2000, 32, generator=g)
    y = torch.randint(0, 10, (2000,), generator=g)
    result = linear_probe(x[:1500], y[:1500], x[1500:], y[1500:])
    assert abs(result["top1"] - 0.1) < 0.05  # 500 test samples: chance ± ~3.5σ
    assert result["train_top1"] > result["top1"]  # it did fit the training noise a little


def test_linear_probe_is_deterministic_and_scale_free():
    g = torch.Generator().manual_seed(2)
    x, y = blobs(50, 3, 8, 4.0, g)
    a = linear_probe(x[:100], y[:100], x[100:], y[100:], seed=0)
    b = linear_probe(x[:100], y[:100], x[100:], y[100:], seed=1)
    c = linear_probe(1000 * x[:100] + 7, y[:100], 1000 * x[100:] + 7, y[100:])
    assert a == b
    assert abs(a["top1"] - c["top1"]) <= 1 / 50  # standardisation removes the scale


def test_linear_probe_weight_decay_is_chosen_on_a_validation_split_never_the_test_split():
    """auto: each candidate is fitted on 90 % of the training features and scored on a class-balanced tenth; the
    test split does not move the choice (scrambled test features and labels choose the same)."""
    from kontrast.evaluate.linear import WEIGHT_DECAYS, choose_weight_decay, validation_split

    g = torch.Generator().manual_seed(3)
    x, y = blobs(100, 4, 16, 0.8, g)
    fit, val = validation_split(y)
    assert len(set(fit.tolist()) & set(val.tolist())) == 0 and len(fit) + len(val) == len(y)
    assert torch.bincount(y[val]).tolist() == [10, 10, 10, 10]
    perm = torch.randperm(400, generator=g)
    x, y = x[perm], y[perm]  # every class in both the training and the test part below
    result = linear_probe(x[:300], y[:300], x[300:], y[300:])
    wd, val_top1 = choose_weight_decay(x[:300], y[:300])
    assert result["weight_decay"] == wd in WEIGHT_DECAYS and result["val_top1"] == val_top1
    noise = linear_probe(x[:300], y[:300], torch.randn(100, 16, generator=g), torch.randint(0, 4, (100,), generator=g))
    assert noise["weight_decay"] == wd
    fixed = linear_probe(x[:300], y[:300], x[300:], y[300:], weight_decay=5e-3)
    assert fixed["weight_decay"] == 5e-3 and "val_top1" not in fixed


class TinyEncoder(nn.Module):
    """Conv + BN + global pool: batch statistics would make features batch-dependent."""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Dropout(0.5))
        self.dim = 8

    def forward(self, x):
        return self.body(x).mean(dim=(2, 3))


def random_images(n, size=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, 3, size, size), dtype=torch.uint8, generator=g)


def test_extract_features_restores_modes_and_ignores_batch_size():
    enc = TinyEncoder().train()
    enc.body[1].eval()  # a deliberately frozen BatchNorm must stay frozen afterwards
    images = random_images(50)
    a = extract_features(enc, images, mean=MEAN, std=STD, batch_size=7)
    b = extract_features(enc, images, mean=MEAN, std=STD, batch_size=64)
    assert a.shape == (50, 8) and a.dtype == torch.float32 and a.device.type == "cpu"
    torch.testing.assert_close(a, b)
    assert enc.training and enc.body[0].training and not enc.body[1].training


def test_extract_features_normalises_like_the_formula():
    enc = nn.Sequential(nn.Flatten())
    images = random_images(3, size=2)
    got = extract_features(enc, images, mean=MEAN, std=STD)
    mean, std = torch.tensor(MEAN)[:, None, None], torch.tensor(STD)[:, None, None]
    expected = ((images.double() / 255 - mean) / std).flatten(1).float()
    torch.testing.assert_close(got, expected)


def test_extract_features_bf16_is_close_to_fp32():
    enc = TinyEncoder()
    images = random_images(20)
    fp32 = extract_features(enc, images, mean=MEAN, std=STD)
    bf16 = extract_features(enc, images, mean=MEAN, std=STD, precision="bf16")
    assert bf16.dtype == torch.float32
    torch.testing.assert_close(bf16, fp32, atol=0.05, rtol=0.05)


def test_extract_features_feed_nhwc_batches_that_round_as_nchw_ones():
    """On a CPU in float32, feature extraction feeds a ResNet NHWC batches (oneDNN's faster convolutions); its
    features are no farther from the float64 features than NCHW batches' are (4 x theirs, at least 4 ulp of the
    largest feature). Not for the layer channels_last_hazard names, nor in float64."""
    from kontrast.encoders.resnet import resnet18
    from kontrast.evaluate.features import normalise
    from kontrast.precision import channels_last_features

    torch.manual_seed(0)
    encoder = resnet18(width=0.25, stem="cifar").eval()
    assert channels_last_features(encoder, "cpu", torch.float32)
    assert not channels_last_features(resnet18(width=0.125, stem="cifar"), "cpu", torch.float32)
    assert not channels_last_features(encoder, "cpu", torch.float64)
    assert not channels_last_features(encoder, "meta", torch.float32)
    images = random_images(24, size=32)
    first = next(m for m in encoder.modules() if isinstance(m, nn.Conv2d))
    seen = []
    first.register_forward_pre_hook(lambda m, inp: seen.append(inp[0].is_contiguous(memory_format=torch.channels_last)))
    got = extract_features(encoder, images, mean=MEAN, std=STD)
    assert seen == [True]
    x = normalise(images, torch.tensor(MEAN), torch.tensor(STD))  # [24, 3, 32, 32] in NCHW
    with torch.no_grad():
        nchw = encoder(x)  # [24, dim]
        exact = copy.deepcopy(encoder).double()(x.double())  # [24, dim]
    floor = max((nchw.double() - exact).abs().max().item(), 4 * torch.finfo(torch.float32).eps * exact.abs().max())
    assert (got.double() - exact).abs().max() <= 4 * floor


def test_extract_features_rejects_bad_input():
    with pytest.raises(UserError, match="precision"):
        extract_features(TinyEncoder(), random_images(2), mean=MEAN, std=STD, precision="fp8")
    with pytest.raises(ValueError, match="uint8"):
        extract_features(TinyEncoder(), torch.rand(2, 3, 8, 8), mean=MEAN, std=STD)


def test_raw_pixel_features():
    images = random_images(4, size=3)
    feats = raw_pixel_features(images)
    assert feats.shape == (4, 27) and feats.dtype == torch.float32
    assert 0.0 <= feats.min() and feats.max() <= 1.0
    torch.testing.assert_close(feats[1, 5], images[1].flatten()[5].float() / 255)


@pytest.mark.parametrize("m", [1023, 1024, 1025])
def test_knn_in_chunks_equals_one_pass_at_the_chunk_boundary(m):
    """Test samples are scored 1024 at a time: one below, at and one past the boundary give one pass's predictions."""
    g = torch.Generator().manual_seed(m)
    train, labels = torch.randn(300, 16, generator=g), torch.randint(0, 10, (300,), generator=g)
    test = torch.randn(m, 16, generator=g)
    chunked = knn_predict(train, labels, test, k=20)  # the default chunk of 1024
    whole = knn_predict(train, labels, test, k=20, chunk_size=m)
    assert torch.equal(chunked, whole) and chunked.shape == (m,)
