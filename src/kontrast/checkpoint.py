"""Checkpoints: tensors in safetensors, state in JSON, written atomically, verified on load.

Layout: ``RUN/checkpoints/step-00001234/`` holding ``model.safetensors`` (the method's whole
``state_dict``: weights, EMA targets, queues and their pointers, every registered buffer),
``optimizer.safetensors``, ``rng.safetensors`` (generator states) and ``state.json``
(step, epoch, the loop's counters, the optimizer's non-tensor state, the sha256 of every
tensor file, and a checksum of itself). ``state.json`` is written last.

A checkpoint is written into a temporary folder, each file fsynced, then the folder is
renamed into place and the parent fsynced, so a crash never leaves half of one under a
``step-*`` name; older ones are pruned only after the new one is complete. On load every
file is checked against its recorded sha256 before it is parsed, so a truncated or
bit-flipped checkpoint is an error naming the file, never weights that are silently wrong.
Nothing is ever unpickled: safetensors and JSON cannot carry code.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
from safetensors import SafetensorError
from safetensors.torch import load as load_bytes
from safetensors.torch import save as save_bytes

from kontrast.config import load_yaml
from kontrast.errors import UserError

STATE_FILE = "state.json"
RUN_CONFIG = "config.yaml"  # a run's resolved config, with its plan (kontrast.train.plan) in a section of its own
PLAN_KEY = "plan"
MODEL_FILE, OPTIMIZER_FILE, RNG_FILE = "model.safetensors", "optimizer.safetensors", "rng.safetensors"
FORMAT = 2  # 2: sha256 of every file and a self-checksum in state.json (1 had neither)
TMP_PREFIX = ".tmp-"


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_file(path: Path, data: bytes) -> str:
    """Write ``data``, fsync it, return its sha256."""
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    return _sha256(data)


def _tensor_bytes(tensors: dict[str, torch.Tensor]) -> bytes:
    return save_bytes({k: v.detach().contiguous().cpu() for k, v in tensors.items()})


def _state_checksum(state: dict) -> str:
    body = {k: v for k, v in state.items() if k != "checksum"}
    return _sha256(json.dumps(body, sort_keys=True).encode())


def _flatten_optimizer(sd: dict) -> tuple[dict[str, torch.Tensor], dict]:
    """An optimizer's state dict -> (tensors named ``state.<param>.<key>``, JSON-able rest)."""
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


def _placed(sd: dict, optimizer: torch.optim.Optimizer, place: Place | None) -> dict:
    """An optimizer state dict of full tensors with each parameter-shaped one placed as its parameter is."""
    if place is None:
        return sd
    params = [p for group in optimizer.param_groups for p in group["params"]]  # the state dict's numbering
    state = {}
    for pid, entry in sd["state"].items():
        p = params[pid] if pid < len(params) else None  # (a mismatch is the optimizer's own error, below)
        like = {k: p for k, v in entry.items() if p is not None and torch.is_tensor(v) and v.shape == p.shape}
        state[pid] = {**entry, **place({k: entry[k] for k in like}, like)}
    return {**sd, "state": state}


def checkpoint_dirs(run_dir: Path) -> list[Path]:
    """Complete checkpoints (those with ``state.json``), oldest first."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.name.startswith("step-") and (p / STATE_FILE).is_file())


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest complete checkpoint (half-written ones never carry a ``step-*`` name)."""
    dirs = checkpoint_dirs(run_dir)
    return dirs[-1] if dirs else None


def remove_partial(run_dir: Path) -> list[Path]:
    """Delete temporary folders a crash left behind mid-write; returns what was removed."""
    root = Path(run_dir) / "checkpoints"
    stale = sorted(root.glob(TMP_PREFIX + "*")) if root.is_dir() else []
    for path in stale:
        shutil.rmtree(path, ignore_errors=True)
    return stale


def save_checkpoint(
    run_dir: Path,
    method: nn.Module,
    optimizer: torch.optim.Optimizer,
    state: dict,
    keep: int = 2,
    rng: dict[str, torch.Tensor] | None = None,
    halfway: Callable[[], None] | None = None,
    model_state: dict | None = None,
    optimizer_state: dict | None = None,
) -> Path:
    """Write ``method``'s state_dict, the optimizer, ``rng`` and ``state`` (must hold ``step``) atomically.

    ``halfway()`` is called with half the checkpoint written (the training loop's ``checkpoint_writing`` event:
    the crash tests kill the process there). ``model_state``, ``optimizer_state``: the state dicts to write in
    place of ``method.state_dict()`` and ``optimizer.state_dict()`` (a sharded run's, gathered whole)."""
    root = Path(run_dir) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{state['step']:08d}"
    tmp = root / f"{TMP_PREFIX}{final.name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    model_state = method.state_dict() if model_state is None else model_state
    files = {MODEL_FILE: _write_file(tmp / MODEL_FILE, _tensor_bytes(model_state))}
    if halfway is not None:
        halfway()  # e.g. a crash with half a checkpoint written
    opt_tensors, opt_meta = _flatten_optimizer(optimizer.state_dict() if optimizer_state is None else optimizer_state)
    files[OPTIMIZER_FILE] = _write_file(tmp / OPTIMIZER_FILE, _tensor_bytes(opt_tensors))
    files[RNG_FILE] = _write_file(tmp / RNG_FILE, _tensor_bytes(rng or {}))
    full = {**state, "format": FORMAT, "optimizer": opt_meta, "files": files}
    full["checksum"] = _state_checksum(full)
    _write_file(tmp / STATE_FILE, json.dumps(full, indent=1).encode())
    _fsync_dir(tmp)
    if final.exists():  # the same step written again (e.g. a run re-started from it): replace it
        shutil.rmtree(final)
    os.replace(tmp, final)
    _fsync_dir(root)
    for old in checkpoint_dirs(run_dir)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


# ----------------------------------------------------------------------------- loading


def _earlier(path: Path) -> str:
    """Advice naming the checkpoint before ``path`` in its run, if any."""
    others = ([p for p in checkpoint_dirs(path.parent.parent) if p.name < path.name]
              if path.parent.name == "checkpoints" else [])
    if others:
        return f"delete {path} to resume from {others[-1].name}"
    return "no earlier checkpoint exists; start the run again with --overwrite"


def read_state(path: Path) -> dict:
    """``state.json`` of checkpoint folder ``path``, its self-checksum verified."""
    path = Path(path)
    file = path / STATE_FILE
    try:
        state = json.loads(file.read_bytes())
    except (OSError, ValueError) as exc:
        raise UserError(f"checkpoint state {file} is damaged or unreadable ({exc}); {_earlier(path)}") from None
    if not isinstance(state, dict) or "step" not in state:
        raise UserError(f"checkpoint state {file} is not a kontrast checkpoint state; {_earlier(path)}")
    if "checksum" in state and state["checksum"] != _state_checksum(state):
        raise UserError(f"checkpoint state {file} is damaged: its checksum does not match its content; "
                        f"{_earlier(path)}")
    return state


def _read_tensors(path: Path, name: str, state: dict) -> dict[str, torch.Tensor]:
    """A tensor file of the checkpoint, its sha256 checked against ``state`` before parsing."""
    file = Path(path) / name
    try:
        data = file.read_bytes()
    except OSError as exc:
        raise UserError(f"checkpoint file {file} is missing or unreadable ({exc.strerror}); "
                        f"{_earlier(Path(path))}") from None
    expected = state.get("files", {}).get(name)
    if expected is not None and _sha256(data) != expected:
        raise UserError(f"checkpoint file {file} is damaged: {len(data)} bytes whose sha256 differs from the "
                        f"one recorded when it was written (truncated or bit-flipped); {_earlier(Path(path))}")
    try:
        return load_bytes(data)
    except (SafetensorError, ValueError, RuntimeError) as exc:
        raise UserError(f"checkpoint {file} is damaged or not a safetensors file ({exc}); "
                        f"{_earlier(Path(path))}") from None


def model_tensors(path: Path) -> dict[str, torch.Tensor]:
    """The method's tensors in checkpoint folder ``path`` (``model.safetensors``), verified as :func:`load_weights`
    verifies them, without a method to load them into (a distillation teacher reads its encoder from them)."""
    return _read_tensors(Path(path), MODEL_FILE, read_state(Path(path)))


def _check_fits(file: Path, tensors: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    missing = sorted(set(expected) - set(tensors))
    extra = sorted(set(tensors) - set(expected))
    if missing or extra:
        raise UserError(
            f"checkpoint {file} does not fit this method: missing {missing[:3]}, unexpected {extra[:3]}; "
            "check --method and the method's settings"
        )
    for key, value in tensors.items():
        want = expected[key]
        if value.shape != want.shape or value.dtype != want.dtype:
            raise UserError(
                f"checkpoint {file}: {key} is {value.dtype} {tuple(value.shape)}, the model expects "
                f"{want.dtype} {tuple(want.shape)}; check the encoder width and head sizes"
            )


Place = Callable[[dict, dict], dict]  # (full tensors, the state they go into) -> the tensors as that state holds them


def load_weights(path: Path, method: nn.Module, method_name: str | None = None, place: Place | None = None) -> dict:
    """Load ``model.safetensors`` into ``method`` after verifying it; returns the checkpoint's state.

    ``method_name``: the method the caller built; a checkpoint written by another one is refused. ``place``: how
    the saved (full) tensors become the method's (a sharded run cuts them into its shards:
    ``kontrast.train.sharding.place_like``).
    """
    path = Path(path)
    state = read_state(path)
    saved = state.get("method")
    if method_name is not None and saved is not None and saved != method_name:
        raise UserError(f"checkpoint {path} was written by method {saved!r}, not {method_name!r}; "
                        f"use --method {saved} or another run directory")
    tensors = _read_tensors(path, MODEL_FILE, state)
    retired = getattr(method, "retired_state", ())  # keys older versions saved that this one no longer keeps
    tensors = {k: v for k, v in tensors.items() if k not in retired}
    if hasattr(method, "size_from"):  # parts the training data sized (the supervised reference's classifier)
        method.size_from(tensors)
    _check_fits(path / MODEL_FILE, tensors, method.state_dict())
    method.load_state_dict(tensors if place is None else place(tensors, method.state_dict()))
    return state


def load_checkpoint(
    path: Path, method: nn.Module, optimizer: torch.optim.Optimizer | None = None, method_name: str | None = None,
    place: Place | None = None,
) -> dict:
    """Restore the method (and optimizer) from a checkpoint folder; returns its state, with
    the generator states under ``"rng"`` (a dict of uint8 tensors, possibly empty). ``place``: as
    :func:`load_weights`, for the weights and the optimizer's parameter-shaped state."""
    path = Path(path)
    state = load_weights(path, method, method_name, place)
    if optimizer is not None:
        tensors = _read_tensors(path, OPTIMIZER_FILE, state)
        try:
            optimizer.load_state_dict(_placed(_unflatten_optimizer(tensors, state["optimizer"]), optimizer, place))
        except (ValueError, KeyError, TypeError) as exc:
            raise UserError(f"optimizer state in {path} does not fit this run ({exc}); "
                            "check optim.name and the method's settings") from None
        for group in optimizer.param_groups:  # torch does not check buffer shapes against the parameters
            for p in group["params"]:
                for key, value in optimizer.state.get(p, {}).items():
                    if torch.is_tensor(value) and value.ndim and value.shape != p.shape:
                        raise UserError(f"optimizer state in {path}: {key} has shape {tuple(value.shape)} for a "
                                        f"parameter of shape {tuple(p.shape)}; check the method's settings")
    state["rng"] = _read_tensors(path, RNG_FILE, state) if (path / RNG_FILE).exists() else {}
    return state


def read_run_config(run_dir: Path) -> tuple[dict, dict]:
    """``(config sections, plan)`` of ``run_dir/config.yaml``; plan ``{}`` for a run written before plans were kept."""
    raw = load_yaml(Path(run_dir) / RUN_CONFIG)
    plan = raw.pop(PLAN_KEY, None) or {}
    return raw, plan
