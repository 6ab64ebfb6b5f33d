"""The built-in shapes dataset: deterministic, balanced, visible, and hard for raw pixels."""

import pytest
import torch
import torch.nn.functional as F

from kontrast.data import SHAPE_CLASSES, load_images, make_shapes
from kontrast.data import shapes as shapes_module
from kontrast.errors import UserError


def _knn_accuracy(train_x, train_y, test_x, test_y, k=200, temperature=0.1) -> float:
    """Weighted kNN on L2-normalised flattened pixels (cosine, exp(sim / T) votes)."""
    a = F.normalize(train_x.flatten(1).float(), dim=1)  # [N, D]
    b = F.normalize(test_x.flatten(1).float(), dim=1)  # [M, D]
    sims, idx = (b @ a.T).topk(k, dim=1)  # [M, k]
    votes = torch.zeros(len(b), len(SHAPE_CLASSES)).scatter_add_(
        1, train_y[idx], (sims / temperature).exp()
    )  # [M, C]
    return (votes.argmax(1) == test_y).float().mean().item()


def test_ten_distinct_class_names():
    assert len(SHAPE_CLASSES) == 10 and len(set(SHAPE_CLASSES)) == 10


def test_deterministic_in_seed():
    a_img, a_lab = make_shapes(64, seed=3)
    b_img, b_lab = make_shapes(64, seed=3)
    c_img, _ = make_shapes(64, seed=4)
    assert torch.equal(a_img, b_img) and torch.equal(a_lab, b_lab)
    assert not torch.equal(a_img, c_img)


def test_dtype_shape_and_value_range():
    images, labels = make_shapes(100, seed=0, size=24)
    assert images.dtype == torch.uint8 and images.shape == (100, 3, 24, 24)
    assert images.is_contiguous()
    assert labels.dtype == torch.int64 and labels.shape == (100,)
    assert 0 <= labels.min() and labels.max() < len(SHAPE_CLASSES)
    # random colours use the whole range; every single image has visible structure
    assert images.min() < 20 and images.max() > 235
    per_image_spread = images.flatten(1).float().std(dim=1)  # [100]
    assert per_image_spread.min() > 10


@pytest.mark.parametrize("n", [1000, 1003])
def test_classes_balanced(n):
    _, labels = make_shapes(n, seed=0, size=8)
    counts = labels.bincount(minlength=10)
    assert counts.max() - counts.min() <= 1


def test_colours_vary_within_simclr_jitter_and_stay_visible():
    """Each image's pair is the base pair through one colour jitter: colours vary, the shape stays visible."""
    fg, bg = shapes_module._jittered_pair(5000, torch.Generator().manual_seed(0))  # [5000, 3] each
    assert fg.shape == bg.shape == (5000, 3) and 0 <= fg.min() and fg.max() <= 1
    assert fg.std(dim=0).min() > 0.05 and bg.std(dim=0).min() > 0.02  # per-channel spread across images
    assert (fg - bg).abs().amax(dim=1).min() > 0.1  # the shape always differs from its background
    # zero jitter gives back the base pair exactly
    saved = shapes_module._JITTER
    try:
        shapes_module._JITTER = (0.0, 0.0, 0.0, 0.0)
        fg0, bg0 = shapes_module._jittered_pair(3, torch.Generator().manual_seed(0))
    finally:
        shapes_module._JITTER = saved
    assert torch.allclose(fg0, shapes_module._BASE_FG.expand(3, 3), atol=1e-6)
    assert torch.allclose(bg0, shapes_module._BASE_BG.expand(3, 3), atol=1e-6)


def test_raw_pixel_knn_is_poor():
    """Colour and position dominate pixel distances: raw kNN stays far from solving it."""
    train_x, train_y = make_shapes(2000, seed=0)
    test_x, test_y = make_shapes(500, seed=1)
    assert _knn_accuracy(train_x, train_y, test_x, test_y) < 0.40


def test_load_images_shapes_splits(tmp_path):
    train = load_images("shapes:50", "train", cache_dir=tmp_path)
    test = load_images("shapes:50", "test", cache_dir=tmp_path, size=16)
    assert train.x.shape == (50, 3, 32, 32) and test.x.shape == (10, 3, 16, 16)
    assert train.classes == list(SHAPE_CLASSES) and "shapes" in train.name
    assert not torch.equal(train.x[:10, :, :16, :16], test.x)  # different seeds
    assert list(tmp_path.iterdir()) == []  # generated, never cached


@pytest.mark.parametrize("bad", ["shapes:", "shapes:abc", "shapes:3", "shapes:-5"])
def test_bad_shapes_spec(bad):
    with pytest.raises(UserError, match="shapes:N"):
        load_images(bad)
