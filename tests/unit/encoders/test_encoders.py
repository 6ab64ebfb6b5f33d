"""Encoders room: shapes, ``.dim``, parity with torchvision, low precision, errors."""

import pytest
import torch
import torchvision
from torch import nn

from kontrast.encoders import ENCODERS, create_encoder
from kontrast.encoders.resnet import BasicBlock, Bottleneck
from kontrast.errors import UserError

BASE_DIM = {"resnet18": 512, "resnet34": 512, "resnet50": 2048}


def n_params(model: nn.Module, skip_prefix: str = "\0") -> int:
    return sum(p.numel() for n, p in model.named_parameters() if not n.startswith(skip_prefix))


def test_registry_holds_the_three_resnets():
    assert {"resnet18", "resnet34", "resnet50"} <= set(ENCODERS.names())


@pytest.mark.parametrize("name", ["resnet18", "resnet34", "resnet50"])
@pytest.mark.parametrize("stem,size", [("cifar", 16), ("imagenet", 64)])
@pytest.mark.parametrize("width", [0.125, 0.25])
def test_resnet_shapes_and_dim(name, stem, size, width):
    enc = create_encoder(name, stem=stem, width=width)
    assert isinstance(enc.dim, int) and enc.dim == round(BASE_DIM[name] * width)
    x = torch.randn(2, 3, size, size)
    assert enc(x).shape == (2, enc.dim)
    # cifar: three stride-2 stages (/8); imagenet: stem /4 then three stride-2 stages (/32)
    assert enc.forward_features(x).shape == (2, enc.dim, 2, 2)


def test_width_rounds_each_channel_count_and_stays_positive():
    assert create_encoder("resnet18", width=0.3).dim == round(512 * 0.3)
    tiny = create_encoder("resnet18", width=0.001)
    assert tiny.conv1.out_channels == 1 and tiny.dim == 1
    assert tiny(torch.randn(2, 3, 8, 8)).shape == (2, 1)


@pytest.mark.parametrize("name", ["resnet18", "resnet34", "resnet50"])
def test_imagenet_stem_width1_matches_torchvision_minus_fc(name):
    ours = create_encoder(name, stem="imagenet", width=1.0)
    ref = torchvision.models.get_model(name, weights=None)
    assert n_params(ours) == n_params(ref, skip_prefix="fc.")
    ref_shapes = {k: v.shape for k, v in ref.state_dict().items() if not k.startswith("fc.")}
    assert {k: v.shape for k, v in ours.state_dict().items()} == ref_shapes


def test_torchvision_weights_load_and_give_the_same_features():
    ours = create_encoder("resnet18", stem="imagenet").eval()
    ref = torchvision.models.resnet18().eval()
    missing, unexpected = ours.load_state_dict(ref.state_dict(), strict=False)
    assert missing == [] and sorted(unexpected) == ["fc.bias", "fc.weight"]
    ref.fc = nn.Identity()
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), ref(x))


def test_cifar_stem_keeps_32x32_in_first_stage():
    enc = create_encoder("resnet18", stem="cifar", width=0.125)
    x = torch.randn(1, 3, 32, 32)
    x = enc.maxpool(enc.relu(enc.bn1(enc.conv1(x))))
    assert enc.layer1(x).shape[-2:] == (32, 32)
    assert isinstance(enc.maxpool, nn.Identity)


def test_imagenet_stem_quarters_resolution_before_first_stage():
    enc = create_encoder("resnet18", stem="imagenet", width=0.125)
    x = torch.randn(1, 3, 64, 64)
    assert enc.maxpool(enc.relu(enc.bn1(enc.conv1(x)))).shape[-2:] == (16, 16)


def test_init_is_kaiming_and_zero_init_residual_is_optional():
    enc = create_encoder("resnet18", width=0.25)
    blocks = [m for m in enc.modules() if isinstance(m, BasicBlock)]
    assert all(float(m.bn2.weight.detach().min()) == 1.0 for m in blocks)
    conv = enc.layer1[0].conv1  # Kaiming normal, fan_out: std = sqrt(2 / (out · 3 · 3))
    expected_std = (2.0 / (conv.out_channels * 9)) ** 0.5
    assert abs(conv.weight.std().item() / expected_std - 1) < 0.1
    zero = create_encoder("resnet50", width=0.125, zero_init_residual=True)
    blocks = [m for m in zero.modules() if isinstance(m, Bottleneck)]
    assert blocks and all(float(b.bn3.weight.detach().abs().max()) == 0.0 for b in blocks)


def test_torch_init_keeps_pytorchs_default_conv_init():
    """``encoder.torch_init``: convs as ``nn.Conv2d`` draws them (Kaiming-uniform, a = sqrt(5)), as lightly's."""
    conv = create_encoder("resnet18", width=0.25, torch_init=True).layer1[0].conv1
    fan_in = conv.in_channels * 9
    assert abs(conv.weight.std().item() / (1 / (3 * fan_in)) ** 0.5 - 1) < 0.1  # uniform(+-1/sqrt(fan_in))
    assert float(conv.weight.abs().max()) <= fan_in ** -0.5


def test_torch_init_on_an_encoder_without_it_is_one_clear_error():
    from kontrast.decisions import build_encoder, decide
    from kontrast.methods.build import resolve

    cfg = resolve({"encoder": {"name": "vit_tiny", "torch_init": True}, "data": {"size": 32}})
    with pytest.raises(UserError, match=r"has no torch_init option; set encoder.torch_init=false"):
        build_encoder(decide(cfg).encoder_args)


def test_channels_last_and_bf16_autocast_forward_backward():
    # width 0.25: below it the 1x1 shortcut trips oneDNN (kontrast.precision.channels_last_hazard)
    enc = create_encoder("resnet18", width=0.25).to(memory_format=torch.channels_last)
    x = torch.randn(4, 3, 32, 32).contiguous(memory_format=torch.channels_last)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        f = enc(x)
    assert f.shape == (4, enc.dim) and f.dtype == torch.bfloat16
    assert torch.isfinite(f.float()).all()
    f.float().square().mean().backward()
    assert all(torch.isfinite(p.grad).all() for p in enc.parameters())


@pytest.mark.parametrize(
    "model,kw,size,dim",
    [
        ("resnet18", {}, 32, 512),
        ("mobilenet_v3_small", {}, 32, 576),
        ("efficientnet_b0", {}, 32, 1280),
        ("convnext_tiny", {}, 32, 768),
        ("alexnet", {}, 64, 256),  # 6×6 pool + flatten becomes a global pool
        ("squeezenet1_1", {}, 64, 512),
        ("vit_b_16", {"image_size": 32}, 32, 768),
    ],
)
def test_torchvision_models_by_name(model, kw, size, dim):
    enc = create_encoder(f"torchvision:{model}", **kw)
    assert enc.dim == dim  # known before any forward
    with torch.no_grad():
        assert enc(torch.randn(2, 3, size, size)).shape == (2, dim)


def test_torchvision_model_in_train_mode_returns_one_tensor():
    enc = create_encoder("torchvision:googlenet").train()
    out = enc(torch.randn(2, 3, 64, 64))
    assert isinstance(out, torch.Tensor) and out.shape == (2, enc.dim) == (2, 1024)


def test_unknown_names_are_user_errors():
    with pytest.raises(UserError, match="resnet18.*torchvision:"):
        create_encoder("resnet19")
    with pytest.raises(UserError, match="did you mean.*mobilenet_v3_small"):
        create_encoder("torchvision:mobilenet_v3_smal")
    with pytest.raises(UserError, match="e.g."):
        create_encoder("torchvision:no_such_thing_at_all")


def test_bad_options_are_user_errors():
    with pytest.raises(UserError, match="stem"):
        create_encoder("resnet18", stem="tiny")
    with pytest.raises(UserError, match="width"):
        create_encoder("resnet18", width=0)
    with pytest.raises(UserError, match="stem"):
        create_encoder("torchvision:resnet18", stem="cifar")
    with pytest.raises(UserError, match="width"):
        create_encoder("torchvision:resnet18", width=0.5)
