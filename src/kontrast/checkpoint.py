"""Checkpoints: weights in safetensors, state in JSON, written atomically.

Layout: ``RUN/checkpoints/step-00001234/{model,optimizer}.safetensors`` plus
``state.json`` (written last). A checkpoint is written into a temporary
folder, fsynced, then renamed into place, so a crash never leaves half of one;
older ones are pruned only after the new one is complete. Nothing is ever
unpickled.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from kontrast.errors import UserError

STATE_FILE = "state.json"


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_tensors(tensors: dict[str, torch.Tensor], path: Path) -> None:
    save_file({k: v.detach().contiguous().cpu() for k, v in tensors.items()}, str(path))
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def _flatten_optimizer(opt: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], dict]:
    """Optimizer state -> (tensors named ``state.<param>.<key>``, JSON-able rest)."""
    sd = opt.state_dict()
    tensors, scalars = {}, {}
    for pid, entry in sd["state"].items():
        for key, value in entry.items():
            if torch.is_tensor(value):
                tensors[f"state.{pid}.{key}"] = value
            else:
                scalars[f"{pid}.{key}"] = value
    return tensors, {"param_groups": sd["param_groups"], "scalars": scalars}


def _unflatten_optimizer(tensors: dict[str, torch.Tensor], meta: dict) -> dict:
    state: dict[int, dict[str, Any]] = {}
    for name, value in tensors.items():
        _, pid, key = name.split(".", 2)
        state.setdefault(int(pid), {})[key] = value
    for name, value in meta["scalars"].items():
        pid, key = name.split(".", 1)
        state.setdefault(int(pid), {})[key] = value
    return {"state": state, "param_groups": meta["param_groups"]}


def checkpoint_dirs(run_dir: Path) -> list[Path]:
    """Complete checkpoints (those with ``state.json``), oldest first."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.name.startswith("step-") and (p / STATE_FILE).is_file())


def latest_checkpoint(run_dir: Path) -> Path | None:
    dirs = checkpoint_dirs(run_dir)
    return dirs[-1] if dirs else None


def save_checkpoint(
    run_dir: Path, method: nn.Module, optimizer: torch.optim.Optimizer, state: dict, keep: int = 2
) -> Path:
    """Write ``method``'s weights, the optimizer and ``state`` (must hold ``step``) atomically."""
    root = Path(run_dir) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{state['step']:08d}"
    tmp = root / f".tmp-{final.name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    _write_tensors(method.state_dict(), tmp / "model.safetensors")
    opt_tensors, opt_meta = _flatten_optimizer(optimizer)
    _write_tensors(opt_tensors, tmp / "optimizer.safetensors")
    with open(tmp / STATE_FILE, "w") as f:
        json.dump({**state, "optimizer": opt_meta}, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    _fsync_dir(tmp)
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    _fsync_dir(root)
    for old in checkpoint_dirs(run_dir)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def load_weights(path: Path, method: nn.Module) -> None:
    """Load ``model.safetensors`` into ``method``; a clear error on damage or mismatch."""
    file = Path(path) / "model.safetensors"
    try:
        tensors = load_file(str(file))
    except (SafetensorError, OSError, ValueError) as exc:
        raise UserError(f"checkpoint {file} is damaged or unreadable ({exc}); resume from an earlier one") from None
    expected = method.state_dict()
    missing = sorted(set(expected) - set(tensors))
    extra = sorted(set(tensors) - set(expected))
    if missing or extra:
        raise UserError(
            f"checkpoint {file} does not fit this method: missing {missing[:3]}, unexpected {extra[:3]}; "
            "check --method and the encoder settings"
        )
    for key, value in tensors.items():
        if value.shape != expected[key].shape:
            raise UserError(
                f"checkpoint {file}: {key} has shape {tuple(value.shape)}, the model expects "
                f"{tuple(expected[key].shape)}; check the encoder width and head sizes"
            )
    method.load_state_dict(tensors)


def load_checkpoint(path: Path, method: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> dict:
    """Restore weights (and optimizer) from a checkpoint folder; returns its state dict."""
    path = Path(path)
    try:
        state = json.loads((path / STATE_FILE).read_text())
    except (OSError, ValueError) as exc:
        raise UserError(f"checkpoint state {path / STATE_FILE} is damaged or unreadable ({exc})") from None
    load_weights(path, method)
    if optimizer is not None:
        try:
            tensors = load_file(str(path / "optimizer.safetensors"))
            optimizer.load_state_dict(_unflatten_optimizer(tensors, state["optimizer"]))
        except (SafetensorError, OSError, ValueError, KeyError) as exc:
            raise UserError(f"optimizer state in {path} is damaged or does not fit ({exc})") from None
    return state
