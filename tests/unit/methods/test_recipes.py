"""Method defaults by encoder family: DINO and MoCo v3 take their papers' ViT recipes on a ViT and their ResNet
recipes on a ResNet, resolved in one place (``resolve``) and said at start-up (``recipe_lines``); DINO's teacher
momentum follows the authors' advice for the batch size; ``norm_last_layer`` false learns the prototypes' gain."""

import pytest
import torch

from kontrast.decisions import recipe_lines
from kontrast.methods.base import Progress
from kontrast.methods.build import create_method, resolve
from kontrast.methods.self_distillation import teacher_momentum
from kontrast.train.plan import plan_run

VIT = {"name": "vit_tiny", "width": 0.125, "depth": 2}


def test_dino_on_a_vit_takes_the_authors_vit_recipe():
    cfg = resolve({"method": {"name": "dino"}, "encoder": VIT})
    o = cfg.optim
    assert (o.name, o.lr, o.lr_batch, o.warmup_epochs, o.min_lr) == ("adamw", 5e-4, 256, 10.0, 1e-6)
    assert (o.weight_decay, o.weight_decay_end, o.clip_grad) == (0.04, 0.4, 3.0)
    assert cfg.encoder.drop_path == 0.1 and cfg.method.params.norm_last_layer is False
    line = recipe_lines(cfg)[0]
    assert line.startswith("recipe: dino on a ViT defaults to the authors' main_dino.py for ViT-S; this run: ")
    assert "optim.weight_decay_end=0.4" in line and "optim.clip_grad=3" in line and "encoder.drop_path=0.1" in line


def test_dino_on_a_resnet_keeps_its_resnet_recipe_and_what_the_user_sets_wins():
    cfg = resolve({"method": {"name": "dino"}})
    assert (cfg.optim.name, cfg.optim.lr, cfg.optim.clip_grad, cfg.optim.weight_decay_end) == ("lars", 0.3, 0.0, None)
    assert cfg.encoder.drop_path == 0.0 and cfg.method.params.norm_last_layer is True
    assert "(on a ViT it defaults to the authors' main_dino.py" in recipe_lines(cfg)[0]
    mine = resolve({"method": {"name": "dino", "norm_last_layer": True}, "encoder": {**VIT, "drop_path": 0.0},
                    "optim": {"lr": 1e-3, "clip_grad": 0.0}})
    assert (mine.optim.name, mine.optim.lr, mine.optim.clip_grad, mine.encoder.drop_path) == ("adamw", 1e-3, 0.0, 0.0)
    assert mine.method.params.norm_last_layer is True
    assert "optim.lr=0.001" in recipe_lines(mine)[0]  # the line says what the run uses


def test_moco_v3_on_a_vit_takes_the_papers_vit_recipe():
    vit, resnet = resolve({"method": {"name": "moco_v3"}, "encoder": VIT}), resolve({"method": {"name": "moco_v3"}})
    assert (vit.optim.name, vit.optim.lr, vit.optim.weight_decay, vit.optim.warmup_epochs) == \
        ("adamw", 1.5e-4, 0.1, 40.0)
    assert vit.encoder.freeze_patch_embed is True and vit.method.params.temperature == 0.2
    assert (resnet.optim.name, resnet.optim.lr, resnet.encoder.freeze_patch_embed) == ("lars", 0.3, False)
    assert recipe_lines(vit)[0].startswith("recipe: moco_v3 on a ViT defaults to the paper's ViT recipe")


def test_the_plan_prints_the_recipe_and_the_teacher_momentum():
    cfg = resolve({"method": {"name": "dino", "proj_hidden": 16, "bottleneck_dim": 8, "num_prototypes": 8},
                   "encoder": VIT, "data": {"source": "shapes:16", "size": 16}, "train": {"batch_size": 8}})
    lines = plan_run(cfg).lines()
    assert any(line.startswith("recipe: dino on a ViT") for line in lines)
    assert any(line.startswith("teacher momentum: 0.9995 for batch 8") for line in lines)


def test_teacher_momentum_follows_the_authors_advice_for_the_batch():
    """main_dino.py: 0.996 at batch 1024, 0.9995 advised at 256; log-log between, the nearer one outside."""
    assert teacher_momentum(256) == 0.9995 and teacher_momentum(1024) == 0.996
    assert teacher_momentum(64) == 0.9995 and teacher_momentum(4096) == 0.996
    assert 0.996 < teacher_momentum(512) < 0.9995
    assert teacher_momentum(512) == pytest.approx(1 - 0.0005 * 2 ** 1.5, abs=1e-6)
    # batch 256, stated in the config
    assert resolve({"method": {"name": "dino"}}).method.params.base_momentum == 0.9995
    assert resolve({"method": {"name": "dino"}, "train": {"batch_size": 1024}}).method.params.base_momentum == 0.996
    set_by_user = resolve({"method": {"name": "dino", "base_momentum": 0.99}, "train": {"batch_size": 512}})
    assert set_by_user.method.params.base_momentum == 0.99
    assert recipe_lines(set_by_user)[-1] == \
        "teacher momentum: 0.99 as set (the authors' advice gives 0.998586 for batch 512)"


def test_norm_last_layer_false_learns_the_prototype_gain_except_while_frozen():
    torch.manual_seed(0)
    cfg = resolve({"method": {"name": "dino", "proj_hidden": 16, "bottleneck_dim": 8, "num_prototypes": 6,
                              "freeze_last_layer_epochs": 1.0}, "encoder": VIT, "data": {"size": 16}})
    method = create_method(cfg)
    gain = method.head.gain
    assert gain is not None and gain.shape == (6, 1) and torch.equal(gain, torch.ones(6, 1))
    views = [torch.randn(4, 3, 16, 16) for _ in range(2)] + [torch.randn(4, 3, 8, 8) for _ in range(2)]
    for epoch, moved in ((0, False), (1, True)):
        progress = Progress(step=epoch * 10, epoch=epoch, total_steps=100, steps_per_epoch=10)
        method.zero_grad()
        method.training_step(views, None, progress)["loss"].backward()
        assert (gain.grad is not None and float(gain.grad.abs().sum()) > 0) == moved
    z = torch.randn(3, 8)
    with torch.no_grad():
        gain.mul_(2.0)  # the gain scales each prototype's logit
        want = (torch.nn.functional.normalize(z, dim=1)
                @ (2 * torch.nn.functional.normalize(method.head.last.weight, dim=1)).T)
        assert torch.allclose(method.head.prototypes(torch.nn.functional.normalize(z, dim=1)), want, atol=1e-6)
    assert resolve({"method": {"name": "dino"}}).method.params.norm_last_layer is True  # ResNet: the authors' default
