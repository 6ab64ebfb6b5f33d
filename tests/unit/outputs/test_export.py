"""``kontrast.outputs.export``: a run's encoder as backbone.safetensors + backbone.json, loadable in kontrast,
in plain torchvision at width 1, and refused with one line when the input is wrong."""

import json

import pytest
import torch
import torchvision
from safetensors.torch import load_file
from torch import nn

from kontrast.cli import main
from kontrast.encoders import create_encoder
from kontrast.errors import UserError
from kontrast.evaluate.run import load_run
from kontrast.outputs import export
from kontrast.outputs.export import backbone_info, export_backbone, load_backbone, write_backbone

TINY = ["--data", "shapes:64", "--epochs", "1", "--batch-size", "8", "--set", "data.size=16",
        "--set", "data.limit=16", "--no-progress"]  # 2 steps


def train(out, width: float) -> None:
    assert main(["train", "--method", "simclr", "--out", str(out), "--set", f"encoder.width={width}", *TINY]) == 0


@pytest.fixture
def tiny_run(tiny_simclr_run):
    """The shared finished SimCLR run (width 0.125, 16 px, 2 epochs of 2 steps); the export tests only read it."""
    return tiny_simclr_run


def torchvision_twin(info: dict) -> nn.Module:
    """Plain torchvision built as backbone.json says (the replacement strings are evaluated as code)."""
    recipe = info["torchvision"]
    model = getattr(torchvision.models, recipe["constructor"].rsplit(".", 1)[1])(weights=None)
    for attr, module in recipe["replace"].items():
        setattr(model, attr, eval(module, {"nn": nn}))
    return model


def test_export_round_trip_gives_the_same_features(tiny_run, tmp_path):
    info = export_backbone(tiny_run, tmp_path / "backbone")
    assert {p.name for p in (tmp_path / "backbone").iterdir()} == {"backbone.safetensors", "backbone.json"}
    assert json.loads((tmp_path / "backbone" / "backbone.json").read_text()) == info
    assert info["format"] == "kontrast" and info["loads_in_torchvision"] is False and info["torchvision"] is None
    assert (info["encoder"], info["stem"], info["width"], info["feature_dim"]) == ("resnet18", "cifar", 0.125, 64)
    assert info["input_size"] == 16 and len(info["mean"]) == len(info["std"]) == 3
    assert info["method"] == "simclr" and info["step"] == 4 and info["epoch"] == 2
    assert info["run"] == str(tiny_run.resolve()) and info["checkpoint"].endswith("step-00000004")
    _, method, _ = load_run(tiny_run)
    encoder = load_backbone(tmp_path / "backbone")
    assert not encoder.training and encoder.mean == info["mean"] and encoder.input_size == 16
    x = torch.randn(4, 3, 16, 16)
    with torch.no_grad():
        assert torch.equal(encoder(x), method.encoder.eval()(x))


def test_width_one_cifar_run_loads_in_plain_torchvision(tmp_path):
    train(tmp_path / "run", 1.0)
    info = export_backbone(tmp_path / "run" / "checkpoints" / "step-00000002", tmp_path / "out")
    assert info["format"] == "torchvision" and info["loads_in_torchvision"] and info["timm_name"] == "resnet18"
    model = torchvision_twin(info)
    assert set(info["torchvision"]["replace"]) == {"conv1", "maxpool", "fc"}
    model.load_state_dict(load_file(tmp_path / "out" / "backbone.safetensors"), strict=True)
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        assert torch.allclose(model.eval()(x), load_backbone(tmp_path / "out")(x), atol=1e-6)


@pytest.mark.parametrize("arch", ["resnet18", "resnet50"])
def test_imagenet_stem_loads_with_only_fc_replaced(arch, tmp_path):
    encoder = create_encoder(arch, stem="imagenet").eval()
    info = write_backbone(encoder, backbone_info(encoder, arch, stem="imagenet", width=1.0), tmp_path / "out")
    assert info["torchvision"]["replace"] == {"fc": "nn.Identity()"}
    model = torchvision_twin(info).eval()
    model.load_state_dict(load_file(tmp_path / "out" / "backbone.safetensors"), strict=True)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert torch.allclose(model(x), encoder(x), atol=1e-6)


def test_torchvision_encoder_exports_torchvision_names(tmp_path):
    encoder = create_encoder("torchvision:resnet18").eval()
    info = write_backbone(encoder, backbone_info(encoder, "torchvision:resnet18", stem=None, width=1.0), tmp_path)
    assert info["architecture"] == "resnet18" and info["format"] == "torchvision"
    model = torchvision.models.get_model("resnet18", weights=None)
    model.fc = nn.Identity()
    model.load_state_dict(load_file(tmp_path / "backbone.safetensors"), strict=True)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(load_backbone(tmp_path)(x), encoder(x))


def test_encoder_without_torchvision_twin_is_kontrast_format(tmp_path):
    encoder = create_encoder("amdim", width=0.125).eval()
    info = write_backbone(encoder, backbone_info(encoder, "amdim", stem=None, width=0.125), tmp_path / "out")
    assert info["format"] == "kontrast" and info["torchvision"] is None and info["timm_name"] is None
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(load_backbone(tmp_path / "out" / "backbone.safetensors")(x), encoder(x))


def one_line(exc: pytest.ExceptionInfo) -> str:
    message = str(exc.value)
    assert "\n" not in message
    return message


def test_errors_are_one_line(tiny_run, tmp_path):
    with pytest.raises(UserError) as exc:
        export_backbone(tmp_path / "missing", tmp_path / "a")
    assert "not found" in one_line(exc)
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    with pytest.raises(UserError) as exc:
        export_backbone(tiny_run, tmp_path / "busy")
    assert "--overwrite" in one_line(exc)
    with pytest.raises(UserError) as exc:  # --overwrite replaces an earlier export, never another folder
        export_backbone(tiny_run, tmp_path / "busy", overwrite=True)
    assert "no earlier export" in one_line(exc) and (tmp_path / "busy" / "notes.txt").is_file()
    with pytest.raises(UserError) as exc:
        load_backbone(tmp_path / "busy")
    assert "lacks backbone.json" in one_line(exc)
    with pytest.raises(UserError) as exc:
        load_backbone(tmp_path / "nowhere")
    assert "not found" in one_line(exc)


def test_overwrite_replaces_an_export_and_failures_leave_nothing(tiny_run, tmp_path, monkeypatch):
    out = tmp_path / "out"
    export_backbone(tiny_run, out)
    with pytest.raises(UserError):
        export_backbone(tiny_run, out)
    export_backbone(tiny_run, out, overwrite=True)
    assert {p.name for p in tmp_path.iterdir()} == {"out"}

    def crash(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(export, "save_file", crash)
    with pytest.raises(OSError):
        export_backbone(tiny_run, tmp_path / "new")
    with pytest.raises(OSError):
        export_backbone(tiny_run, out, overwrite=True)
    assert {p.name for p in tmp_path.iterdir()} == {"out"}  # no half-written folder, the old export kept
    assert load_backbone(out).info["step"] == 4


def test_simclr_v2_exports_the_backbone_without_its_kept_head_layer(tmp_path):
    run = tmp_path / "run"
    assert main(["train", "--method", "simclr_v2", "--out", str(run), "--set", "encoder.width=0.125", *TINY]) == 0
    info = export_backbone(run, tmp_path / "backbone")
    assert "keep_head_layers" in info["evaluated_as"] and info["feature_dim"] == 64
    _, method, _ = load_run(run)
    x = torch.randn(4, 3, 16, 16)
    with torch.no_grad():
        assert torch.equal(load_backbone(tmp_path / "backbone")(x), method.encoder.eval().backbone(x))
