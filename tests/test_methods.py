"""Every registered method: a smoke step on CPU, and a short learning run on shapes."""

import json

import pytest
import torch
from safetensors.torch import save

from kontrast.methods import METHODS
from kontrast.methods.build import create_method, resolve, view_specs
from kontrast.augment import make_views
from kontrast.train.loop import fit

TINY = {"encoder": {"name": "resnet18", "width": 0.125}}


@pytest.mark.parametrize("name", METHODS.names())
def test_smoke_step(name):
    cfg = resolve({"method": {"name": name}, **TINY})
    method = create_method(cfg)
    assert method.description and method.recipe
    images = torch.randint(0, 256, (8, 3, 32, 32), dtype=torch.uint8)
    views = make_views(images, view_specs(cfg, method), torch.Generator().manual_seed(0))
    before = [p.detach().clone() for p in method.parameters()]
    out = method.training_step(views)
    assert out["loss"].ndim == 0 and torch.isfinite(out["loss"])
    out["loss"].backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in method.encoder.parameters())
    with torch.no_grad():
        for p in method.parameters():
            if p.grad is not None:
                p.sub_(0.1 * p.grad)
    method.after_step(0.5)
    assert any(not torch.equal(a, b) for a, b in zip(before, method.parameters()))
    save(dict(method.state_dict()))  # checkpointable: no shared tensors


# Short-budget settings per method (same method, smaller state so a few hundred steps can show learning).
LEARNING = {
    "simclr": {},
    "moco_v2": {"method": {"queue_size": 512, "momentum": 0.9}, "epochs": 6},
    # without warm-up LARS at lr 1.0 leaves kNN at the untrained level in this budget (0.2217 -> 0.2251)
    "byol": {"optim": {"warmup_epochs": 1.0}},
}


@pytest.mark.slow
@pytest.mark.shared_data
@pytest.mark.parametrize("name", METHODS.names())
def test_learning(name, tmp_path, shared_cifar_tar):
    """Loss falls and kNN top-1 on CIFAR-10's test split beats chance and the untrained encoder.

    4000 CIFAR-10 training images, 4-6 epochs, batch 128, ResNet-18 width 0.125, bf16: about a
    minute on 2 cores. (The built-in shapes data needs far longer budgets to show learning.)
    """
    raw = {
        "method": {"name": name, **LEARNING[name].get("method", {})}, **TINY,
        "optim": LEARNING[name].get("optim", {}),
        "data": {"source": str(shared_cifar_tar), "limit": 4000},
        "train": {"epochs": LEARNING[name].get("epochs", 4), "batch_size": 128, "log_every": 5,
                  "knn_every": 4, "precision": "bf16", "knn_max_train": 4000},
    }
    fit(resolve(raw), tmp_path / "run", progress=False)
    lines = [json.loads(line) for line in (tmp_path / "run/metrics.jsonl").read_text().splitlines()]
    losses = [line["loss"] for line in lines if "loss" in line]
    knn = [line["knn_top1"] for line in lines if "knn_top1" in line]
    assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3, losses
    print(name, "kNN untrained -> trained:", knn)
    assert knn[-1] > 2 * 0.1 and knn[-1] > knn[0] + 0.01, knn  # twice chance, and above the untrained encoder
