"""``train.precision=auto``: bf16 only where it is native; ``train.channels_last=auto``: on every CPU (unless the
encoder has a layer oneDNN's NHWC backward corrupts), elsewhere with bf16."""

import json

import pytest
import torch
import yaml
from safetensors.torch import load_file

from kontrast import load_backbone, precision
from kontrast.checkpoint import latest_checkpoint
from kontrast.cli import main
from kontrast.decisions import decide, encoder_layers
from kontrast.errors import UserError
from kontrast.methods.build import resolve
from kontrast.precision import channels_last_hazard, choose_precision, native_bf16


@pytest.mark.parametrize("flags, native", [
    ({"fpu", "avx512f"}, False), ({"avx512f", "avx512_bf16"}, True), ({"amx_tile", "amx_bf16"}, True), (set(), False),
])
def test_cpu_bf16_is_native_only_with_amx_or_avx512_bf16(monkeypatch, flags, native):
    monkeypatch.setattr(precision, "cpu_flags", lambda: flags)
    monkeypatch.setattr(precision, "kernels_capped", lambda: "")  # whatever kernel set this suite runs under
    assert native_bf16("cpu")[0] is native
    chosen, layout, line = choose_precision("auto", "auto", "cpu")
    assert (chosen, layout) == ("bf16" if native else "fp32", True)  # oneDNN's convolutions prefer NHWC either way
    assert line.startswith(f"numerics: precision {chosen} (auto), channels_last on (auto)")


@pytest.mark.parametrize("aten, isa, capped", [
    ("AVX512", "", False), ("AVX512", "AVX512_CORE_BF16", False), ("AVX512", "avx2", True),
    ("AVX512", "AVX512_CORE", True), ("AVX2", "", True), ("DEFAULT", "", True),
])
def test_kernels_capped_below_bf16_take_the_fp32_path(monkeypatch, aten, isa, capped):
    """ATEN_CPU_CAPABILITY / ONEDNN_MAX_CPU_ISA make an AVX512-BF16 machine compute as an older CPU: auto is fp32."""
    monkeypatch.setattr(precision, "cpu_flags", lambda: {"avx512f", "avx512_bf16"})
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: aten)
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", isa)
    assert bool(precision.kernels_capped()) is capped
    assert native_bf16("cpu")[0] is not capped
    assert choose_precision("auto", "auto", "cpu")[0] == ("fp32" if capped else "bf16")


def test_channels_last_is_auto_on_a_device_only_with_native_bf16():
    assert choose_precision("auto", "auto", "cuda")[:2] == ("fp32", False)  # (no CUDA here: no native bf16)
    assert choose_precision("auto", "auto", "mps")[:2] == ("fp32", False)


def test_set_values_win_over_auto(monkeypatch):
    monkeypatch.setattr(precision, "cpu_flags", lambda: set())
    assert choose_precision("bf16", True, "cpu")[:2] == ("bf16", True)
    assert choose_precision("fp32", "auto", "cpu")[:2] == ("fp32", True)
    assert choose_precision("auto", False, "cpu")[:2] == ("fp32", False)
    assert "precision bf16 (set)" in choose_precision("bf16", False, "cpu")[2]


def test_autocast_resolves_auto(monkeypatch):
    monkeypatch.setattr(precision, "cpu_flags", lambda: {"avx512_bf16"})
    monkeypatch.setattr(precision, "kernels_capped", lambda: "")  # whatever kernel set this suite runs under
    with precision.autocast("cpu", "auto"):
        assert torch.is_autocast_enabled("cpu")
    monkeypatch.setattr(precision, "cpu_flags", lambda: set())
    with precision.autocast("cpu", "auto"):
        assert not torch.is_autocast_enabled("cpu")


def test_a_run_says_what_it_chose_and_keeps_it_in_its_config(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(precision, "cpu_flags", lambda: set())
    assert main(["train", "--data", "shapes:32", "--epochs", "1", "--batch-size", "16", "--out", str(tmp_path / "run"),
                 "--set", "encoder.width=0.25", "--set", "data.size=16", "--no-progress"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("data: ")
    assert lines[1].startswith("stem: cifar (auto")  # data.size is set; the stem follows it
    assert lines[2].startswith("numerics: precision fp32 (auto), channels_last on (auto); CPU ")
    train = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())["train"]
    assert (train["precision"], train["channels_last"]) == ("fp32", True)  # a resume elsewhere keeps them


def test_fp64_trains_evaluates_and_exports_in_float64(tmp_path, capsys):
    """``--precision fp64``: the method's weights, buffers (MoCo's queue) and views in float64, channels_last off; the
    checkpoint keeps float64, and ``eval`` and ``export`` read it back."""
    run = tmp_path / "run"
    assert main(["train", "--method", "moco_v2", "--data", "shapes:32", "--epochs", "1", "--batch-size", "8",
                 "--out", str(run), "--precision", "fp64", "--set", "encoder.width=0.125", "--set", "data.size=16",
                 "--set", "method.queue_size=16", "--set", "method.bn_groups=2", "--no-progress"]) == 0
    assert "numerics: precision fp64 (set), channels_last off (auto)" in capsys.readouterr().out
    state = load_file(latest_checkpoint(run) / "model.safetensors")
    floating = {k: v.dtype for k, v in state.items() if v.is_floating_point()}
    assert "queue.items" in floating and set(floating.values()) == {torch.float64}
    assert main(["eval", "--checkpoint", str(run), "--no-linear", "--json"]) == 0
    assert 0 <= json.loads(capsys.readouterr().out.splitlines()[-1])["knn_top1"] <= 1
    assert main(["export", "--checkpoint", str(run), "--out", str(tmp_path / "backbone.safetensors")]) == 0
    backbone = load_backbone(tmp_path / "backbone.safetensors")
    assert backbone(torch.rand(2, 3, 16, 16)).shape[0] == 2  # a float32 backbone, as every export loads


def test_fp64_is_refused_in_one_line_where_the_device_has_no_float64():
    with pytest.raises(UserError, match="MPS device has no float64"):
        choose_precision("fp64", "auto", "mps")
    assert choose_precision("fp64", "auto", "cpu")[:2] == ("fp64", False)


def _encoder(width: float):
    return encoder_layers(decide(resolve({"encoder": {"name": "resnet18", "width": width}})).encoder_args)


def test_channels_last_hazard_names_the_layer_onednn_corrupts():
    # ResNet-18 below width 0.25: layer2's 1x1 stride-2 shortcut has fewer than 16 input channels
    assert "layer2.0.downsample.0 is a 1x1 stride-2 convolution with 8 input channels" in \
        channels_last_hazard(_encoder(0.125))
    assert channels_last_hazard(_encoder(0.25)) is None  # 16 input channels: oneDNN's block, safe
    assert channels_last_hazard(_encoder(1.0)) is None
    assert channels_last_hazard(None) is None
    grouped = torch.nn.Conv2d(64, 64, 1, stride=2, groups=8)  # 8 input channels per group
    assert "with 8 input channels" in channels_last_hazard(torch.nn.Sequential(grouped))
    assert channels_last_hazard(torch.nn.Sequential(torch.nn.Conv2d(8, 8, 1))) is None  # stride 1: no workspace


def test_auto_keeps_nchw_for_an_encoder_with_the_hazard_and_true_is_an_error(monkeypatch):
    monkeypatch.setattr(precision, "cpu_flags", lambda: set())
    chosen, layout, line = choose_precision("auto", "auto", "cpu", _encoder(0.125))
    assert (chosen, layout) == ("fp32", False)
    assert "channels_last off (auto)" in line and "channels_last off: encoder layer layer2.0.downsample.0" in line
    assert choose_precision("auto", "auto", "cpu", _encoder(0.25))[1] is True
    assert choose_precision("auto", "auto", "cuda", _encoder(0.125))[1] is False  # the CPU's kernel only
    with pytest.raises(UserError, match="train.channels_last=true: encoder layer layer2.0.downsample.0"):
        choose_precision("fp32", True, "cpu", _encoder(0.125))


def test_an_odd_batch_trains_at_the_hazard_width_and_true_there_is_a_one_line_error(tmp_path, capsys):
    # before the guard, channels_last on this encoder aborted the process at batch 5 (torch 2.14.1, AVX-512)
    common = ["--data", "shapes:20", "--epochs", "1", "--batch-size", "5", "--set", "encoder.width=0.125",
              "--set", "data.size=16", "--no-progress"]
    assert main(["train", *common, "--out", str(tmp_path / "auto")]) == 0
    assert "channels_last off (auto)" in capsys.readouterr().out
    assert main(["train", *common, "--out", str(tmp_path / "set"), "--set", "train.channels_last=true"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: train.channels_last=true: encoder layer")
    assert not (tmp_path / "set").exists()  # refused before the run folder is touched


def test_channels_last_accepts_only_booleans_and_auto(tmp_path, capsys):
    assert main(["train", "--out", str(tmp_path / "run"), "--set", "train.channels_last=maybe"]) == 2
    assert "train.channels_last" in capsys.readouterr().err
