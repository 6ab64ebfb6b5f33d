"""``train.precision=auto`` and ``train.channels_last=auto``: bf16 and channels_last only where bf16 is native."""

import pytest
import torch
import yaml

from kontrast import precision
from kontrast.cli import main
from kontrast.precision import choose_precision, native_bf16


@pytest.mark.parametrize("flags, native", [
    ({"fpu", "avx512f"}, False), ({"avx512f", "avx512_bf16"}, True), ({"amx_tile", "amx_bf16"}, True), (set(), False),
])
def test_cpu_bf16_is_native_only_with_amx_or_avx512_bf16(monkeypatch, flags, native):
    monkeypatch.setattr(precision, "cpu_flags", lambda: flags)
    assert native_bf16("cpu")[0] is native
    chosen, layout, line = choose_precision("auto", "auto", "cpu")
    assert (chosen, layout) == (("bf16", True) if native else ("fp32", False))
    assert line.startswith(f"numerics: precision {chosen} (auto), channels_last {'on' if native else 'off'} (auto)")


def test_set_values_win_over_auto(monkeypatch):
    monkeypatch.setattr(precision, "cpu_flags", lambda: set())
    assert choose_precision("bf16", True, "cpu")[:2] == ("bf16", True)
    assert choose_precision("fp32", "auto", "cpu")[:2] == ("fp32", False)
    assert "precision bf16 (set)" in choose_precision("bf16", False, "cpu")[2]


def test_autocast_resolves_auto(monkeypatch):
    monkeypatch.setattr(precision, "cpu_flags", lambda: {"avx512_bf16"})
    with precision.autocast("cpu", "auto"):
        assert torch.is_autocast_enabled("cpu")
    monkeypatch.setattr(precision, "cpu_flags", lambda: set())
    with precision.autocast("cpu", "auto"):
        assert not torch.is_autocast_enabled("cpu")


def test_a_run_says_what_it_chose_and_keeps_it_in_its_config(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(precision, "cpu_flags", lambda: set())
    assert main(["train", "--data", "shapes:32", "--epochs", "1", "--batch-size", "16", "--out", str(tmp_path / "run"),
                 "--set", "encoder.width=0.125", "--set", "data.size=16", "--no-progress"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("data: ")
    assert lines[1].startswith("numerics: precision fp32 (auto), channels_last off (auto); CPU ")
    train = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())["train"]
    assert (train["precision"], train["channels_last"]) == ("fp32", False)  # a resume elsewhere keeps them


def test_channels_last_accepts_only_booleans_and_auto(tmp_path, capsys):
    assert main(["train", "--out", str(tmp_path / "run"), "--set", "train.channels_last=maybe"]) == 2
    assert "train.channels_last" in capsys.readouterr().err
