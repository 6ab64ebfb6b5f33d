"""A distillation teacher: a frozen network read from where the user keeps it, held outside the student.

``method.teacher`` names it; nothing is ever downloaded and no pickled code runs:

``RUN``                 a kontrast run folder (its newest checkpoint) or one of its checkpoint folders: the encoder
                        ``kontrast export`` would write (the backbone, without heads and wrappers), built from the
                        run's plan (``RUN/config.yaml``) and read from ``model.safetensors`` (sha256 checked)
``EXPORT``              a ``kontrast export`` folder, its ``backbone.safetensors`` or ``backbone.json``: rebuilt from
                        ``backbone.json`` as :func:`kontrast.outputs.export.load_backbone` does
``torchvision:<model>`` torchvision's model, headless, with weights from ``method.teacher_weights``
``timm:<name>``         timm's ``resnet18/34/50`` or ``vit_tiny/vit_small_patch16_224``, built as kontrast's twin
                        (the same tensors under torchvision's names), with weights from ``method.teacher_weights``
``python:<module>:<attr>`` an ``nn.Module``, or a callable returning one, importable in every process (``--nproc``
                        starts new ones); the Python API can also hand the module itself to the method

``teacher_weights`` is read by :mod:`kontrast.encoders.weights` (safetensors, or a ``torch.save``d state_dict read
with ``weights_only=True``; loaded strictly). Every bad reference is a one-line :class:`UserError`.

A :class:`Teacher` is not an ``nn.Module``: the method holding it does not register it, so the teacher is in no
optimizer, no checkpoint, no export, no DDP bucket and no ``.train()`` call; the config keeps the reference, and a
resumed run reads the same teacher again.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import torch
from torch import nn

from kontrast.checkpoint import RUN_CONFIG, STATE_FILE, latest_checkpoint, model_tensors, read_run_config
from kontrast.encoders import TORCHVISION_PREFIX, create_encoder
from kontrast.encoders.weights import BACKBONE_FILE, load_weights_into
from kontrast.errors import UserError

EXPORT_INFO = "backbone.json"  # kontrast.outputs.export.INFO_FILE
TIMM_PREFIX, PYTHON_PREFIX = "timm:", "python:"
SCHEMES = (TORCHVISION_PREFIX, TIMM_PREFIX, PYTHON_PREFIX)
# timm's models kontrast builds with the same tensors: (kontrast encoder, its arguments)
TIMM_TWINS = {"resnet18": ("resnet18", {"stem": "imagenet"}), "resnet34": ("resnet34", {"stem": "imagenet"}),
              "resnet50": ("resnet50", {"stem": "imagenet"}),
              "vit_tiny_patch16_224": ("vit_tiny", {"image_size": 224, "patch_size": 16}),
              "vit_small_patch16_224": ("vit_small", {"image_size": 224, "patch_size": 16})}
FORMS = ("a kontrast run folder, a `kontrast export` folder, torchvision:<model> or timm:<name> with "
         "method.teacher_weights=FILE, or python:<module>:<attr>")
# where the backbone sits in a method's state_dict: plain, or inside the wrapper evaluation uses (kontrast.extract)
ENCODER_PREFIXES = ("encoder.", "encoder.encoder.", "encoder.backbone.")


class Teacher:
    """A frozen network ``x [B, 3, H, W] -> features [B, dim]``: eval mode, no parameter requires a gradient, and
    every call runs under ``torch.no_grad``. ``source``: what it was read from, for the run's start-up line."""

    def __init__(self, network: nn.Module, source: str, side: int = 32):
        if not isinstance(network, nn.Module):
            raise UserError(f"teacher {source} is a {type(network).__name__}, not a torch.nn.Module; give a module "
                            "whose forward maps images [B, 3, H, W] to features [B, D]")
        self.network = network.eval().requires_grad_(False)
        self.source = source
        self.dim = int(getattr(network, "dim", 0)) or self._dim_of(side)

    @torch.no_grad()
    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        out = self.network(x)  # [B, D]
        if not torch.is_tensor(out) or out.ndim != 2:
            shape = tuple(out.shape) if torch.is_tensor(out) else type(out).__name__
            raise UserError(f"teacher {self.source} returned {shape} for images {tuple(x.shape)}; a teacher maps "
                            "images to features [B, D]")
        return out

    def _dim_of(self, side: int) -> int:
        """The feature width of a network without ``.dim``: one forward of two blank images."""
        like = next(self.network.parameters(), torch.zeros(()))
        return self(torch.zeros(2, 3, side, side, device=like.device, dtype=like.dtype)).shape[1]

    def parameter_count(self) -> int:
        return sum(p.numel() for p in self.network.parameters())


def is_path(reference: str) -> bool:
    """Whether ``reference`` names a place on disk (not ``torchvision:``, ``timm:`` or ``python:``)."""
    return bool(reference) and not reference.startswith(SCHEMES)


def load_teacher(reference: str, weights: str = "", side: int = 32) -> Teacher:
    """The teacher ``reference`` names (module doc), weights from ``weights`` where it is a model name; ``side``:
    the images' side for a network whose feature width must be found by a forward."""
    if not reference:
        raise UserError(f"distill needs a teacher: set method.teacher to {FORMS}")
    if reference.startswith((TORCHVISION_PREFIX, TIMM_PREFIX)):
        return Teacher(_named(reference, weights), reference, side)
    if weights:
        raise UserError(f"method.teacher_weights applies to torchvision:/timm: teachers; {reference} brings its own "
                        "weights: remove method.teacher_weights")
    if reference.startswith(PYTHON_PREFIX):
        return Teacher(_from_python(reference[len(PYTHON_PREFIX):]), reference, side)
    path = Path(reference).expanduser()
    if not path.exists():
        raise UserError(f"teacher not found: {path}; method.teacher must be {FORMS}")
    if path.is_dir() and ((path / RUN_CONFIG).is_file() or (path / STATE_FILE).is_file()):
        return Teacher(_from_run(path), f"run {path}", side)
    folder = path.parent if path.is_file() and path.name in (BACKBONE_FILE, EXPORT_INFO) else path
    if folder.is_dir() and (folder / EXPORT_INFO).is_file():
        return Teacher(_from_export(folder), f"export {folder}", side)
    if path.is_file():
        raise UserError(f"teacher {path} is a file that does not say which network it holds; give "
                        f"method.teacher=torchvision:<model> (or timm:<name>) with method.teacher_weights={path}")
    raise UserError(f"teacher {path} is neither a kontrast run ({RUN_CONFIG}) nor an export ({EXPORT_INFO}); "
                    f"method.teacher must be {FORMS}")


def _named(reference: str, weights: str) -> nn.Module:
    """``torchvision:<model>`` or ``timm:<name>`` with the weights of ``weights`` (required)."""
    if reference.startswith(TIMM_PREFIX):
        name = reference[len(TIMM_PREFIX):]
        if name not in TIMM_TWINS:
            raise UserError(f"teacher {reference}: kontrast builds timm's {', '.join(TIMM_TWINS)} without timm; give "
                            "one of them, or torchvision:<model>")
        encoder, kwargs = TIMM_TWINS[name]
        network = create_encoder(encoder, **kwargs)
    else:
        network = create_encoder(reference)  # an unknown model is a UserError naming the closest
    if not weights:
        raise UserError(f"teacher {reference} needs its weights: set method.teacher_weights to a local .safetensors "
                        "file (nothing is downloaded)")
    load_weights_into(network, weights)
    return network


def _from_python(target: str) -> nn.Module:
    """``module:attr``: the module object there, or what calling it (without arguments) returns."""
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise UserError(f"teacher python:{target} must read python:<module>:<attr>, e.g. python:my_models:teacher")
    try:
        found = getattr(importlib.import_module(module_name), attr)
    except ImportError as exc:
        raise UserError(f"teacher python:{target}: cannot import {module_name} ({exc}); put it on PYTHONPATH for "
                        "every process") from None
    except AttributeError:
        raise UserError(f"teacher python:{target}: {module_name} has no {attr!r}") from None
    return found if isinstance(found, nn.Module) else found() if callable(found) else found


def _from_run(path: Path) -> nn.Module:
    """The backbone of a run (its newest checkpoint) or of one checkpoint folder."""
    ckpt = path if (path / STATE_FILE).is_file() else latest_checkpoint(path)
    if ckpt is None:
        raise UserError(f"teacher run {path} has no complete checkpoint; train it first, or give another run")
    run = ckpt.parent.parent
    _, plan = read_run_config(run)
    args = plan.get("encoder")
    if not args or not plan.get("views"):
        why = "records no encoder (written before run plans)" if not args else "trained on sequences, not images"
        raise UserError(f"teacher run {run} {why}; give a run of an image method, or its `kontrast export` folder")
    network = create_encoder(**args)
    tensors, expected = model_tensors(ckpt), set(network.state_dict())
    for prefix in ENCODER_PREFIXES:
        state = {k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)}
        if set(state) == expected:
            network.load_state_dict(state, strict=True)
            return network
    raise UserError(f"teacher run {run}: checkpoint {ckpt.name} holds no encoder of {args['name']} as the run's plan "
                    "describes it; export the run (kontrast export) and give the export folder")


def _from_export(folder: Path) -> nn.Module:
    """The encoder of a ``kontrast export`` folder, as ``backbone.json`` describes it."""
    try:
        info = json.loads((folder / EXPORT_INFO).read_text())
        args = {"stem": info.get("stem"), "width": info.get("width", 1.0), **info.get("encoder_options", {})}
        name = info["encoder"]
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise UserError(f"teacher export {folder / EXPORT_INFO} is damaged or not a kontrast export "
                        f"({type(exc).__name__}); export the run again") from None
    network = create_encoder(name, **args)
    load_weights_into(network, folder / BACKBONE_FILE)  # a missing file is a UserError naming it
    return network


__all__ = ["Teacher", "is_path", "load_teacher"]
