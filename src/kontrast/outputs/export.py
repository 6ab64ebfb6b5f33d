"""A run's encoder as a portable backbone: ``backbone.safetensors`` + ``backbone.json``.

What a pretraining run is for: the encoder, without the projection head, predictor or EMA target that
only the contrastive objective needed (SimCLR, Chen et al. 2020, https://arxiv.org/abs/2002.05709,
§4.2: the representation *before* the head transfers best). kontrast's ResNets carry torchvision's
module names (``conv1``, ``bn1``, ``layer1..4``, ``downsample``), so at width 1 the file is a plain
torchvision ``resnet18/34/50`` state_dict minus ``fc`` -- and a timm one, whose ResNets share the names.
The JSON says how to build the model it loads into (constructor, the CIFAR stem change, ``fc`` ->
``nn.Identity()``), how to normalise inputs, and where the weights came from.

    info = export_backbone("runs/simclr", "exports/simclr")    # run dir or one checkpoint folder
    encoder = load_backbone("exports/simclr")                   # eval mode; .mean, .std, .input_size, .transform
    x = encoder.transform(decode_image(file, mode=ImageReadMode.RGB))  # [3, size, size]: resize, crop, normalise
    features = encoder(x[None])                                 # [1, feature_dim], embed's features

kontrast's ViTs (``vit_tiny``, ``vit_small``) carry torchvision's ``VisionTransformer`` names: the file loads into
``VisionTransformer(image_size, patch_size, ...)`` with ``heads = nn.Identity()``, as the JSON spells out.
Encoders without a torchvision twin (amdim, sequence encoders, ResNets at width != 1) are exported in
kontrast's own names (``"format": "kontrast"``) and load with :func:`load_backbone`.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn

from kontrast.checkpoint import read_state
from kontrast.encoders import TORCHVISION_PREFIX, create_encoder
from kontrast.encoders.patches import PatchGridEncoder
from kontrast.encoders.resnet import ResNet
from kontrast.encoders.vit import VisionTransformer
from kontrast.encoders.weights import BACKBONE_FILE, load_weights_into, read_state_dict
from kontrast.errors import UserError
from kontrast.evaluate.run import load_run, run_views
from kontrast.extract import EncoderWithHead, PooledContext
from kontrast.outputs.timm_layout import TIMM_RESNETS, from_timm, timm_recipe, to_timm

INFO_FILE = "backbone.json"
EXPORT_VERSION = 1
INPUT = "float32 [B, 3, H, W]: pixels / 255, then (x - mean) / std per channel"


def export_backbone(checkpoint: str | Path, out_dir: str | Path, *, overwrite: bool = False,
                    layout: str = "torchvision") -> dict:
    """Write the encoder of ``checkpoint`` (a run directory -> its newest checkpoint, or one checkpoint
    folder) to ``out_dir`` as ``backbone.safetensors`` + ``backbone.json``; returns the JSON's content.

    ``layout="timm"``: the file in timm's key names, for ``timm.create_model(..., pretrained=False)`` as
    ``backbone.json``'s ``timm`` entry says (:mod:`kontrast.outputs.timm_layout`; ResNets at width 1, the ViTs).

    ``out_dir`` must be new or empty; ``overwrite=True`` replaces an earlier export there. The folder is
    written beside it under a temporary name and renamed into place, so it is never half written.
    """
    if layout not in ("torchvision", "timm"):
        raise UserError(f"unknown export format {layout!r}; use torchvision or timm")
    out_dir = Path(out_dir).expanduser().absolute()
    _check_out_dir(out_dir, overwrite)  # before loading anything: a refused --out costs nothing
    cfg, method, ckpt = load_run(checkpoint)
    ckpt = ckpt.resolve()
    run_dir = ckpt.parent.parent
    if out_dir.resolve() in (run_dir, *run_dir.parents):
        raise UserError(f"--out {out_dir} holds the run {run_dir}; export into another folder")
    encoder, wrapper = _backbone_of(method.encoder)
    specs = run_views(ckpt, cfg, method)  # the recipe's normalisation (as evaluate_run); () for sequence methods
    state = read_state(ckpt)
    info = backbone_info(encoder, cfg.encoder.name, stem=cfg.encoder.stem, width=cfg.encoder.width)
    info.update({
        "input_size": cfg.data.size, "input": INPUT if specs else "float32 sequences, as the run's data source",
        "mean": list(specs[0].mean) if specs else None, "std": list(specs[0].std) if specs else None,
        "preprocessing": preprocessing(cfg.data.size, specs[0].mean, specs[0].std) if specs else None,
        "method": cfg.method.name, "run": str(run_dir), "checkpoint": str(ckpt),
        "step": state.get("step"), "epoch": state.get("epoch"), "data": cfg.data.source,
    })
    if wrapper:
        info["evaluated_as"] = wrapper
    if layout == "timm":
        recipe = timm_recipe(encoder, cfg.encoder.name, cfg.encoder.width)
        if recipe is None:
            raise UserError(f"timm has no model that holds {cfg.encoder.name} at width {cfg.encoder.width} (timm "
                            "takes resnet18/34/50 at width 1, vit_tiny and vit_small); export without --format timm")
        info.update({"format": "timm", "loads_in_torchvision": False, "timm": recipe})
        return write_backbone(encoder, info, out_dir, overwrite=overwrite, rename=lambda s: to_timm(s, encoder))
    return write_backbone(encoder, info, out_dir, overwrite=overwrite)


def preprocessing(size: int, mean, std) -> dict:
    """How ``kontrast embed`` and ``eval`` turn an image file into the encoder's input, step by step
    (:func:`kontrast.data.decode.fit_image`, :func:`kontrast.evaluate.features.normalise`); :func:`image_transform`
    builds it in torchvision."""
    return {"decode": "RGB uint8 [3, H, W] (torchvision.io.decode_image(file, mode=ImageReadMode.RGB))",
            "resize": {"shorter_side": size, "interpolation": "bilinear", "antialias": True, "on": "uint8"},
            "center_crop": [size, size], "scale": "float32, pixels / 255",
            "normalize": {"mean": list(mean), "std": list(std)}}


def image_transform(steps: dict):
    """``backbone.json``'s ``preprocessing`` as a torchvision transform of an RGB uint8 ``[3, H, W]`` tensor (or a
    PIL image): the encoder's input for one image, ``[3, size, size]`` float32. From files decoded by
    ``torchvision.io.decode_image(file, mode=ImageReadMode.RGB)`` it gives ``kontrast embed``'s features to float
    rounding (a decoder other than libjpeg-turbo's may differ in the last bit of some pixels)."""
    from torchvision.transforms import InterpolationMode, v2

    return v2.Compose([
        v2.ToImage(),  # PIL or tensor -> uint8 image tensor
        v2.Resize(steps["resize"]["shorter_side"], interpolation=InterpolationMode.BILINEAR, antialias=True),
        v2.CenterCrop(steps["center_crop"]),
        v2.ToDtype(torch.float32, scale=True),  # / 255
        v2.Normalize(steps["normalize"]["mean"], steps["normalize"]["std"]),
    ])


def _backbone_of(encoder: nn.Module) -> tuple[nn.Module, str | None]:
    """The encoder ``create_encoder`` built, unwrapped from what a method put around it for evaluation."""
    if isinstance(encoder, PatchGridEncoder):  # CPC v2: features averaged over a grid of patches
        return encoder.encoder, (f"kontrast averaged this encoder's features over {encoder.patch}-px patches at "
                                 f"stride {encoder.stride} (kontrast.encoders.patches.PatchGridEncoder); the file "
                                 "holds the encoder alone")
    if isinstance(encoder, EncoderWithHead):  # SimCLR v2: the backbone + the kept head layers
        return encoder.backbone, (f"kontrast evaluated this encoder followed by {len(encoder.head)} module(s) of "
                                  "the projection head (SimCLR v2's keep_head_layers, kontrast.extract."
                                  "EncoderWithHead); the file holds the backbone alone")
    if isinstance(encoder, PooledContext):  # CPC: encoder + GRU context
        return encoder.encoder, ("kontrast evaluated the GRU context averaged over time (kontrast.extract."
                                 "PooledContext); the file holds the encoder g_enc alone")
    return encoder, None


def _check_out_dir(out_dir: Path, overwrite: bool) -> None:
    if out_dir.exists() and not out_dir.is_dir():
        raise UserError(f"--out {out_dir} is a file; give a folder")
    if not out_dir.is_dir() or not any(out_dir.iterdir()):
        return
    if not overwrite:
        raise UserError(f"--out {out_dir} exists and is not empty; choose a new folder or pass --overwrite")
    if not (out_dir / INFO_FILE).is_file():  # --overwrite replaces an earlier export, never any folder
        raise UserError(f"--out {out_dir} holds files but no earlier export ({INFO_FILE}); --overwrite only "
                        "replaces an export, choose a new folder")


def backbone_info(encoder: nn.Module, name: str, *, stem: str | None, width: float) -> dict:
    """The architecture part of ``backbone.json`` for ``encoder`` built as ``create_encoder(name, stem, width)``."""
    arch, recipe, timm_name, note = name, None, None, None
    if isinstance(encoder, ResNet):
        stem = "imagenet" if isinstance(encoder.maxpool, nn.MaxPool2d) else "cifar"
        recipe = _resnet_recipe(name, stem) if width == 1 else None
        timm_name = name if width == 1 and name in TIMM_RESNETS else None
        if width != 1:
            note = (f"width {width}: torchvision's key names but other channel counts; plain torchvision and "
                    "timm cannot hold it, use load_backbone")
    elif isinstance(encoder, VisionTransformer):
        stem, recipe = None, _vit_recipe(encoder)
    elif name.startswith(TORCHVISION_PREFIX):
        arch, stem = name[len(TORCHVISION_PREFIX):], "imagenet"
        recipe = _torchvision_recipe(encoder, arch)
    info = {"kontrast_export": EXPORT_VERSION, "format": "torchvision" if recipe else "kontrast",
            "loads_in_torchvision": recipe is not None, "architecture": arch, "encoder": name, "stem": stem,
            "width": float(width), "feature_dim": int(encoder.dim), "torchvision": recipe, "timm_name": timm_name,
            "load": "kontrast.outputs.export.load_backbone(folder)"}
    if isinstance(encoder, VisionTransformer):  # what create_encoder needs besides name and width
        info["encoder_options"] = {"image_size": encoder.image_size, "patch_size": encoder.patch_size,
                                   "depth": encoder.depth, "pool": encoder.pool}
        note = ("the position embedding is kontrast's fixed 2-D sin-cos table, stored as torchvision's (learned) "
                "encoder.pos_embedding; torchvision accepts only image_size inputs, kontrast any multiple of the patch")
        if encoder.pool == "mean":
            note += ("; the feature is the mean of the patch tokens after the final LayerNorm (encoder.pool mean), "
                     "where torchvision's forward returns the class token: average model.encoder(...)[:, 1:] there")
    return {**info, "note": note} if note else info


def _vit_recipe(encoder: VisionTransformer) -> dict:
    """kontrast's ViT has torchvision's ``VisionTransformer`` names: the file loads there strictly, heads removed."""
    args = {"image_size": encoder.image_size, "patch_size": encoder.patch_size, "num_layers": encoder.depth,
            "num_heads": encoder.heads, "hidden_dim": encoder.dim, "mlp_dim": 4 * encoder.dim}
    constructor = "torchvision.models.vision_transformer.VisionTransformer"
    call = ", ".join(f"{k}={v}" for k, v in args.items())
    lines = [f"model = {constructor}({call})", "model.heads = nn.Identity()",
             f"model.load_state_dict(safetensors.torch.load_file('{BACKBONE_FILE}'), strict=True)"]
    return {"constructor": constructor, "args": args, "replace": {"heads": "nn.Identity()"}, "strict": True,
            "example": lines}


def _resnet_recipe(arch: str, stem: str) -> dict:
    """How plain torchvision rebuilds a width-1 kontrast ResNet so the file loads with strict=True."""
    replace = {"fc": "nn.Identity()"}
    if stem == "cifar":  # kontrast.encoders.resnet.make_stem: 3x3 stride 1, no max-pool
        replace = {"conv1": "nn.Conv2d(3, 64, kernel_size=3, stride=1, padding=1, bias=False)",
                   "maxpool": "nn.Identity()", **replace}
    lines = [f"model = torchvision.models.{arch}(weights=None)",
             *(f"model.{attr} = {module}" for attr, module in replace.items()),
             f"model.load_state_dict(safetensors.torch.load_file('{BACKBONE_FILE}'), strict=True)"]
    return {"constructor": f"torchvision.models.{arch}", "replace": replace, "strict": True, "example": lines,
            "timm": f"timm.create_model('{arch}', num_classes=0)" + (", then the conv1 and maxpool replacements"
                                                                      if stem == "cifar" else "")}


def _torchvision_recipe(encoder: nn.Module, arch: str) -> dict:
    """A ``torchvision:<model>`` encoder is torchvision's model with its classifier replaced."""
    for attr in ("fc", "classifier", "heads", "head"):  # torchvision_models.CLASSIFIER_ATTRS
        head = getattr(encoder, attr, None)
        if isinstance(head, nn.Module):
            break
    else:
        return {"constructor": "torchvision.models.get_model", "name": arch, "strict": False}
    how = "nn.Identity()" if isinstance(head, nn.Identity) else \
        "its layers before the first Linear (kontrast.encoders.torchvision_models.strip_classifier)"
    recipe = {"constructor": "torchvision.models.get_model", "name": arch, "replace": {attr: how}, "strict": True}
    if arch.startswith(("vgg", "alexnet")):  # kontrast pools these globally (torchvision_models.pool_globally)
        recipe["replace"]["avgpool"] = "nn.AdaptiveAvgPool2d(1)"
    recipe["example"] = [f"model = torchvision.models.get_model('{arch}', weights=None)",
                         *(f"model.{a} = {m}" for a, m in recipe["replace"].items()),
                         f"model.load_state_dict(safetensors.torch.load_file('{BACKBONE_FILE}'), strict=True)"]
    return recipe


def write_backbone(encoder: nn.Module, info: dict, out_dir: str | Path, *, overwrite: bool = False,
                   rename=lambda state: state) -> dict:
    """Write ``encoder``'s state_dict and ``info`` (see :func:`backbone_info`) into ``out_dir`` atomically.

    Returns ``info`` with ``files`` (sha256 of the tensor file) and ``num_tensors`` added.
    """
    out_dir = Path(out_dir).expanduser().absolute()
    _check_out_dir(out_dir, overwrite)
    # contiguous, CPU, unshared (safetensors refuses tensors sharing storage)
    tensors = rename({k: v.detach().cpu().contiguous().clone() for k, v in encoder.state_dict().items()})
    tmp = out_dir.parent / f".tmp-{out_dir.name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir(parents=True)
    except OSError as exc:
        raise UserError(f"cannot write into {out_dir.parent} ({exc.strerror}); choose another --out") from None
    try:
        save_file(tensors, str(tmp / BACKBONE_FILE), metadata={"format": "pt", "kontrast_encoder": info["encoder"]})
        digest = hashlib.sha256((tmp / BACKBONE_FILE).read_bytes()).hexdigest()
        info = {**info, "num_tensors": len(tensors), "files": {BACKBONE_FILE: digest}}
        (tmp / INFO_FILE).write_text(json.dumps(info, indent=1) + "\n")
        _replace_dir(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return info


def _replace_dir(tmp: Path, out_dir: Path) -> None:
    """Rename ``tmp`` to ``out_dir``; an existing (empty or earlier-export) ``out_dir`` is moved aside first."""
    old = None
    if out_dir.exists():
        old = out_dir.parent / f".old-{out_dir.name}-{os.getpid()}"
        shutil.rmtree(old, ignore_errors=True)
        os.replace(out_dir, old)
    os.replace(tmp, out_dir)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def read_info(path: str | Path) -> tuple[Path, dict]:
    """(export folder, its backbone.json) for a folder or its backbone.safetensors / backbone.json."""
    folder = Path(path).expanduser()
    if folder.is_file() and folder.name in (BACKBONE_FILE, INFO_FILE):
        folder = folder.parent
    if not folder.is_dir():
        raise UserError(f"backbone folder not found: {folder}; give the --out folder of `kontrast export`")
    for name in (INFO_FILE, BACKBONE_FILE):
        if not (folder / name).is_file():
            raise UserError(f"{folder} lacks {name}; give the --out folder of `kontrast export`")
    try:
        info = json.loads((folder / INFO_FILE).read_text())
        encoder = info["encoder"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UserError(f"{folder / INFO_FILE} is damaged or not a kontrast export ({type(exc).__name__}); "
                        "export the run again") from None
    if not isinstance(encoder, str):
        raise UserError(f"{folder / INFO_FILE} names no encoder; export the run again")
    return folder, info


def load_backbone(path: str | Path) -> nn.Module:
    """The exported encoder, rebuilt with ``create_encoder`` and loaded strictly, in eval mode.

    ``path``: an export folder (or its ``backbone.safetensors``). The module carries ``.info`` (the
    JSON), ``.mean`` / ``.std`` (the run's normalisation; None for sequences), ``.input_size`` and ``.transform``
    (:func:`image_transform`: an image's pixels to the encoder's input, as ``embed`` makes it; None for sequences).
    """
    folder, info = read_info(path)
    encoder = create_encoder(info["encoder"], stem=info.get("stem"), width=info.get("width", 1.0),
                             **info.get("encoder_options", {}))
    if info.get("format") == "timm":  # timm's key names: back to kontrast's
        encoder.load_state_dict(from_timm(read_state_dict(folder / BACKBONE_FILE), encoder), strict=True)
    else:
        load_weights_into(encoder, folder / BACKBONE_FILE)
    encoder.info = info
    encoder.mean, encoder.std, encoder.input_size = info.get("mean"), info.get("std"), info.get("input_size")
    steps = info.get("preprocessing")
    encoder.transform = image_transform(steps) if steps else None  # one image file's pixels -> the encoder's input
    return encoder.eval()


__all__ = ["INFO_FILE", "backbone_info", "export_backbone", "image_transform", "load_backbone", "preprocessing",
           "read_info", "write_backbone"]
