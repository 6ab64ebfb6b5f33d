"""Native resolution: from 64 px up each method takes its paper's ImageNet recipe (blur, solarize, multi-crop
sizes, ImageNet statistics), and the ops those recipes add are torchvision's at 64, 96, 160 and 224 px, on the
memory path (batched on the device) and on the streaming path (the crop made at decode time)."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
import torchvision.transforms.v2.functional as TF
from PIL import Image

from kontrast.augment import (
    NATIVE_SIZE,
    SampleRNG,
    blur_kernel_for,
    derive_key,
    gaussian_blur,
    key_tensor,
    native_recipe,
    ops,
    recipe_views,
    resized_crop,
    sample_resized_crop,
    solarize,
    to_float,
)
from kontrast.augment.recipes import NATIVE
from kontrast.data import write_shapes_files
from kontrast.data.stream_decode import decode_views
from kontrast.methods import METHODS
from support.cli import in_process

SIZES = [64, 96, 160, 224]
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


pytestmark = pytest.mark.usefixtures("one_thread")


def test_each_method_takes_its_imagenet_recipe_from_native_size():
    for cifar, imagenet in NATIVE.items():
        assert native_recipe(cifar, 32) == native_recipe(cifar, NATIVE_SIZE - 1) == cifar
        assert native_recipe(cifar, NATIVE_SIZE) == native_recipe(cifar, 224) == imagenet
        assert all(s.mean == IMAGENET_MEAN or imagenet == "clip_imagenet" for s in recipe_views(imagenet, 96))
    for name in ("amdim_cifar", "cpc_v2_cifar", "yadim"):  # their own pipelines at every size
        assert native_recipe(name, 224) == name
    image_methods = {m.recipe for m in map(METHODS.get, METHODS.names()) if m.recipe}
    assert image_methods - set(NATIVE) <= {"amdim_cifar", "cpc_v2_cifar", "yadim"}


def test_the_imagenet_recipes_are_the_papers():
    simclr = recipe_views("simclr_imagenet", 224)
    assert simclr[0] == simclr[1]  # SimCLR appendix A: s = 1, blur p 0.5 with a kernel of 10% of the side
    assert (simclr[0].jitter, simclr[0].blur_p, simclr[0].blur_kernel) == ((0.8, 0.8, 0.8, 0.2), 0.5, 23)
    byol = recipe_views("byol_imagenet", 224)  # BYOL table 6
    assert [(s.blur_p, s.solarize_p) for s in byol] == [(1.0, 0.0), (0.1, 0.2)]
    moco = recipe_views("moco_v2_imagenet", 224)[0]
    assert (moco.crop_scale, moco.blur_p, moco.jitter) == ((0.2, 1.0), 0.5, (0.4, 0.4, 0.4, 0.1))
    assert recipe_views("simsiam_imagenet", 224) == recipe_views("moco_v2_imagenet", 224)
    swav = recipe_views("swav_imagenet", 224)  # main_swav.py: 2 x 224 (0.14-1) + 6 x 96 (0.05-0.14), blur 0.5
    assert [s.size for s in swav] == [224] * 2 + [96] * 6 and {s.blur_p for s in swav} == {0.5}
    assert [s.crop_scale for s in swav] == [(0.14, 1.0)] * 2 + [(0.05, 0.14)] * 6
    dino = recipe_views("dino_imagenet", 224)  # DataAugmentationDINO: 2 x 224 (0.4-1) + 8 x 96 (0.05-0.4)
    assert [s.size for s in dino] == [224] * 2 + [96] * 8
    assert [(s.blur_p, s.solarize_p) for s in dino[:3]] == [(1.0, 0.0), (0.1, 0.2), (0.5, 0.0)]
    assert [recipe_views("simclr_imagenet", n)[0].blur_kernel for n in SIZES] == [7, 9, 17, 23]


def test_the_blur_kernel_is_simclrs_ten_percent_and_cifar_keeps_three():
    assert [blur_kernel_for(n) for n in (16, 32, 39, 40, 64, 96, 160, 224)] == [3, 3, 3, 5, 7, 9, 17, 23]
    assert recipe_views("moco_v2", 32)[0].blur_kernel == 3  # the CIFAR rows of the results table are unchanged


def _photo(h: int, w: int, seed: int = 0) -> torch.Tensor:
    """A float photo-like batch: smooth gradients plus noise (so antialiasing and blur both matter)."""
    g = torch.Generator().manual_seed(seed)
    y, x = torch.meshgrid(torch.linspace(0, 1, h), torch.linspace(0, 1, w), indexing="ij")
    base = torch.stack([x, y, (x + y) / 2])[None]  # [1, 3, H, W]
    return (0.7 * base + 0.3 * torch.rand(4, 3, h, w, generator=g)).clamp(0, 1)  # [4, 3, H, W]


@pytest.mark.parametrize("size", SIZES)
def test_native_ops_match_torchvision(size):
    """Each op the ImageNet recipes add, at the recipe's own resolution: the antialiased crop of a 256x320 photo,
    the blur at that size's kernel, and solarize, against torchvision's per image (1e-5, as the CIFAR ops)."""
    images = _photo(256, 320)
    boxes = sample_resized_crop(4, 256, 320, (0.08, 1.0), (3 / 4, 4 / 3), torch.Generator().manual_seed(size))
    crops = resized_crop(images, boxes, size)  # [4, 3, size, size]
    ref = torch.stack([TF.resized_crop(im, *[int(v) for v in b.tolist()], [size, size], antialias=True)
                       for im, b in zip(images, boxes)])
    torch.testing.assert_close(crops, ref, atol=1e-5, rtol=0)
    kernel, sigma, mask = blur_kernel_for(size), torch.tensor([0.1, 0.9, 2.0, 1.5]), torch.tensor([1, 1, 1, 0]).bool()
    ref = torch.stack([TF.gaussian_blur(c, [kernel, kernel], [float(s)] * 2) if m else c
                       for c, s, m in zip(crops, sigma, mask)])
    torch.testing.assert_close(gaussian_blur(crops, sigma, kernel, mask), ref, atol=1e-5, rtol=0)
    ref = torch.stack([TF.solarize(c, 0.5) if m else c for c, m in zip(crops, mask)])
    assert torch.equal(solarize(crops, 0.5, mask), ref)


@pytest.mark.parametrize("size", [96, 224])
def test_decode_time_crops_of_a_256px_jpeg_match_the_device_at_native_size(size):
    """The streaming path's crop (PIL, JPEG draft mode, antialiased box resize) of a 256-px JPEG is the memory
    path's crop of the same image to within JPEG rounding, at the ImageNet recipe's sizes (multi-crop too)."""
    y, x = np.mgrid[0:256, 0:256]
    rgb = np.stack([x, y, (x + y) // 2], axis=2).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, "JPEG", quality=95)
    full = to_float(torch.from_numpy(np.array(Image.open(io.BytesIO(buf.getvalue())))).permute(2, 0, 1)[None])
    specs, key = recipe_views("swav_imagenet", size), derive_key("augment", 0, 1)
    for sample in range(3):
        views = decode_views(buf.getvalue(), key, sample, specs)
        rng = SampleRNG(key_tensor(key), torch.tensor([sample]))
        for v, spec in enumerate(specs):
            box = ops.sample_resized_crop(1, 256, 256, spec.crop_scale, spec.crop_ratio, rng.for_view(v))
            device = ops.resized_crop(full, box, spec.size)[0]  # [3, S, S]
            assert views[v].shape == (3, spec.size, spec.size)
            assert (to_float(views[v]) - device).abs().mean() < 1.5 / 255


def test_a_run_at_64px_trains_on_the_imagenet_recipe_and_says_so(tmp_path, monkeypatch, capsys):
    root = tmp_path / "shapes"
    write_shapes_files(root, 16, size=72, seed=0)
    args = ["train", "--data", str(root), "--epochs", "1", "--batch-size", "8", "--no-progress",
            "--set", "encoder.width=0.125", "--set", "encoder.stem=imagenet", "--set", "data.size=64",
            "--set", "train.device=cpu", "--set", "train.num_threads=1"]
    assert in_process([*args, "--out", str(tmp_path / "run")]) == 0
    out = capsys.readouterr().out
    assert "views: 'simclr_imagenet', the ImageNet version of 'simclr_cifar' at data.size 64" in out
    kept = [*args, "--out", str(tmp_path / "kept"), "--set", "augment.recipe=simclr_cifar"]
    assert in_process(kept) == 0
    assert "views:" not in capsys.readouterr().out
