"""Every registered method: a smoke step on CPU, and a short learning run on CIFAR-10."""

import json
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import save

from kontrast.methods import METHODS
from kontrast.methods.base import Progress
from kontrast.methods.build import create_method, resolve, view_specs
from kontrast.augment import make_views
from kontrast.data import Samples
from kontrast.train.loop import fit

TINY = {"encoder": {"name": "resnet18", "width": 0.125}}
# Methods on images; sequence methods (recipe None: CPC v1) have their own tests in test_local_methods.py.
IMAGE_METHODS = [name for name in METHODS.names() if METHODS.get(name).recipe is not None]


@pytest.mark.parametrize("name", IMAGE_METHODS)
def test_smoke_step(name):
    cfg = resolve({"method": {"name": name}, **TINY})
    method = create_method(cfg, num_samples=8)  # a dataset of 8 images (sizes per-sample state)
    assert method.description and method.recipe
    images = torch.randint(0, 256, (8, 3, 32, 32), dtype=torch.uint8)
    method.bind_data(Samples(images, torch.arange(8) % 2, ["cat", "dog"], "smoke"))  # as the loop does (CLIP's captions)
    views = make_views(images, view_specs(cfg, method), torch.Generator().manual_seed(0))
    before = [p.detach().clone() for p in method.parameters()]
    out = method.training_step(views, torch.arange(8), Progress(step=0, epoch=0, total_steps=2, steps_per_epoch=1))
    assert out["loss"].ndim == 0 and torch.isfinite(out["loss"])
    out["loss"].backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in method.encoder.parameters())
    with torch.no_grad():
        for p in method.parameters():
            if p.grad is not None:
                p.sub_(0.1 * p.grad)
    method.after_step(out, Progress(step=1, epoch=0, total_steps=2, steps_per_epoch=1))  # half of the run done
    assert any(not torch.equal(a, b) for a, b in zip(before, method.parameters()))
    save(dict(method.state_dict()))  # checkpointable: no shared tensors


# Short-budget settings per method, shared with the results table (benchmarks/results.py).
SHORT_BUDGET = yaml.safe_load((Path(__file__).resolve().parents[1] / "benchmarks/short_budget.yaml").read_text())


def test_every_image_method_has_short_budget_settings():
    assert set(SHORT_BUDGET) == set(IMAGE_METHODS)


@pytest.mark.slow
@pytest.mark.shared_data
@pytest.mark.parametrize("name", IMAGE_METHODS)
def test_learning(name, tmp_path, shared_cifar_tar):
    """Loss falls and kNN top-1 on CIFAR-10's test split beats chance and the untrained encoder.

    4000 CIFAR-10 training images (2000 for InstDisc), 4-12 epochs, batch 128, ResNet-18 width 0.125, at the
    machine's precision (``auto``: fp32 on a CPU without native bf16, where bf16 doubled these tests' time)
    unless the entry's ``test: {precision: ...}`` pins the one its figures hold at (a short run's end point
    moves with rounding: BYOL's by 0.04 between 1 and 2 threads): 15 s to 3 minutes on 2 cores. The kNN monitor reads a fixed 2000-image subset of the test split. The loss test
    compares the mean of the first and the last ``loss_window`` logged losses (3 unless the entry says otherwise),
    counted from epoch ``loss_from_epoch`` (0 unless the entry says otherwise: InfoMin's first-epoch loss is
    scored against a queue that lags behind contracting embeddings; see benchmarks/short_budget.yaml).
    """
    _learns(name, SHORT_BUDGET[name], tmp_path, shared_cifar_tar)


# MoCo v3 on a Vision Transformer (sec. 4 of the paper): vit_tiny at half width (dim 96, 3 heads of 32), 4 blocks,
# 4-px patches (8x8 tokens), the random patch projection frozen, AdamW with weight decay 0.1 and tau 0.2 as the
# ViT recipe (configs/moco_v3_vit_tiny_cifar.yaml), lr 1e-3 for the short run. Measured (fp32, 1 thread beside
# another job, about 160 s each): seeds 0/1/2 kNN 0.2825 -> 0.3250, 0.2665 -> 0.3020, 0.2680 -> 0.3105 (loss
# 3.71 -> 3.41, 3.73 -> 3.29, 3.70 -> 3.33); seed 0 with the patch projection trained: 0.2825 -> 0.3300.
VIT_BUDGET = {"method": {"proj_hidden": 512, "pred_hidden": 512, "temperature": 0.2},
              "encoder": {"name": "vit_tiny", "width": 0.5, "depth": 4, "patch_size": 4, "freeze_patch_embed": True},
              "optim": {"name": "adamw", "lr": 1.0e-3, "weight_decay": 0.1, "warmup_epochs": 1.0},
              "test": {"precision": "fp32"}}


@pytest.mark.slow
@pytest.mark.shared_data
def test_learning_on_a_vit(tmp_path, shared_cifar_tar):
    """test_learning's budget and checks for MoCo v3 with a small ViT encoder instead of the ResNet."""
    _learns("moco_v3", VIT_BUDGET, tmp_path, shared_cifar_tar)


def _learns(name: str, budget: dict, tmp_path: Path, tar: Path) -> None:
    """Train ``name`` with a short_budget.yaml-style entry on 4000 CIFAR-10 images; assert it learned."""
    # the entry's test-only budget
    test = {"epochs": 4, "limit": 4000, "loss_from_epoch": 0, "loss_window": 3, "precision": "auto",
            **budget.get("test", {})}
    raw = {
        "method": {"name": name, **budget.get("method", {})},
        "encoder": {**TINY["encoder"], **budget.get("encoder", {})},
        "optim": budget.get("optim", {}),
        "augment": budget.get("augment", {}),
        "data": {"source": str(tar), "limit": test["limit"]},
        "train": {"epochs": test["epochs"], "batch_size": 128, "log_every": 5, "knn_every": test["epochs"],
                  "precision": test["precision"], "knn_max_train": 4000, "knn_max_test": 2000},
    }
    fit(resolve(raw), tmp_path / "run", progress=False)
    lines = [json.loads(line) for line in (tmp_path / "run/metrics.jsonl").read_text().splitlines()]
    losses = [line["loss"] for line in lines if "loss" in line and line["epoch"] >= test["loss_from_epoch"]]
    knn = [line["knn_top1"] for line in lines if "knn_top1" in line]
    w = test["loss_window"]
    assert sum(losses[-w:]) / w < sum(losses[:w]) / w, losses
    print(name, "kNN untrained -> trained:", knn)
    assert knn[-1] > 2 * 0.1 and knn[-1] > knn[0] + 0.01, knn  # twice chance, and above the untrained encoder


def test_byol_views_go_through_batchnorm_separately():
    """BYOL's code (and solo-learn's) forward each view on its own, online and target network alike, so every
    BatchNorm normalises the B samples of one view with that view's statistics, never one 2B batch of both."""
    cfg = resolve({"method": {"name": "byol"}, **TINY})
    method = create_method(cfg, num_samples=8).train()
    images = torch.randint(0, 256, (8, 3, 32, 32), dtype=torch.uint8)
    views = make_views(images, view_specs(cfg, method), torch.Generator().manual_seed(0))
    seen: dict[str, list[int]] = {}
    hooks = [m.register_forward_pre_hook(lambda _m, args, name=name: seen.setdefault(name, []).append(args[0].shape[0]))
             for name, m in method.named_modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    method.training_step(views, torch.arange(8), Progress(step=0, epoch=0, total_steps=2, steps_per_epoch=1))
    for h in hooks:
        h.remove()
    assert len(seen) == len(hooks) and any(n.startswith("target.") for n in seen)  # online, predictor and target BNs
    assert all(sizes == [8, 8] for sizes in seen.values()), {n: s for n, s in seen.items() if s != [8, 8]}


def test_byol_states_the_cited_warmup():
    """solo-learn's BYOL CIFAR recipe warms up for 10 epochs (its scheduler's default, warmup_cosine)."""
    assert resolve({"method": {"name": "byol"}}).optim.warmup_epochs == 10
