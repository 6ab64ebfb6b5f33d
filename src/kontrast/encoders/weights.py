"""Start an encoder from weights on disk (``encoder.weights=PATH``); nothing is ever downloaded.

Accepted: a ``kontrast export`` folder or its ``backbone.safetensors``; any ``.safetensors`` state_dict;
a ``torch.save``d state_dict (``.pth``/``.pt``/``.bin``/``.ckpt``, read with ``weights_only=True``, so no
pickled code runs), bare or wrapped under ``"state_dict"`` / ``"model"`` as training scripts save it.

kontrast's ResNets use torchvision's module names (``conv1``, ``bn1``, ``layer1..4``, ``downsample``),
so torchvision's ``resnet18/34/50`` state_dicts -- and timm's, which share the names -- load as they
are; a timm ``VisionTransformer``'s names are mapped to kontrast's ViT
(:func:`kontrast.encoders.vit.torchvision_names`); ``torchvision:<model>`` encoders are torchvision's models.
The classifier (``fc``, ``classifier``, ``head(s)``), which a headless encoder lacks, is dropped, a ``module.`` (DDP) or
``encoder.`` prefix carried by every key is stripped, then the load is strict: a missing key or a
shape that differs (another width or stem) is a one-line :class:`UserError`, never a silent
partial load.

    load_weights_into(create_encoder("resnet18", stem="imagenet"), "resnet18.pth")
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from torch import nn

from kontrast.encoders.vit import torchvision_names
from kontrast.errors import UserError

BACKBONE_FILE = "backbone.safetensors"  # the tensors of a `kontrast export` folder
TORCH_SUFFIXES = (".pth", ".pt", ".bin", ".ckpt")
WRAPPER_KEYS = ("state_dict", "model")  # {"state_dict": sd, "epoch": ...} as training scripts save it
CLASSIFIER_PREFIXES = ("fc.", "classifier.", "head.", "heads.")
STRIPPED_PREFIXES = ("module.", "encoder.")  # DDP's wrapper; a method's or a training script's encoder
ADVICE = "set encoder.name / encoder.width / encoder.stem to the checkpoint's"


def read_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """The tensors of ``path`` (a file or an export folder), unwrapped from ``{"state_dict": ...}``."""
    path = Path(path).expanduser()
    if path.is_dir():
        if not (path / BACKBONE_FILE).is_file():
            raise UserError(f"encoder weights: {path} is a folder without {BACKBONE_FILE}; give a `kontrast export` "
                            "folder, a .safetensors file or a .pth state_dict")
        path = path / BACKBONE_FILE
    if not path.is_file():
        raise UserError(f"encoder weights file not found: {path}; encoder.weights must be a local file or a "
                        "`kontrast export` folder (nothing is downloaded)")
    if path.suffix == ".safetensors":
        try:
            return load_file(path)
        except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
            raise UserError(f"encoder weights {path} is damaged or not a safetensors file "
                            f"({_first_line(exc)})") from None
    if path.suffix not in TORCH_SUFFIXES:
        raise UserError(f"encoder weights {path}: unknown file type {path.suffix!r}; give a .safetensors file, a "
                        f"state_dict saved by torch.save ({', '.join(TORCH_SUFFIXES)}) or a `kontrast export` folder")
    try:
        loaded = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001  (pickle, zip and torch errors alike: the file is not a state_dict)
        raise UserError(f"encoder weights {path} cannot be read by torch.load(weights_only=True) ({_first_line(exc)}); "
                        "save a plain state_dict: torch.save(model.state_dict(), path)") from None
    return _unwrap(loaded, path)


def _first_line(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:200] if text else type(exc).__name__


def _unwrap(loaded, path: Path) -> dict[str, torch.Tensor]:
    """A dict of tensors: ``loaded`` itself or what it holds under "state_dict"/"model"."""
    for key in WRAPPER_KEYS:
        if isinstance(loaded, dict) and isinstance(loaded.get(key), dict):
            loaded = loaded[key]
            break
    tensors = {k: v for k, v in loaded.items() if torch.is_tensor(v)} if isinstance(loaded, dict) else {}
    if not tensors:
        raise UserError(f"encoder weights {path} holds no state_dict (a dict of tensors, possibly under "
                        f"{' or '.join(repr(k) for k in WRAPPER_KEYS)})")
    return tensors


def _strip_prefixes(tensors: dict[str, torch.Tensor], expected: dict) -> tuple[dict[str, torch.Tensor], list[str]]:
    """Remove ``module.`` then ``encoder.`` when every key starts with it and the encoder's keys do not."""
    stripped = []
    for prefix in STRIPPED_PREFIXES:
        if all(k.startswith(prefix) for k in tensors) and not all(k.startswith(prefix) for k in expected):
            tensors = {k[len(prefix):]: v for k, v in tensors.items()}
            stripped.append(prefix)
    return tensors, stripped


def match_state_dict(tensors: dict[str, torch.Tensor], encoder: nn.Module, path: str | Path) -> dict:
    """Fit ``tensors`` to ``encoder``'s keys and shapes or raise a one-line UserError.

    Returns ``{"state_dict", "dropped", "stripped"}``: the tensors to load strictly, the classifier keys
    dropped and the prefixes stripped. Missing ``num_batches_tracked`` counters (state_dicts written by
    torch < 0.4.1, e.g. older torchvision weights) keep the encoder's.
    """
    expected = encoder.state_dict()
    tensors, stripped = _strip_prefixes(tensors, expected)
    if "cls_token" in tensors and "class_token" in expected:  # a timm ViT (or a `kontrast export --format timm`)
        tensors = torchvision_names(tensors)
    dropped = sorted(k for k in tensors if k not in expected and k.startswith(CLASSIFIER_PREFIXES))
    tensors = {k: v for k, v in tensors.items() if k not in dropped}
    for key, value in tensors.items():
        if key in expected and value.shape != expected[key].shape:
            raise UserError(f"encoder weights {path}: {key} has shape {tuple(value.shape)} in the file, the encoder "
                            f"expects {tuple(expected[key].shape)}; {ADVICE}")
    missing = [k for k in expected if k not in tensors and not k.endswith("num_batches_tracked")]
    if missing:
        raise UserError(f"encoder weights {path} lack {len(missing)} of the encoder's {len(expected)} tensors, first "
                        f"{missing[0]!r} (the file holds e.g. {next(iter(tensors), None)!r}); {ADVICE}")
    extra = [k for k in tensors if k not in expected]
    if extra:
        raise UserError(f"encoder weights {path} hold {len(extra)} tensors the encoder does not have, first "
                        f"{extra[0]!r}; {ADVICE}")
    for key in expected:
        tensors.setdefault(key, expected[key])  # num_batches_tracked only (checked above)
    return {"state_dict": tensors, "dropped": dropped, "stripped": stripped}


def load_weights_into(encoder: nn.Module, path: str | Path) -> dict:
    """Load the weights at ``path`` into ``encoder`` strictly (see the module doc for what is accepted).

    Returns ``{"path", "tensors", "dropped", "stripped"}``: the file read, how many tensors were loaded,
    the classifier keys dropped and the key prefixes stripped.
    """
    path = Path(path).expanduser()
    fit = match_state_dict(read_state_dict(path), encoder, path)
    encoder.load_state_dict(fit["state_dict"], strict=True)  # copy_ casts e.g. float16 files to the encoder's dtype
    return {"path": str(path.resolve()), "tensors": len(fit["state_dict"]), "dropped": fit["dropped"],
            "stripped": fit["stripped"]}


__all__ = ["BACKBONE_FILE", "load_weights_into", "match_state_dict", "read_state_dict"]
