"""``encoder.weights``: torchvision / timm state_dicts, safetensors files and `kontrast export` folders load
into kontrast encoders strictly, before the method copies the encoder, and bad files are one-line errors."""

import pytest
import torch
import torchvision
from safetensors.torch import save_file
from torch import nn

from kontrast.cli import main
from kontrast.encoders import create_encoder
from kontrast.encoders.weights import load_weights_into
from kontrast.errors import UserError
from kontrast.evaluate.run import load_run
from kontrast.methods.build import create_method, resolve
from kontrast.outputs.export import backbone_info, write_backbone


@pytest.fixture(scope="module")
def torchvision_resnet18():
    torch.manual_seed(0)
    model = torchvision.models.resnet18()  # random init, nothing downloaded
    for m in model.modules():  # BN statistics that are not the defaults, so they are checked too
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.1, 0.1)
            m.running_var.uniform_(0.5, 1.5)
    return model.eval()


def features_equal(encoder: nn.Module, model: nn.Module) -> bool:
    head, model.fc = model.fc, nn.Identity()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        same = torch.allclose(encoder.eval()(x), model(x), atol=1e-6)
    model.fc = head
    return same


def test_torchvision_state_dict_loads_with_its_classifier_dropped(torchvision_resnet18, tmp_path):
    path = tmp_path / "resnet18.pth"
    torch.save(torchvision_resnet18.state_dict(), path)
    encoder = create_encoder("resnet18", stem="imagenet")
    report = load_weights_into(encoder, path)
    assert report["dropped"] == ["fc.bias", "fc.weight"] and report["stripped"] == []
    assert features_equal(encoder, torchvision_resnet18)


def test_wrapped_prefixed_and_safetensors_files_load(torchvision_resnet18, tmp_path):
    state = {f"module.{k}": v for k, v in torchvision_resnet18.state_dict().items()}
    torch.save({"state_dict": state, "epoch": 90}, tmp_path / "ddp.pt")
    encoder = create_encoder("resnet18", stem="imagenet")
    assert load_weights_into(encoder, tmp_path / "ddp.pt")["stripped"] == ["module."]
    assert features_equal(encoder, torchvision_resnet18)
    save_file({k: v.contiguous() for k, v in torchvision_resnet18.state_dict().items()}, tmp_path / "w.safetensors")
    encoder = create_encoder("resnet18", stem="imagenet")
    load_weights_into(encoder, tmp_path / "w.safetensors")
    assert features_equal(encoder, torchvision_resnet18)


def test_export_folder_round_trip(tmp_path):
    source = create_encoder("resnet18", width=0.125)
    write_backbone(source, backbone_info(source, "resnet18", stem="cifar", width=0.125), tmp_path / "export")
    for path in (tmp_path / "export", tmp_path / "export" / "backbone.safetensors"):
        target = create_encoder("resnet18", width=0.125)
        load_weights_into(target, path)
        assert all(torch.equal(a, b) for a, b in zip(source.state_dict().values(), target.state_dict().values()))


def one_line(exc: pytest.ExceptionInfo) -> str:
    message = str(exc.value)
    assert "\n" not in message
    return message


def test_shape_mismatch_names_the_key_both_shapes_and_the_fix(tmp_path):
    torch.save(create_encoder("resnet18", width=0.5).state_dict(), tmp_path / "half.pth")
    with pytest.raises(UserError) as exc:
        load_weights_into(create_encoder("resnet18", width=1.0), tmp_path / "half.pth")
    message = one_line(exc)
    assert "conv1.weight" in message and "(32, 3, 3, 3)" in message and "(64, 3, 3, 3)" in message
    assert "encoder.width" in message


def test_bad_files_are_one_line_errors(tmp_path):
    encoder = create_encoder("resnet18", width=0.125)
    (tmp_path / "junk.pth").write_bytes(b"not a pickle")
    torch.save({"conv1.weight": torch.zeros(8, 3, 3, 3)}, tmp_path / "partial.pth")
    (tmp_path / "w.npz").write_bytes(b"")
    cases = {"missing.pth": "not found", "junk.pth": "weights_only", "partial.pth": "lack",
             "w.npz": "unknown file type", ".": "without backbone.safetensors"}
    for name, fragment in cases.items():
        with pytest.raises(UserError) as exc:
            load_weights_into(encoder, tmp_path / name)
        assert fragment in one_line(exc), name


@pytest.mark.parametrize("name", ["byol", "moco_v2"])
def test_ema_target_starts_from_the_loaded_weights(name, tmp_path):
    source = create_encoder("resnet18", width=0.125)
    torch.save(source.state_dict(), tmp_path / "w.pth")
    cfg = resolve({"method": {"name": name}, "encoder": {"width": 0.125, "weights": str(tmp_path / "w.pth")}})
    method = create_method(cfg)
    target_encoder = method.target.net[0]  # MomentumTarget(Sequential(encoder, projector))
    for key, value in source.state_dict().items():
        assert torch.equal(method.encoder.state_dict()[key], value), key
        assert torch.equal(target_encoder.state_dict()[key], value), key


def test_finished_run_evaluates_after_its_weights_file_is_gone(tmp_path):
    weights = tmp_path / "w.pth"
    torch.save(create_encoder("resnet18", width=0.125).state_dict(), weights)
    run = tmp_path / "run"
    assert main(["train", "--data", "shapes:64", "--epochs", "1", "--batch-size", "8", "--out", str(run),
                 "--set", "data.size=16", "--set", "data.limit=16", "--set", "encoder.width=0.125",
                 "--set", f"encoder.weights={weights}", "--no-progress"]) == 0
    weights.unlink()
    cfg, method, _ = load_run(run)  # the checkpoint's weights: the start file is not needed
    assert cfg.encoder.weights == str(weights) and method.encoder.dim == 64


def test_cli_bad_weights_path_exits_2_with_one_line(tmp_path, capsys):
    out = tmp_path / "run"
    code = main(["train", "--data", "shapes:64", "--epochs", "1", "--batch-size", "8", "--out", str(out),
                 "--set", "encoder.width=0.125", "--set", f"encoder.weights={tmp_path / 'nope.pth'}",
                 "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()  # the data source's one-line note may come first
    errors = [line for line in err if line.startswith("error: ")]
    assert code == 2 and errors == err[-1:] and "nope.pth" in errors[0] and "Traceback" not in "\n".join(err)
    assert not out.exists()  # refused before the run directory was touched
