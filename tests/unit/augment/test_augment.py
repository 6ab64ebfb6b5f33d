"""augment room: batched ops match torchvision image by image, sampling is right, no per-sample loop."""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch
import torchvision.transforms as T
import torchvision.transforms.v2.functional as TF

from kontrast.augment import (
    RECIPES,
    ColorJitterParams,
    ViewSpec,
    adjust_brightness,
    adjust_contrast,
    adjust_hue,
    adjust_saturation,
    color_jitter,
    eval_view,
    gaussian_blur,
    get_recipe,
    grayscale,
    hflip,
    make_view,
    make_views,
    normalize,
    resized_crop,
    sample_color_jitter,
    sample_mask,
    sample_resized_crop,
    solarize,
    to_float,
)
from kontrast.errors import UserError

ATOL = 1e-5  # every op vs torchvision, float32 (measured: <= 2e-6, exact for crops that upsample)


pytestmark = pytest.mark.usefixtures("one_thread")


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def rand_images(b: int, h: int, w: int | None = None, seed: int = 0) -> torch.Tensor:
    return torch.rand(b, 3, h, w or h, generator=gen(seed))


def per_image(fn, images, *params):
    """torchvision reference: apply ``fn`` to each image with its own Python parameters."""
    return torch.stack([fn(images[i], *(p[i] for p in params)) for i in range(images.shape[0])])


# ----------------------------------------------------------------------------- geometry


@pytest.mark.parametrize(
    "h, w, size",
    [(32, 32, 32), (16, 16, 40), (64, 48, 32), (256, 256, 24)],
    ids=["cifar", "upsample", "down-2x", "down-10x"],
)
def test_resized_crop_matches_torchvision(h, w, size):
    images = rand_images(12, h, w)
    boxes = sample_resized_crop(12, h, w, (0.08, 1.0), (3 / 4, 4 / 3), gen(1))
    # plus hand-picked edge cases: whole image, one-pixel-wide, corner crop
    extra = torch.tensor([[0, 0, h, w], [0, w - 1, h, 1], [h - 5, w - 7, 5, 7]], dtype=torch.float32)
    boxes = torch.cat([boxes[:9], extra])
    ours = resized_crop(images, boxes, size)
    ref = per_image(
        lambda img, box: TF.resized_crop(img, *[int(v) for v in box.tolist()], [size, size], antialias=True),
        images,
        boxes,
    )
    assert ours.shape == (12, 3, size, size)
    # the per-sample interpolation matrices reproduce antialiased bilinear exactly, up- and downsampling
    torch.testing.assert_close(ours, ref, atol=ATOL, rtol=0)


def test_hflip_matches_torchvision():
    images = rand_images(6, 8)
    mask = torch.tensor([True, False, True, True, False, False])
    ref = torch.stack([TF.horizontal_flip(im) if m else im for im, m in zip(images, mask)])
    assert torch.equal(hflip(images, mask), ref)


# ----------------------------------------------------------------------------- colour


@pytest.mark.parametrize(
    "ours, theirs",
    [
        (adjust_brightness, TF.adjust_brightness),
        (adjust_contrast, TF.adjust_contrast),
        (adjust_saturation, TF.adjust_saturation),
    ],
    ids=["brightness", "contrast", "saturation"],
)
def test_blend_ops_match_torchvision(ours, theirs):
    images = rand_images(8, 16)
    factor = torch.tensor([0.0, 0.3, 0.6, 1.0, 1.2, 1.4, 1.8, 2.5])
    ref = per_image(lambda im, f: theirs(im, float(f)), images, factor)
    torch.testing.assert_close(ours(images, factor), ref, atol=ATOL, rtol=0)


def test_hue_matches_torchvision():
    images = rand_images(8, 16)
    # include grey pixels, ties between channels and saturated colours
    images[:, :, :4] = images[:, :1, :4]
    images[:, :, 4:8] = (images[:, :, 4:8] * 2).round() / 2
    hue = torch.tensor([-0.5, -0.3, -0.1, 0.0, 0.05, 0.2, 0.37, 0.5])
    ref = per_image(lambda im, f: TF.adjust_hue(im, float(f)), images, hue)
    torch.testing.assert_close(adjust_hue(images, hue), ref, atol=ATOL, rtol=0)


def test_color_jitter_follows_each_samples_order():
    b = 24
    images = rand_images(b, 12)
    params = sample_color_jitter(b, 0.4, 0.4, 0.4, 0.1, p=0.8, generator=gen(3))
    ours = color_jitter(images, params)
    tv_ops = [TF.adjust_brightness, TF.adjust_contrast, TF.adjust_saturation, TF.adjust_hue]
    orders = {tuple(o) for o in params.order.tolist()}
    assert len(orders) > 5  # samples really get different orders
    for i in range(b):
        ref = images[i]
        if params.apply[i]:
            for op in params.order[i].tolist():
                ref = tv_ops[op](ref, float(params.factors[i, op]))
        torch.testing.assert_close(ours[i], ref, atol=ATOL, rtol=0)
    off = ~params.apply
    assert off.any() and torch.equal(ours[off], images[off])


def test_color_jitter_factor_ranges():
    params = sample_color_jitter(4000, 0.4, 0.8, 1.5, 0.1, p=0.8, generator=gen(4))
    f = params.factors
    for col, lo, hi in [(0, 0.6, 1.4), (1, 0.2, 1.8), (2, 0.0, 2.5), (3, -0.1, 0.1)]:
        assert f[:, col].min() >= lo and f[:, col].max() <= hi
        assert abs(f[:, col].mean().item() - (lo + hi) / 2) < 0.05 * (hi - lo)
    assert torch.equal(params.order.sort(dim=1).values, torch.arange(4).expand(4000, 4))
    assert abs(params.apply.float().mean().item() - 0.8) < 0.03
    no_hue = sample_color_jitter(4, 0.4, 0.4, 0.4, 0.0, p=1.0, generator=gen(4))
    assert not no_hue.use_hue and torch.equal(no_hue.factors[:, 3], torch.zeros(4))


def test_grayscale_matches_torchvision():
    images = rand_images(4, 8)
    mask = torch.tensor([True, False, True, False])
    ref = torch.stack([TF.rgb_to_grayscale(im, 3) if m else im for im, m in zip(images, mask)])
    torch.testing.assert_close(grayscale(images, mask), ref, atol=ATOL, rtol=0)
    assert torch.equal(grayscale(images, mask)[~mask], images[~mask])


# ----------------------------------------------------------------------------- blur, solarize, normalise


@pytest.mark.parametrize("kernel", [3, 9, 23])
def test_gaussian_blur_per_sample_sigma(kernel):
    images = rand_images(6, 32)
    sigma = torch.tensor([0.1, 0.5, 1.0, 1.5, 2.0, 3.0])
    mask = torch.tensor([True, True, True, True, False, True])
    ours = gaussian_blur(images, sigma, kernel, mask)
    ref = torch.stack(
        [TF.gaussian_blur(im, [kernel, kernel], [float(s)] * 2) if m else im for im, s, m in zip(images, sigma, mask)]
    )
    torch.testing.assert_close(ours, ref, atol=ATOL, rtol=0)
    assert torch.equal(ours[4], images[4])


def test_solarize_and_normalize_match_torchvision():
    images = rand_images(4, 8)
    mask = torch.tensor([True, False, True, True])
    ref = torch.stack([TF.solarize(im, 0.5) if m else im for im, m in zip(images, mask)])
    assert torch.equal(solarize(images, 0.5, mask), ref)
    mean, std = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)
    ref = TF.normalize(images, list(mean), list(std))
    torch.testing.assert_close(normalize(images, mean, std), ref, atol=ATOL, rtol=0)


# ----------------------------------------------------------------------------- sampling


@pytest.mark.parametrize("h, w", [(32, 32), (60, 100)])
def test_crop_boxes_valid_and_distributed_like_torchvision(h, w):
    n, scale, ratio = 4000, (0.08, 1.0), (3 / 4, 4 / 3)
    boxes = sample_resized_crop(n, h, w, scale, ratio, gen(5))
    top, left, bh, bw = boxes.unbind(1)
    assert boxes.dtype == torch.float32 and torch.equal(boxes, boxes.round())
    assert (top >= 0).all() and (left >= 0).all() and (bh >= 1).all() and (bw >= 1).all()
    assert (top + bh <= h).all() and (left + bw <= w).all()
    area = bh * bw / (h * w)
    log_ratio = torch.log(bw / bh)
    # rounding w, h to integers moves area and ratio slightly outside the nominal ranges
    slack = 2.5 / min(h, w)
    assert area.min() >= scale[0] * (1 - 2 * slack) and area.max() <= 1.0
    assert log_ratio.min() >= math.log(ratio[0]) - 2 * slack and log_ratio.max() <= math.log(ratio[1]) + 2 * slack
    # same distribution as torchvision's per-image rejection sampler
    torch.manual_seed(0)
    img = torch.empty(3, h, w)
    ref = torch.tensor([T.RandomResizedCrop.get_params(img, list(scale), list(ratio)) for _ in range(n)])
    ref_area = ref[:, 2] * ref[:, 3] / (h * w)
    assert abs(area.mean().item() - ref_area.float().mean().item()) < 0.02
    assert abs(log_ratio.mean().item() - torch.log(ref[:, 3] / ref[:, 2]).mean().item()) < 0.02
    # positions are uniform over the free range: centre of the crop averages to the image centre
    assert abs((top + bh / 2).mean().item() / h - 0.5) < 0.02
    assert abs((left + bw / 2).mean().item() / w - 0.5) < 0.02


def test_crop_fallback_is_torchvisions_centre_crop():
    # a 2:1..3:1 ratio covering the whole area never fits a square image -> fallback
    boxes = sample_resized_crop(5, 32, 32, (1.0, 1.0), (2.0, 3.0), gen(0))
    ref = T.RandomResizedCrop.get_params(torch.empty(3, 32, 32), [1.0, 1.0], [2.0, 3.0])
    assert boxes.tolist() == [list(map(float, ref))] * 5


def test_flip_rate_and_seeds():
    flips = sample_mask(20000, 0.5, gen(0))
    assert abs(flips.float().mean().item() - 0.5) < 0.015
    images = torch.randint(0, 256, (8, 3, 32, 32), dtype=torch.uint8, generator=gen(1))
    specs = get_recipe("moco_v2")
    a = make_views(images, specs, gen(7))
    b = make_views(images, specs, gen(7))
    c = make_views(images, specs, gen(8))
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert not torch.equal(a[0], c[0])
    assert not torch.equal(a[0], a[1])  # the two views of a pair differ


# ----------------------------------------------------------------------------- views


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_make_views_shapes(name):
    images = torch.randint(0, 256, (5, 3, 40, 36), dtype=torch.uint8, generator=gen(2))
    specs = get_recipe(name)
    views = make_views(images, specs, gen(0))
    assert len(views) == len(specs) >= 1  # one view (CLIP, CPC) to six (SwAV multi-crop)
    for v, spec in zip(views, specs):
        assert v.shape == (5, 3, spec.size, spec.size) and v.dtype == torch.float32
        assert torch.isfinite(v).all()
    one = make_view(images, specs[0], gen(0))
    assert torch.equal(one, views[0])  # make_views draws view 1 first, from the same stream


def test_recipes_are_the_papers():
    simclr, moco, byol = get_recipe("simclr_cifar"), get_recipe("moco_v2"), get_recipe("byol")
    assert simclr[0] == simclr[1] and simclr[0].blur_p == 0 and simclr[0].crop_scale == (0.08, 1.0)
    assert moco[0] == moco[1] and moco[0].crop_scale == (0.2, 1.0) and moco[0].blur_p == 0.5
    assert byol[0] != byol[1]
    assert (byol[0].blur_p, byol[0].solarize_p, byol[1].blur_p, byol[1].solarize_p) == (1.0, 0.0, 0.1, 0.2)
    assert byol[0].jitter == byol[1].jitter == (0.4, 0.4, 0.2, 0.1)
    with pytest.raises(UserError, match="simclr_cifar"):
        get_recipe("simclr_imagenet_typo")
    with pytest.raises(UserError, match="blur_kernel"):
        ViewSpec(blur_kernel=4)
    with pytest.raises(UserError, match="gray_p"):
        ViewSpec(gray_p=1.5)


def test_eval_view():
    spec = ViewSpec()
    images = torch.randint(0, 256, (3, 3, 32, 32), dtype=torch.uint8, generator=gen(0))
    x = to_float(images)
    assert torch.equal(x, TF.to_dtype(images, torch.float32, scale=True))
    assert torch.equal(eval_view(images, spec), normalize(x, spec.mean, spec.std))
    big = torch.randint(0, 256, (2, 3, 64, 48), dtype=torch.uint8, generator=gen(0))
    ref = TF.normalize(TF.resize(to_float(big), [32, 32], antialias=True), list(spec.mean), list(spec.std))
    torch.testing.assert_close(eval_view(big, spec), ref, atol=ATOL, rtol=0)


def test_jitter_params_is_a_tuple_of_tensors():
    p = sample_color_jitter(64, 0.4, 0.4, 0.4, 0.1, 0.8, gen(0))
    assert isinstance(p, ColorJitterParams) and p.factors.shape == (64, 4) and p.order.dtype == torch.int64
    assert ((p.factors[:, :3] >= 0.6) & (p.factors[:, :3] <= 1.4)).all()  # brightness, contrast, saturation: 1 +- 0.4
    assert (p.factors[:, 3].abs() <= 0.1).all()  # hue: +- 0.1
    assert (p.order.sort(dim=1).values == torch.arange(4)).all()  # each row a permutation of the four ops
    assert len({tuple(r) for r in p.order.tolist()}) > 1  # drawn per sample


# ----------------------------------------------------------------------------- no per-sample loop


def op_counts(fn) -> tuple[Counter, Counter]:
    """(all operator calls, top-level calls) made by ``fn``, by name."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    events = prof.events()
    return Counter(e.name for e in events), Counter(e.name for e in events if e.cpu_parent is None)


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_operator_calls_do_not_grow_with_batch(name):
    specs = get_recipe(name)
    counts = {}
    for b in (8, 64):
        images = torch.randint(0, 256, (b, 3, 32, 32), dtype=torch.uint8, generator=gen(0))
        make_views(images, specs, gen(0))  # warm-up
        counts[b] = op_counts(lambda: make_views(images, specs, gen(0)))
    # torch.zeros allocates small tensors zeroed and fills large ones with one aten::fill_ (RandAugment's
    # equalize histogram crosses that size between 8 and 64 images): not a per-sample call, so not counted
    assert {k: v for k, v in counts[8][0].items() if k != "aten::fill_"} == \
        {k: v for k, v in counts[64][0].items() if k != "aten::fill_"}
    assert counts[8][1] == counts[64][1]
    # a fixed, modest number of calls per view; RandAugment computes all its 15 ops in each of its layers
    assert sum(counts[8][1].values()) < 500 * len(specs) + 400 * sum(s.randaugment_n for s in specs)
    host_reads = {"aten::item", "aten::_local_scalar_dense", "aten::nonzero", "aten::masked_select"}
    assert not host_reads & set(counts[64][0])  # nothing that would synchronise with a GPU


def test_apply_ops_need_no_values():
    """Every apply op runs on the meta device (shapes only): no data-dependent host read anywhere."""
    b = 4
    x, boxes = torch.empty(b, 3, 32, 32, device="meta"), torch.empty(b, 4, device="meta")
    mask, f = torch.empty(b, dtype=torch.bool, device="meta"), torch.empty(b, device="meta")
    order = torch.empty(b, 4, dtype=torch.long, device="meta")
    jitter = ColorJitterParams(torch.empty(b, 4, device="meta"), order, mask)
    outs = [
        resized_crop(x, boxes, 24),
        hflip(x, mask),
        color_jitter(x, jitter),
        grayscale(x, mask),
        gaussian_blur(x, f, 3, mask),
        solarize(x, 0.5, mask),
        normalize(x, (0.5, 0.5, 0.5), (0.2, 0.2, 0.2)),
    ]
    assert outs[0].shape == (b, 3, 24, 24) and all(o.shape == x.shape for o in outs[1:])
