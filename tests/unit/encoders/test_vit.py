"""``vit_tiny`` / ``vit_small`` (kontrast.encoders.vit): shapes, patch size, sizes against the published
ones and torchvision's layout, MoCo v3's frozen patch projection through the optimizer, every image method
on a ViT, training through ``fit``, export, and the one-line errors."""

import json
from pathlib import Path

import pytest
import torch
import torchvision
from torch import nn

from kontrast.config import load_yaml
from kontrast.encoders import check_encoder_name, create_encoder
from kontrast.encoders.vit import VisionTransformer, default_patch_size, sincos_2d
from kontrast.errors import UserError
from kontrast.methods.base import Progress
from kontrast.methods.build import create_method, resolve
from kontrast.outputs.export import backbone_info, export_backbone, load_backbone, write_backbone
from kontrast.train.loop import fit
from kontrast.train.optim import create_optimizer
from support import ROOT
from support.steps import IMAGE_METHODS, method_and_views

TINY_VIT = {"name": "vit_tiny", "width": 0.125, "depth": 1}  # dim 24, 3 heads of 8: cheap on CPU
NEEDS_MAPS = {"amdim"}  # three scales of feature maps: refused on a ViT


def n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("name,dim", [("vit_tiny", 192), ("vit_small", 384)])
def test_shapes_at_32_and_224_px(name, dim):
    enc = create_encoder(name, image_size=32)
    assert enc.dim == dim and enc.patch_size == 4
    with torch.no_grad():
        assert enc(torch.randn(2, 3, 32, 32)).shape == (2, dim)
        assert enc.forward_maps(torch.randn(2, 3, 32, 32))[0].shape == (2, dim, 8, 8)
        big = create_encoder(name, image_size=224)
        assert big.patch_size == 16 and big(torch.randn(1, 3, 224, 224)).shape == (1, dim)


def test_patch_size_follows_the_image_size_unless_set():
    assert [default_patch_size(s) for s in (16, 32, 64, 96, 128, 224)] == [4, 4, 4, 8, 8, 16]
    assert create_encoder("vit_tiny", image_size=32, patch_size=8, depth=1).patch_size == 8
    cfg = resolve({"encoder": {**TINY_VIT, "patch_size": 8}, "data": {"size": 32}})
    assert create_method(cfg).encoder.patch_size == 8
    assert create_method(resolve({"encoder": TINY_VIT, "data": {"size": 224}})).encoder.patch_size == 16
    with pytest.raises(UserError, match="encoder.patch_size"):
        create_encoder("vit_tiny", image_size=30, depth=1)
    enc = create_encoder("vit_tiny", image_size=32, depth=1, width=0.125)
    with pytest.raises(UserError, match="encoder.patch_size"):
        enc(torch.randn(1, 3, 18, 18))


def test_other_grids_get_sin_cos_positions():
    """Multi-crop views and patch grids of another size: the same fixed table, computed for their grid."""
    enc = create_encoder("vit_tiny", image_size=32, **{k: v for k, v in TINY_VIT.items() if k != "name"})
    torch.testing.assert_close(enc.encoder.pos_embedding[0, 1:], sincos_2d(enc.dim, 8, 8))
    assert not enc.encoder.pos_embedding[0, 0].any()  # the class token's position
    assert enc.positions(4, 4, enc.class_token).shape == (1, 17, enc.dim)
    with torch.no_grad():
        assert enc(torch.randn(2, 3, 16, 16)).shape == (2, enc.dim)
    assert "encoder.pos_embedding" not in dict(enc.named_parameters())  # fixed, never trained


def test_parameter_counts_match_the_published_sizes():
    """DeiT: ViT-Ti 5.7M, ViT-S 22M with the 1000-class head and a learned position table; without them
    (kontrast's encoder: no head, a fixed table) 5.49M and 21.59M."""
    for name, published, exact in (("vit_tiny", 5.7e6, 5_486_592), ("vit_small", 22.0e6, 21_590_016)):
        enc = create_encoder(name, image_size=224)
        assert n_params(enc) == exact
        dim, positions = enc.dim, 197 * enc.dim
        assert abs(n_params(enc) + positions + dim * 1000 + 1000 - published) / published < 0.01


def test_state_dict_is_torchvisions_vision_transformer_minus_heads():
    ours = create_encoder("vit_tiny", image_size=224)
    ref = torchvision.models.VisionTransformer(224, 16, 12, 3, 192, 768)
    ref_shapes = {k: v.shape for k, v in ref.state_dict().items() if not k.startswith("heads.")}
    assert {k: v.shape for k, v in ours.state_dict().items()} == ref_shapes


def test_exported_file_loads_into_torchvision_and_gives_the_same_features(tmp_path):
    enc = create_encoder("vit_small", image_size=32, width=0.25, depth=2).eval()  # dim 96, 6 heads of 16
    info = write_backbone(enc, backbone_info(enc, "vit_small", stem=None, width=0.25), tmp_path / "bb")
    recipe = info["torchvision"]
    assert info["loads_in_torchvision"] and info["encoder_options"] == {"image_size": 32, "patch_size": 4, "depth": 2,
                                                                        "pool": "token"}
    model = torchvision.models.VisionTransformer(**recipe["args"])
    model.heads = nn.Identity()
    from safetensors.torch import load_file

    model.load_state_dict(load_file(tmp_path / "bb/backbone.safetensors"), strict=True)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(model.eval()(x), enc(x), atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(load_backbone(tmp_path / "bb")(x), enc(x))


def test_width_scales_the_head_dimension():
    assert [create_encoder("vit_tiny", width=w, depth=1, image_size=32).dim for w in (1, 0.5, 0.125, 0.01)] \
        == [192, 96, 24, 24]
    assert create_encoder("vit_small", width=0.25, depth=1, image_size=32).dim == 96
    with pytest.raises(UserError, match="width"):
        create_encoder("vit_tiny", width=0, image_size=32)
    with pytest.raises(UserError, match="encoder.stem"):
        create_encoder("vit_tiny", stem="imagenet", image_size=32)


def test_frozen_patch_projection_stays_fixed_while_the_rest_trains():
    """MoCo v3 sec. 4.2: the random patch projection is frozen; the optimizer never holds it."""
    cfg = resolve({"method": {"name": "moco_v3"}, "encoder": {**TINY_VIT, "freeze_patch_embed": True},
                   "optim": {"name": "adamw", "lr": 1e-3, "weight_decay": 0.1}})
    method = create_method(cfg)
    proj = method.encoder.conv_proj
    assert not proj.weight.requires_grad and not proj.bias.requires_grad
    optimizer = create_optimizer(method, cfg.optim, 8)
    held = {id(p) for g in optimizer.param_groups for p in g["params"]}
    assert id(proj.weight) not in held and id(proj.bias) not in held
    frozen, block = proj.weight.detach().clone(), method.encoder.encoder.layers[0].mlp[0].weight.detach().clone()
    views = [torch.rand(8, 3, 32, 32), torch.rand(8, 3, 32, 32)]
    out = method.training_step(views, torch.arange(8), Progress(0, 0, 2, 2))
    out["loss"].backward()
    optimizer.step()
    method.after_step(out, Progress(1, 0, 2, 2))
    assert torch.equal(proj.weight, frozen) and proj.weight.grad is None
    assert not torch.equal(method.encoder.encoder.layers[0].mlp[0].weight, block)
    assert torch.equal(method.target.net[0].conv_proj.weight, frozen)  # the momentum encoder's copy too


@pytest.mark.parametrize("name", IMAGE_METHODS)
def test_every_image_method_steps_on_a_vit(name):
    cfg = resolve({"method": {"name": name}, "encoder": TINY_VIT})
    if name in NEEDS_MAPS:
        with pytest.raises(UserError, match="encoder.name"):
            create_method(cfg, num_samples=8)
        return
    method, views = method_and_views(cfg)
    out = method.training_step(views, torch.arange(8), Progress(step=0, epoch=0, total_steps=2, steps_per_epoch=1))
    assert out["loss"].ndim == 0 and torch.isfinite(out["loss"])
    out["loss"].backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in method.encoder.parameters())
    method.after_step(out, Progress(step=1, epoch=0, total_steps=2, steps_per_epoch=1))


@pytest.mark.parametrize("name", ["moco_v3", "simclr"])
def test_fit_trains_a_vit_and_exports_it(name, tmp_path):
    """Two steps through the training loop on 16-px images (patch 4: 4x4 tokens), then `kontrast export`."""
    raw = {"method": {"name": name}, "encoder": {**TINY_VIT, "freeze_patch_embed": name == "moco_v3"},
           "data": {"source": "shapes:64", "size": 16, "limit": 16},
           "optim": {"name": "adamw", "lr": 1.5e-4, "weight_decay": 0.1},
           "train": {"epochs": 1, "batch_size": 8, "precision": "fp32", "device": "cpu"}}
    summary = fit(resolve(raw), tmp_path / "run", progress=False)
    assert summary["steps"] == 2 and all(torch.isfinite(torch.tensor(x["loss"])) for x in _metrics(tmp_path / "run"))
    info = export_backbone(tmp_path / "run", tmp_path / "bb")
    assert info["encoder_options"]["patch_size"] == 4 and info["format"] == "torchvision"
    assert load_backbone(tmp_path / "bb")(torch.rand(2, 3, 16, 16)).shape == (2, 24)


def _metrics(run: Path) -> list[dict]:
    return [x for x in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if "loss" in x]


def test_config_keys_are_validated():
    check_encoder_name("vit_tiny")
    check_encoder_name("vit_small")
    with pytest.raises(UserError, match="vit_small"):
        check_encoder_name("vit_smal")
    with pytest.raises(UserError, match="encoder.depth"):
        resolve({"encoder": {"name": "vit_tiny", "depth": 0}})
    with pytest.raises(UserError, match="encoder.patch_size"):
        resolve({"encoder": {"name": "vit_tiny", "patch_size": 0}})
    with pytest.raises(UserError, match="encoder.patch_size"):
        create_method(resolve({"encoder": {"name": "resnet18", "width": 0.125, "patch_size": 4}}))
    with pytest.raises(UserError, match="encoder.freeze_patch_embed"):
        create_method(resolve({"encoder": {"name": "resnet18", "width": 0.125, "freeze_patch_embed": True}}))
    # SimSiam's zero_init_residual default is its ResNet's: left out on a ViT, refused when the user sets it
    cfg = resolve({"method": {"name": "simsiam"}, "encoder": TINY_VIT})
    assert not cfg.encoder.zero_init_residual and isinstance(create_method(cfg).encoder, VisionTransformer)
    assert resolve({"method": {"name": "simsiam"}, "encoder": {"width": 0.125}}).encoder.zero_init_residual
    with pytest.raises(UserError, match="encoder.zero_init_residual=false"):
        create_method(resolve({"method": {"name": "simsiam"}, "encoder": {**TINY_VIT, "zero_init_residual": True}}))


def test_moco_v3_vit_recipe_file_states_the_papers_settings():
    """configs/moco_v3_vit_tiny_cifar.yaml: MoCo v3's ViT recipe (AdamW, 1.5e-4 x batch / 256, wd 0.1, 40 of 300
    epochs warm-up, tau 0.2, frozen patch projection)."""
    cfg = resolve(load_yaml(ROOT / "configs/moco_v3_vit_tiny_cifar.yaml"))
    assert (cfg.encoder.name, cfg.encoder.freeze_patch_embed, cfg.method.params.temperature) == ("vit_tiny", True, 0.2)
    o = cfg.optim
    assert (o.name, o.lr, o.lr_batch, o.weight_decay, o.warmup_epochs, cfg.train.epochs) == \
        ("adamw", 1.5e-4, 256, 0.1, 40.0, 300)


def test_dino_vit_recipe_file_states_the_papers_settings():
    """configs/dino_vit_tiny_cifar.yaml: DINO's ViT recipe (AdamW, 5e-4 x batch / 256 to an lr of 1e-6, wd 0.04 -> 0.4,
    gradients clipped to 3, stochastic depth 0.1, the prototypes' gain learned, 10 warm-up epochs, tau_t 0.04 -> 0.07
    over 30 epochs, teacher momentum 0.9995 at batch 256, no BN in the head, multi-crop): what `--method dino` on a
    ViT takes by itself."""
    cfg = resolve(load_yaml(ROOT / "configs/dino_vit_tiny_cifar.yaml"))
    p, o = cfg.method.params, cfg.optim
    assert (cfg.encoder.name, cfg.encoder.patch_size, cfg.augment.recipe) == ("vit_tiny", 4, "dino_multicrop")
    assert (p.warmup_teacher_temp, p.teacher_temp, p.warmup_teacher_temp_epochs, p.base_momentum, p.use_bn_in_head,
            p.norm_last_layer) == (0.04, 0.07, 30.0, 0.9995, False, False)
    assert (o.name, o.lr, o.lr_batch, o.weight_decay, o.warmup_epochs, o.min_lr) == \
        ("adamw", 5e-4, 256, 0.04, 10.0, 1e-6)
    assert (o.weight_decay_end, o.clip_grad, cfg.encoder.drop_path) == (0.4, 3.0, 0.1)
    defaults = resolve({"method": {"name": "dino"}, "encoder": {"name": "vit_tiny"}})
    assert (cfg.optim, cfg.method.params, cfg.encoder.drop_path) == (defaults.optim, defaults.method.params, 0.1)


def test_stochastic_depth_drops_whole_residual_branches_per_sample_in_training_only():
    """encoder.drop_path: block i drops its branches at drop_path * i / (depth - 1), per sample, scaling the kept ones
    by 1 / (1 - p); the identity in eval mode; a momentum target's copy has it off; seeded draws repeat."""
    from kontrast.encoders.target import MomentumTarget
    from kontrast.encoders.vit import DropPath

    vit = create_encoder("vit_tiny", width=0.125, depth=3, image_size=16, drop_path=0.2)
    rates = [block.drop_path.p for block in vit.encoder.layers]
    assert rates == pytest.approx([0.0, 0.1, 0.2])
    x = torch.randn(6, 3, 16, 16)
    vit.eval()
    plain = vit(x)
    vit.train()
    torch.manual_seed(1)
    a = vit(x)
    torch.manual_seed(1)
    assert torch.equal(a, vit(x)) and not torch.allclose(a, plain)  # seeded: a resumed step draws the same masks
    drop = DropPath(0.5).train()
    torch.manual_seed(0)
    branch = torch.ones(1000, 2, 3)
    out = drop(branch)
    per_sample = out.flatten(1)
    assert torch.all((per_sample == 0).all(1) | (per_sample == 2.0).all(1))  # whole samples, kept ones x 1 / (1 - p)
    assert 0.4 < float((per_sample[:, 0] == 0).float().mean()) < 0.6
    target = MomentumTarget(vit)
    assert all(m.p == 0.0 for m in target.modules() if isinstance(m, DropPath))
    assert all(block.drop_path.p == r for block, r in zip(vit.encoder.layers, rates))  # the online encoder keeps it
    with pytest.raises(UserError, match="encoder 'resnet18' has no drop_path option"):
        from kontrast.decisions import build_encoder, decide
        from kontrast.methods.build import resolve
        build_encoder(decide(resolve({"encoder": {"drop_path": 0.1}, "data": {"size": 32}})).encoder_args)


def test_kept_patches_are_the_full_forward_when_all_are_kept_and_follow_their_order():
    enc = create_encoder("vit_tiny", image_size=16, width=0.125, depth=2, patch_size=4).eval()  # a 4x4 grid
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        full = enc.forward_tokens(x)[0]  # [2, 17, D]
        every = enc.forward_tokens(x, keep=torch.arange(16).expand(2, -1))[0]
        order = torch.stack([torch.randperm(16)[:6] for _ in range(2)])  # [2, 6] a different subset per image
        some = enc.forward_tokens(x, keep=order)[0]  # [2, 7, D]
        back = enc.forward_tokens(x, keep=order.flip(1))[0]
    torch.testing.assert_close(every, full)
    assert some.shape == (2, 7, enc.dim)
    torch.testing.assert_close(back[:, 1:], some[:, 1:].flip(1))  # the same tokens, in the order asked
    torch.testing.assert_close(back[:, 0], some[:, 0])  # the class token does not depend on the order


def test_token_predictor_fills_the_wanted_places_from_the_known_ones():
    from kontrast.encoders.vit import TokenPredictor

    pred = TokenPredictor(in_dim=24, dim=16, depth=1, heads=2, out_dim=12).eval()
    tokens, known, wanted = torch.randn(2, 5, 24), torch.tensor([[0, 1, 2, 3, 4]] * 2), torch.tensor([[7, 9, 11]] * 2)
    with torch.no_grad():
        out = pred(tokens, known, wanted, (4, 4))
        swapped = pred(tokens, known, wanted.flip(1), (4, 4))
        moved = pred(tokens, known, torch.tensor([[6, 9, 11]] * 2), (4, 4))
    assert out.shape == (2, 3, 12)
    torch.testing.assert_close(swapped, out.flip(1))  # a wanted token's output is its place's, in any order
    assert not torch.allclose(moved[:, 0], out[:, 0])  # and depends on where it is
    with pytest.raises(UserError, match="multiple of 4"):
        TokenPredictor(24, 18, 1, 3, 12)


def test_pool_mean_returns_the_patch_tokens_mean_and_other_encoders_refuse_it():
    token = create_encoder("vit_tiny", image_size=16, width=0.125, depth=1).eval()
    mean = create_encoder("vit_tiny", image_size=16, width=0.125, depth=1, pool="mean").eval()
    mean.load_state_dict(token.state_dict())
    x = torch.randn(3, 3, 16, 16)
    with torch.no_grad():
        tokens = token.forward_tokens(x)[0]  # [3, 1 + 16, D] after the final LayerNorm
        torch.testing.assert_close(token(x), tokens[:, 0])  # the default: the class token
        torch.testing.assert_close(mean(x), tokens[:, 1:].mean(dim=1))
    with pytest.raises(UserError, match="encoder.pool must be one of token, mean"):
        create_encoder("vit_tiny", image_size=16, pool="max")
    with pytest.raises(UserError, match="encoder.pool"):
        resolve({"encoder": {"name": "vit_tiny", "pool": "max"}})
    with pytest.raises(UserError, match="encoder 'resnet18' has no pool option; set encoder.pool=token"):
        create_method(resolve({"encoder": {"name": "resnet18", "width": 0.125, "pool": "mean"}}))
    cfg = resolve({"encoder": {**TINY_VIT, "pool": "mean"}, "data": {"size": 16}})
    assert create_method(cfg).encoder.pool == "mean"


def test_export_records_pool_mean_and_every_loader_gives_the_same_features(tmp_path):
    enc = create_encoder("vit_tiny", image_size=16, width=0.5, depth=2, pool="mean").eval()  # dim 96, 3 heads
    info = write_backbone(enc, backbone_info(enc, "vit_tiny", stem=None, width=0.5), tmp_path / "bb")
    assert info["encoder_options"]["pool"] == "mean" and "mean of the patch tokens" in info["note"]
    x = torch.randn(2, 3, 16, 16)
    loaded = load_backbone(tmp_path / "bb")
    assert loaded.pool == "mean"
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), enc(x))
    timm = pytest.importorskip("timm")
    from kontrast.outputs.timm_layout import timm_recipe, to_timm

    recipe = timm_recipe(enc, "vit_tiny", 0.5)
    assert (recipe["kwargs"]["global_pool"], recipe["kwargs"]["fc_norm"]) == ("avg", False)
    model = timm.create_model(recipe["model"], pretrained=False, **recipe["kwargs"]).eval()
    model.load_state_dict(to_timm(enc.state_dict(), enc), strict=True)
    with torch.no_grad():  # float64 on both sides: the same arithmetic up to float64 rounding on any CPU
        eps = torch.finfo(torch.float64).eps
        torch.testing.assert_close(model.double()(x.double()), enc.double()(x.double()), atol=1000 * eps,
                                   rtol=1000 * eps)
