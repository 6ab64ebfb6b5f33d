"""RandAugment (InfoMin's recipe): batched per-sample ops match torchvision image by image."""

from __future__ import annotations

import math

import pytest
import torch
import torchvision.transforms.v2.functional as TF
from torchvision.transforms import InterpolationMode

from kontrast.augment import get_recipe, make_views
from kontrast.augment import randaugment as ra

ATOL = 1e-5  # float32 vs torchvision (measured: affine <= 2.6e-6, sharpness 6e-8, the rest exact)
FILL = (0.49, 0.48, 0.45)


def _images(b=6, h=20, w=24, seed=0):
    return torch.rand(b, 3, h, w, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("op", ra.GEOMETRIC)
def test_geometric_ops_match_torchvision_affine(op):
    """One batched grid_sample == TF.affine per image, with torchvision RandAugment's arguments
    (rotation about the centre, shears about the top-left corner, translation in pixels)."""
    x = _images()
    b, _, h, w = x.shape
    amount = torch.linspace(-1.0, 1.0, b)  # signed levels
    which = torch.zeros(b, len(ra.GEOMETRIC), dtype=torch.bool)
    which[:, ra.GEOMETRIC.index(op)] = True
    out = ra.affine(x, ra._geometric_matrix(x, which, amount), FILL)
    for i, a in enumerate(amount.tolist()):
        kw = dict(angle=0.0, translate=[0.0, 0.0], scale=1.0, shear=[0.0, 0.0])
        center = None
        if op == "rotate":
            kw["angle"] = 30.0 * a
        elif op == "shear_x":
            kw["shear"], center = [math.degrees(math.atan(0.3 * a)), 0.0], [0, 0]
        elif op == "shear_y":
            kw["shear"], center = [0.0, math.degrees(math.atan(0.3 * a))], [0, 0]
        elif op == "translate_x":
            kw["translate"] = [0.45 * a * w, 0.0]
        else:
            kw["translate"] = [0.0, 0.45 * a * h]
        ref = TF.affine(x[i], **kw, interpolation=InterpolationMode.BILINEAR, fill=list(FILL), center=center)
        torch.testing.assert_close(out[i], ref, atol=ATOL, rtol=0)


def test_identity_matrix_returns_the_image():
    x = _images()
    which = torch.zeros(len(x), len(ra.GEOMETRIC), dtype=torch.bool)
    torch.testing.assert_close(ra.affine(x, ra._geometric_matrix(x, which, torch.ones(len(x))), FILL), x,
                               atol=ATOL, rtol=0)  # measured 1.1e-6 (grid arithmetic)


def test_posterize_solarize_sharpness_match_torchvision():
    x = _images(b=9)
    bits = torch.arange(9.0)  # 0..8 bits, one per sample
    post = ra.posterize(x, bits)
    thresholds = torch.linspace(0.0, 1.0, 9)
    sol = ra.solarize(x, thresholds)
    factors = torch.linspace(0.1, 1.9, 9)
    sharp = ra.adjust_sharpness(x, factors)
    for i in range(9):
        assert torch.equal(post[i], TF.posterize(x[i], int(bits[i])))
        assert torch.equal(sol[i], TF.solarize(x[i], float(thresholds[i])))
        torch.testing.assert_close(sharp[i], TF.adjust_sharpness(x[i], float(factors[i])), atol=ATOL, rtol=0)


def test_batched_torchvision_ops_work_per_image():
    """TF.equalize runs on the whole batch and autocontrast is ours: each image must still be treated alone."""
    x = _images(b=4)
    x[1] *= 0.3  # a dark image: its own histogram / range must not leak into the others
    x[2, 1] = 0.25  # a flat channel: left as is
    eq, ac = TF.equalize(x), ra.autocontrast(x)
    for i in range(4):
        assert torch.equal(eq[i], TF.equalize(x[i]))
        torch.testing.assert_close(ac[i], TF.autocontrast(x[i]), atol=1e-6, rtol=0)


def test_solarize_add():
    x = torch.tensor([0.0, 0.2, 0.49, 0.51, 0.9]).view(1, 1, 1, 5).expand(2, 3, 1, 5)
    out = ra.solarize_add(x, torch.tensor([0.0, 0.6]))
    assert torch.equal(out[0], x[0])
    torch.testing.assert_close(out[1, 0, 0], torch.tensor([0.6, 0.8, 1.0, 0.51, 0.9]))


def test_sampling_distribution():
    g = torch.Generator().manual_seed(0)
    p = ra.sample_randaugment(20000, 2, 10.0, 0.5, 0.5, g)
    assert p.op.shape == (20000, 2) and p.op.min() == 0 and p.op.max() == len(ra.OPS) - 1
    counts = torch.bincount(p.op.flatten(), minlength=len(ra.OPS)).float() / p.op.numel()
    assert (counts - 1 / len(ra.OPS)).abs().max() < 0.01  # uniform over the 15 ops
    assert abs(p.apply.float().mean().item() - 0.5) < 0.01
    assert abs((p.sign > 0).float().mean().item() - 0.5) < 0.01
    assert p.level.min() >= 0 and p.level.max() == 1.0  # N(10, 0.5) clipped to [0, 10], / 10
    # E[min(X, 10)] for X ~ N(10, 0.5) is 10 - 0.5 / sqrt(2 pi) = 9.80
    assert abs(p.level.mean().item() - (10 - 0.5 / math.sqrt(2 * math.pi)) / 10) < 0.002


def test_each_sample_gets_its_own_op():
    """The batched layer equals applying every sample's draw to that sample alone; skipped samples are untouched."""
    x = _images(b=len(ra.OPS) * 2, h=16, w=16, seed=3)
    b = len(x)
    op = torch.arange(b) % len(ra.OPS)
    level = torch.linspace(0.3, 1.0, b)
    sign = torch.where(torch.arange(b) % 2 == 0, 1.0, -1.0)
    apply = torch.arange(b) < len(ra.OPS)  # the second half draws the same ops but skips them
    out = ra._layer(x, op, level, sign, apply, FILL)
    for i in range(b):
        alone = ra._layer(x[i : i + 1], op[i : i + 1], level[i : i + 1], sign[i : i + 1], apply[i : i + 1], FILL)
        torch.testing.assert_close(out[i : i + 1], alone, atol=1e-6, rtol=0)
        if not apply[i]:
            assert torch.equal(out[i], x[i])
        elif ra.OPS[op[i]] not in ("posterize", "solarize"):  # at these levels posterize/solarize may be no-ops
            assert not torch.equal(out[i], x[i]), ra.OPS[op[i]]


def test_infomin_views_are_reproducible_and_finite():
    images = torch.randint(0, 256, (16, 3, 32, 32), dtype=torch.uint8)
    specs = get_recipe("infomin")
    a = make_views(images, specs, torch.Generator().manual_seed(1))
    b = make_views(images, specs, torch.Generator().manual_seed(1))
    assert [v.shape for v in a] == [(16, 3, 32, 32)] * 2
    assert all(torch.equal(u, v) and torch.isfinite(u).all() for u, v in zip(a, b))
