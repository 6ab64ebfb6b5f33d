"""Damaged, mismatched and malicious checkpoints: one-line error naming the file and what differs,
exit 2, the run directory untouched, never a silent restart; nothing user-supplied is unpickled."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import re
import shutil
from pathlib import Path

import pytest
import torch

from kontrast.checkpoint import _state_checksum
from kontrast.cli import main
from support import ROOT
from support.args import train_command

SRC = ROOT / "src" / "kontrast"


def train_args(out: Path, *extra: str) -> list[str]:
    return train_command(out, *extra, method="simclr")


def cli(args: list[str], capsys) -> tuple[int, str]:
    threads = torch.get_num_threads()
    try:
        code = main(args)
    finally:
        torch.set_num_threads(threads)
    return code, capsys.readouterr().err


def assert_one_line_error(code: int, err: str, *fragments: str) -> str:
    assert code == 2, err
    lines = [line for line in err.strip().splitlines() if line.startswith("error: ")]
    assert len(lines) == 1 and "Traceback" not in err, err
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def snapshot(run: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run)): p.read_bytes() for p in run.rglob("*") if p.is_file()}


@pytest.fixture
def run(tiny_simclr_run, tmp_path) -> Path:
    """A copy of the shared finished run (``train_args``'s settings, the kNN monitor on; 2 epochs of 2 steps:
    checkpoints step-2 and step-4)."""
    copy = tmp_path / "run"
    shutil.copytree(tiny_simclr_run, copy)
    return copy


def newest(run: Path) -> Path:
    return sorted((run / "checkpoints").iterdir())[-1]


def rewrite_state(ckpt: Path, **changes) -> None:
    """Edit state.json and re-seal it (valid checksum): a well-formed checkpoint that does not fit."""
    state = json.loads((ckpt / "state.json").read_text())
    for key, value in changes.items():
        if key == "files":
            state["files"].update(value)
        else:
            state[key] = value
    state["checksum"] = _state_checksum(state)
    (ckpt / "state.json").write_text(json.dumps(state))


def flip_bit(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x10
    path.write_bytes(bytes(data))


def resume_fails(run: Path, capsys, *fragments: str, extra: tuple[str, ...] = ()) -> str:
    before = snapshot(run)
    code, err = cli([*train_args(run, *extra), "--resume", "--epochs", "3"], capsys)
    line = assert_one_line_error(code, err, *fragments)
    assert snapshot(run) == before, "a failed resume changed the run directory"
    return line


def test_truncated_weights(run, capsys):
    model = newest(run) / "model.safetensors"
    model.write_bytes(model.read_bytes()[: model.stat().st_size // 2])
    line = resume_fails(run, capsys, str(model), "damaged", "truncated or bit-flipped")
    assert "delete" in line and "step-00000002" in line  # what to do: fall back to the previous one


def test_bit_flip_in_weights(run, capsys):
    model = newest(run) / "model.safetensors"
    flip_bit(model, model.stat().st_size - 100)  # inside the tensor data: safetensors alone would not notice
    resume_fails(run, capsys, str(model), "sha256 differs")


def test_bit_flip_in_optimizer_state(run, capsys):
    opt = newest(run) / "optimizer.safetensors"
    flip_bit(opt, opt.stat().st_size - 7)
    resume_fails(run, capsys, str(opt), "damaged")


def test_bit_flip_in_state_json(run, capsys):
    state = newest(run) / "state.json"
    text = state.read_text()
    state.write_text(text.replace('"step": 4', '"step": 6', 1))  # '4' -> '6' is one flipped bit
    resume_fails(run, capsys, str(state), "checksum")


def test_checkpoint_of_another_method(run, capsys):
    rewrite_state(newest(run), method="byol")
    resume_fails(run, capsys, str(newest(run)), "written by method 'byol', not 'simclr'")


def test_checkpoint_of_other_shapes(run, capsys):
    line = resume_fails(run, capsys, "model.safetensors", "the model expects", extra=("--set", "encoder.width=0.25"))
    assert re.search(r"is torch.float32 \(\d+.*\), the model expects torch.float32 \(\d+", line)  # both shapes


def test_damaged_checkpoint_in_eval(run, capsys):
    model = newest(run) / "model.safetensors"
    flip_bit(model, model.stat().st_size - 100)
    code, err = cli(["eval", "--checkpoint", str(run), "--no-linear"], capsys)
    assert_one_line_error(code, err, str(model))


class _Payload:
    """Unpickling this runs ``touch MARKER``."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_pickle_in_place_of_a_checkpoint_is_refused(run, tmp_path, capsys):
    """A crafted pickle as model.safetensors, with state.json re-sealed to its hash so no checksum
    stands in the way: the loader still only parses safetensors, refuses it, and the payload never runs."""
    marker = tmp_path / "pwned"
    evil = pickle.dumps({"encoder.weight": _Payload(marker)})
    ckpt = newest(run)
    (ckpt / "model.safetensors").write_bytes(evil)
    rewrite_state(ckpt, files={"model.safetensors": hashlib.sha256(evil).hexdigest()})
    resume_fails(run, capsys, str(ckpt / "model.safetensors"), "not a safetensors file")
    code, err = cli(["eval", "--checkpoint", str(ckpt), "--no-linear"], capsys)
    assert_one_line_error(code, err, "model.safetensors")
    (tmp_path / "model.pt").write_bytes(evil)  # a torch.save-style file given as the checkpoint
    code, err = cli(["eval", "--checkpoint", str(tmp_path / "model.pt")], capsys)
    assert_one_line_error(code, err, "model.pt")
    assert not marker.exists(), "the pickle's payload ran"


def test_nothing_in_the_library_unpickles():
    """Static guard: the only unpickler is the restricted CIFAR one (data/cifar.py, _ArrayUnpickler); torch.load
    only with ``weights_only=True`` (PyTorch's restricted unpickler: encoder.weights reads torchvision .pth files)."""
    risky = re.compile(r"pickle\.loads?\(|(?<!safetensors\.)torch\.load\(|allow_pickle\s*=\s*True|pickle\.Unpickler"
                       r"|\bdill\b|joblib\.load")
    found = []
    for path in SRC.rglob("*.py"):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if risky.search(line) and not re.search(r"torch\.load\(.*weights_only=True", line):
                found.append(f"{path.relative_to(SRC)}:{n}: {line.strip()}")
    assert [f.split(": ", 1)[1] for f in found] == ["class _ArrayUnpickler(pickle.Unpickler):"], found
