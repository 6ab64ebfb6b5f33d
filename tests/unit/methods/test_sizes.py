"""The smallest image each method and encoder takes: trained at the limit, refused in one line one pixel below."""

import pytest
import torch

from kontrast.augment import make_views
from kontrast.config import merge, parse_override
from kontrast.decisions import decide, smallest_size, view_specs
from kontrast.errors import Refusal, UserError
from kontrast.methods.base import Progress
from kontrast.methods.build import create_method, resolve
from support.cli import in_process
from support.sizes import small_heads


def _cfg(method: str, size: int, *items: str):
    raw = {"method": {"name": method}, "data": {"size": size}}
    for item in [*items, *small_heads(method)]:
        raw = merge(raw, parse_override(item))
    return resolve(raw)


LIMITS = [  # (method, settings, smallest data.size, what the error names)
    ("simclr", ["encoder.stem=cifar", "encoder.width=0.25"], 8, "at least 8 px"),
    ("simclr", ["encoder.stem=imagenet", "encoder.width=0.25"], 32, "at least 32 px"),
    ("swav", ["encoder.stem=cifar", "encoder.width=0.25"], 15, "at least 8 px"),  # small crops: half the side
    ("amdim", [], 32, "at least 32 px"),
    ("yadim", [], 32, "at least 32 px"),
    ("cpc_v2", ["encoder.width=0.25"], 20, "own structure takes views of at least 20 px"),
    ("byol", ["encoder.name=vit_tiny", "encoder.width=0.125", "encoder.depth=1", "encoder.patch_size=4"], 4, ""),
]


@pytest.mark.parametrize("method, items, smallest, fragment", LIMITS,
                         ids=lambda v: str(v) if isinstance(v, int) else None)
def test_smallest_size_trains_and_one_pixel_less_is_refused(method, items, smallest, fragment):
    cfg = _cfg(method, smallest, *items)
    model = create_method(cfg, num_samples=4)  # accepted at the limit (create_method decides and checks) ...
    assert smallest_size(cfg) == smallest
    images = torch.randint(0, 256, (4, 3, smallest, smallest), dtype=torch.uint8)
    views = make_views(images, view_specs(cfg), torch.Generator().manual_seed(0))
    out = model.training_step(views, torch.arange(4), Progress(0, 0, 1, 1))  # ... and runs there
    assert torch.isfinite(out["loss"])
    if smallest > 4:
        below = _cfg(method, smallest - 1, *items)
        with pytest.raises(UserError,
                           match=f"data.size {smallest - 1} is too small.*{fragment}.*set data.size={smallest}"):
            decide(below)


@pytest.mark.parametrize("method, items, fragment", [
    ("amdim", ["encoder.name=vit_tiny", "encoder.width=0.125", "encoder.depth=1"], "feature maps at >= 3 scales"),
    ("cpc_v2", ["encoder.stem=imagenet", "encoder.width=0.25"], "patches of at least 32 px, the patches are 8 px"),
    ("simclr", ["encoder.name=vit_tiny", "encoder.width=0.125", "encoder.depth=1", "data.size=18"], "not tile 18"),
    ("ibot", ["encoder.name=resnet18", "encoder.width=0.125"], "ibot works on patch tokens and needs a ViT encoder"),
])
def test_a_combination_that_cannot_train_is_refused_in_one_line(method, items, fragment, tmp_path, capsys):
    args = ["train", "--method", method, "--data", "shapes:40", "--batch-size", "4", "--epochs", "1",
            "--out", str(tmp_path / "run"), "--no-progress", "--set", "data.size=32"]
    for item in items:
        args += ["--set", item]
    assert in_process(args) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and fragment in lines[0], lines
    assert not (tmp_path / "run" / "checkpoints").exists()


@pytest.mark.parametrize("size, patch, local", [(64, 4, 28), (96, 8, 40), (224, 16, 96), (32, 4, 16)])
def test_multi_crop_views_on_a_vit_are_whole_patches(size, patch, local):
    """DINO's local crops are 96/224 of the side: on a ViT rounded to whole patches (27.4 px -> 28 with 4-px patches,
    41.1 -> 40 with 8-px ones; 224 px keeps the paper's 96), on a ResNet left as they are."""
    cfg = resolve({"method": {"name": "dino"}, "data": {"size": size},
                   "encoder": {"name": "vit_tiny", "width": 0.125, "depth": 1, "patch_size": patch}})
    sides = [spec.size for spec in view_specs(cfg)]
    assert sides[:2] == [size, size] and set(sides[2:]) == {local}
    resnet = resolve({"method": {"name": "dino"}, "data": {"size": 64}, "encoder": {"width": 0.125}})
    assert view_specs(resnet)[2].size == 27


@pytest.mark.parametrize("size", [64, 72])
def test_a_refused_size_advises_sizes_that_train(size):
    """SwAV at 64-73 px: the ImageNet recipe and stem from 64 px make its small crops too small for the stem, while
    63 px (CIFAR recipe and stem) and 74 px train. The refusal advises both, by the rule the run follows."""
    cfg = _cfg("swav", size, "encoder.width=0.125")
    with pytest.raises(Refusal, match=f"data.size {size} does not work for swav.*set data.size=74 or larger, or 63") \
            as refused:
        decide(cfg)
    assert refused.value.advice == {"data.size": 74}
    for advised in (74, 63):
        assert decide(_cfg("swav", advised, "encoder.width=0.125")).size == advised


@pytest.mark.parametrize("method, items, world", [
    ("swav", ["data.size=72"], 1), ("amdim", ["data.size=24"], 1), ("cpc_v2", ["data.size=16"], 1),
    ("ibot", ["encoder.name=resnet18"], 1), ("moco_v2", ["method.bn_groups=3"], 2),
    ("cpc_v2", ["data.size=32", "method.negative_pool=24"], 2), ("simclr", ["train.batch_size=33"], 2),
    ("simclr", ["train.accumulate=4", "train.batch_size=18"], 1), ("moco_v2", ["method.head_bn_groups=false"], 2),
    ("swav", ["augment.views=1"], 1), ("cpc", ["augment.recipe=simclr_cifar"], 1),
])
def test_every_refusal_advice_applied_then_decides(method, items, world):
    """A refusal's advice is a setting that works: applied to the config, the decisions are made without refusal."""
    raw = {"method": {"name": method}, "train": {"batch_size": 32}}
    for item in [*items, *small_heads(method)]:
        raw = merge(raw, parse_override(item))
    with pytest.raises(Refusal) as refused:
        decide(resolve(raw), world)
    advice = refused.value.advice
    assert advice, refused.value
    if "nproc" in advice:
        world = advice.pop("nproc")
    for key, value in advice.items():
        raw = merge(raw, parse_override(f"{key}={'null' if value is None else value}"))
    decide(resolve(raw), world)
