"""Peer side of the parity benchmark: SimCLR, MoCo v2, BYOL, SwAV or SimSiam written with lightly 1.6.

Runs in the peer's own virtual environment (benchmarks/setup_peer.sh: torch, torchvision, lightly==1.6.0),
never in kontrast's. Each method is written the way lightly's examples and benchmarks write it: lightly's
transforms (PIL, per image, in a torchvision DataLoader), lightly's ResNetGenerator backbone, heads,
losses, memory banks, momentum utilities, LARS and schedules. Every hyperparameter is a flag, so
benchmarks/parity.py can pass exactly the values kontrast's resolved config holds; the defaults below are
a snapshot of kontrast's recipes and are there only for running this script by hand.

    PEER/bin/python benchmarks/peer/lightly_ssl.py --method byol --data runs/peer/data/cifar10 \
        --train-limit 20000 --epochs 5 --seed 0 --width 0.25 --batch 256

Training data: ``--train-limit N`` takes the images kontrast's ``data.limit=N`` takes: the training split
in sorted path order (kontrast's order), then ``torch.randperm(len, generator=manual_seed(seed))[:N]``.
Evaluation: weighted kNN (k=200, tau=0.1, cosine) on frozen pooled backbone features of the test split,
with the full training split as the bank (``--knn-bank full``, as ``kontrast eval`` and lightly's CIFAR-10
benchmark do) or the training images used (``--knn-bank used``).
Output: progress on stderr, then one JSON line on stdout (method, seed, knn_top1, img_per_s, settings).

Where lightly has no module for a part of kontrast's recipe, the script says so in a comment marked
``DIFFERENCE`` and lists it under ``"differences"`` in its JSON.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import random
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torchvision
import torchvision.transforms as T
from lightly.loss import NegativeCosineSimilarity, NTXentLoss, SwaVLoss
from lightly.models import ResNetGenerator
from lightly.models.modules import (
    BYOLPredictionHead,
    BYOLProjectionHead,
    MoCoProjectionHead,
    SimSiamPredictionHead,
    SwaVProjectionHead,
    SwaVPrototypes,
)
from lightly.models.modules.heads import ProjectionHead
from lightly.models.modules.memory_bank import MemoryBankModule
from lightly.models.resnet import BasicBlock, Bottleneck
from lightly.models.utils import (
    batch_shuffle,
    batch_unshuffle,
    deactivate_requires_grad,
    get_weight_decay_parameters,
    update_momentum,
)
from lightly.transforms import (
    BYOLTransform,
    BYOLView1Transform,
    BYOLView2Transform,
    MoCoV2Transform,
    SimCLRTransform,
    SimSiamTransform,
    SwaVTransform,
)
from lightly.utils.lars import LARS
from lightly.utils.scheduler import cosine_schedule, cosine_warmup_schedule
from torch.utils.data import DataLoader, Subset

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peer_common import (  # noqa: E402
    LARS_NOTE,
    chosen_images,
    effective_blur_std,
    full_view,
    knn_top1,
    kontrast_subset,
    paths_digest,
    sorted_order,
)

METHODS = ("simclr", "moco_v2", "byol", "swav", "simsiam")
def _view(**kw) -> dict:
    return full_view(kw)


_SWAV_GLOBAL = _view(crop_scale=[0.14, 1.0], jitter=[0.8, 0.8, 0.8, 0.2])
_SWAV_SMALL = _view(size=16, crop_scale=[0.05, 0.14], jitter=[0.8, 0.8, 0.8, 0.2])
# Snapshot of kontrast's recipes and method defaults (kontrast.methods.build.resolve) when this was written.
# (kontrast's BYOL and SwAV use the clipped LARS form; here LARS is lightly's unless --lars-clip is given.)
DEFAULTS = {
    "simclr": {"views": [_view(), _view()], "optim": "sgd", "lr": 0.06, "weight_decay": 5e-4, "warmup_epochs": 0.0,
               "temperature": 0.5, "proj_hidden": 0, "proj_dim": 128},
    "moco_v2": {"views": [_view(crop_scale=[0.2, 1.0], blur_p=0.5)] * 2, "optim": "sgd", "lr": 0.06,
                "weight_decay": 5e-4, "warmup_epochs": 0.0, "temperature": 0.2, "queue_size": 4096,
                "ema_momentum": 0.99, "proj_hidden": 2048, "proj_dim": 128, "symmetric": True, "proj_bn": True,
                "bn_splits": 8},
    "byol": {"views": [_view(jitter=[0.4, 0.4, 0.2, 0.1], blur_p=1.0),
                       _view(jitter=[0.4, 0.4, 0.2, 0.1], blur_p=0.1, solarize_p=0.2)],
             "optim": "lars", "lr": 1.0, "weight_decay": 1e-5, "warmup_epochs": 10.0,
             "proj_hidden": 4096, "proj_dim": 256, "pred_hidden": 4096, "ema_momentum": 0.99},
    "swav": {"views": [_SWAV_GLOBAL] * 2 + [_SWAV_SMALL] * 4, "optim": "lars", "lr": 0.6, "weight_decay": 1e-6,
             "warmup_epochs": 10.0, "temperature": 0.1, "num_prototypes": 3000,
             "proj_hidden": 2048, "proj_dim": 128, "sinkhorn_epsilon": 0.05, "sinkhorn_iterations": 3,
             "queue_size": 3840, "queue_start_epochs": 50.0, "freeze_prototypes_epochs": 2.0, "global_views": 2},
    "simsiam": {"views": [_view(crop_scale=[0.2, 1.0])] * 2, "optim": "sgd", "lr": 0.03, "weight_decay": 5e-4,
                "warmup_epochs": 0.0, "proj_hidden": 2048, "proj_dim": 2048, "pred_hidden": 512,
                "stop_gradient": True, "fix_pred_lr": True, "zero_init_residual": True},
}
COMMON = {"lr_batch": 256, "momentum": 0.9, "min_lr": 0.0, "betas": [0.9, 0.999], "lars_eta": 0.02, "lars_clip": False,
          "proj_hidden": 0, "proj_dim": 128, "pred_hidden": 0, "temperature": 0.1, "queue_size": 0,
          "ema_momentum": 0.99, "symmetric": True, "proj_bn": True, "bn_splits": 0, "num_prototypes": 3000,
          "sinkhorn_epsilon": 0.05, "sinkhorn_iterations": 3, "queue_start_epochs": 0.0,
          "freeze_prototypes_epochs": 0.0, "global_views": 2, "stop_gradient": True, "fix_pred_lr": False,
          "zero_init_residual": False}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--method", required=True, choices=METHODS)
    p.add_argument("--data", required=True, help="folder with train/ and test/ (ImageFolder layout)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--max-steps", type=int, default=0,
                   help="stop after this many steps (smoke tests; schedule unchanged)")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--train-limit", type=int, default=0, help="train on this many images (kontrast's data.limit)")
    p.add_argument("--width", type=float, default=0.25)
    p.add_argument("--arch", default="resnet-18")
    p.add_argument("--stem-relu", action="store_true",
                   help="keep ResNetGenerator's ReLU after the stem (lightly's backbone idiom drops it)")
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--device", default="cpu")
    p.add_argument("--bf16", action="store_true", help="bf16 autocast (kontrast's train.precision=bf16)")
    p.add_argument("--channels-last", action="store_true")
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--views", help="JSON list of views, each as the kontrast ViewSpec fields that differ from their "
                   "defaults, e.g. '[{},{}]' (default: kontrast's recipe for the method)")
    flags = {"optim": str, "lr": float, "lr_batch": int, "momentum": float, "weight_decay": float,
             "warmup_epochs": float, "min_lr": float, "lars_eta": float, "temperature": float, "proj_hidden": int,
             "proj_dim": int, "pred_hidden": int, "queue_size": int, "ema_momentum": float, "bn_splits": int,
             "num_prototypes": int, "sinkhorn_epsilon": float, "sinkhorn_iterations": int,
             "queue_start_epochs": float, "freeze_prototypes_epochs": float, "global_views": int}
    for name, kind in flags.items():
        p.add_argument("--" + name.replace("_", "-"), dest=name, type=kind, default=None)
    p.add_argument("--betas", type=lambda s: [float(v) for v in s.split(",")], default=None)
    p.add_argument("--kontrast-lars-clip", action="store_true",
                   help="record that kontrast's run uses the clipped LARS form (parity.py sets it; changes nothing)")
    for name in ("lars_clip", "symmetric", "proj_bn", "stop_gradient", "fix_pred_lr", "zero_init_residual"):
        p.add_argument("--" + name.replace("_", "-"), dest=name, action=argparse.BooleanOptionalAction, default=None)
    p.add_argument("--knn-k", type=int, default=200)
    p.add_argument("--knn-temperature", type=float, default=0.1)
    p.add_argument("--knn-bank", choices=["full", "used"], default="full",
                   help="kNN bank: the full training split (kontrast eval's) or the training images used")
    p.add_argument("--knn-max-train", type=int, default=0, help="smoke tests only: a random subset of the bank")
    p.add_argument("--knn-max-test", type=int, default=0, help="smoke tests only: a random subset of the test split")
    a = p.parse_args(argv)
    for key, value in {**COMMON, **DEFAULTS[a.method]}.items():
        if getattr(a, key, None) is None:
            setattr(a, key, value)
    try:
        a.views = [full_view(v) for v in json.loads(a.views)] if isinstance(a.views, str) else a.views
    except ValueError as err:
        p.error(str(err))
    return a


# ----------------------------------------------------------------------------------------------- augmentation
def _blur_sigmas(view: dict, notes: list) -> tuple[float, float]:
    """sigma range for lightly's GaussianBlur (PIL, no kernel-size limit) from kontrast's (sigma, kernel).

    DIFFERENCE: kontrast blurs with a ``blur_kernel``-tap Gaussian (3 taps at 32 px), whose effective
    standard deviation saturates near 0.8 px however large sigma is; lightly's GaussianBlur has no kernel
    size. The range handed to lightly is the effective std of kontrast's truncated kernel at the two ends.
    """
    lo, hi = view["blur_sigma"]
    k = int(view.get("blur_kernel", 0))
    if k <= 0:
        return lo, hi
    out = (round(effective_blur_std(lo, k), 3), round(effective_blur_std(hi, k), 3))
    notes.append(f"blur: kontrast's {k}-tap kernel with sigma {lo}-{hi} given to lightly's PIL blur as sigma "
                 f"{out[0]}-{out[1]} (the truncated kernel's effective std)")
    return out


def _color_kwargs(view: dict, notes: list) -> dict:
    """lightly transform arguments shared by every view transform, from one kontrast view."""
    b, c, s, h = view["jitter"]
    unsupported = {k: view.get(k) for k in ("translate_p", "randaugment_n") if view.get(k)}
    if unsupported:
        raise SystemExit(f"lightly's transforms have no {', '.join(unsupported)}; cannot run this recipe")
    if [round(r, 4) for r in view["crop_ratio"]] != [0.75, 1.3333]:
        notes.append(f"crop ratio {view['crop_ratio']}: lightly's RandomResizedCrop keeps (3/4, 4/3)")
    kw = {"cj_prob": view["jitter_p"], "cj_strength": 1.0, "cj_bright": b, "cj_contrast": c, "cj_sat": s,
          "cj_hue": h, "random_gray_scale": view["gray_p"], "gaussian_blur": view["blur_p"], "hf_prob": view["flip_p"],
          "normalize": {"mean": list(view["mean"]), "std": list(view["std"])}}
    if view["blur_p"] > 0:
        kw["sigmas"] = _blur_sigmas(view, notes)
    return kw


def _two_view_kwargs(view: dict, notes: list) -> dict:
    if view["crop_scale"][1] != 1.0:
        notes.append(f"crop scale max {view['crop_scale'][1]}: lightly's two-view transforms crop up to 1.0")
    return {"input_size": view["size"], "min_scale": view["crop_scale"][0], **_color_kwargs(view, notes)}


def build_transform(a, notes: list):
    """lightly's transform for the method at kontrast's settings (CIFAR: 32 px, CIFAR-10 mean/std)."""
    views = a.views
    if a.method == "byol":  # BYOL's asymmetric pair: lightly's two view transforms, solarize on both
        v1, v2 = views
        return BYOLTransform(BYOLView1Transform(**_two_view_kwargs(v1, notes), solarization_prob=v1["solarize_p"]),
                             BYOLView2Transform(**_two_view_kwargs(v2, notes), solarization_prob=v2["solarize_p"]))
    if any(v["solarize_p"] for v in views):
        raise SystemExit(f"lightly's {a.method} transform has no solarize; cannot run this recipe")
    if a.method == "swav":  # multi-crop: one colour pipeline, crops grouped by size
        groups: list[dict] = []
        for v in views:
            if (groups and v["size"] == groups[-1]["view"]["size"]
                    and v["crop_scale"] == groups[-1]["view"]["crop_scale"]):
                groups[-1]["count"] += 1
            else:
                groups.append({"view": v, "count": 1})
        color = _color_kwargs(views[0], notes)
        for g in groups[1:]:
            if _color_kwargs(g["view"], []) != color:
                raise SystemExit("lightly's SwaVTransform takes one colour pipeline for every crop; the views differ")
        color.pop("hf_prob")
        return SwaVTransform(crop_sizes=tuple(g["view"]["size"] for g in groups),
                             crop_counts=tuple(g["count"] for g in groups),
                             crop_min_scales=tuple(g["view"]["crop_scale"][0] for g in groups),
                             crop_max_scales=tuple(g["view"]["crop_scale"][1] for g in groups),
                             hf_prob=views[0]["flip_p"], **color)
    if len(views) != 2 or views[0] != views[1]:
        raise SystemExit(f"lightly's {a.method} transform makes two identical views; the recipe has {len(views)} views")
    cls = {"simclr": SimCLRTransform, "moco_v2": MoCoV2Transform, "simsiam": SimSiamTransform}[a.method]
    return cls(**_two_view_kwargs(views[0], notes))


# ----------------------------------------------------------------------------------------------- data
def train_images(a, transform):
    """The training subset kontrast's data.limit takes, in its order; the paths and their digest."""
    ds = torchvision.datasets.ImageFolder(os.path.join(a.data, "train"), transform=transform)
    rows, paths = chosen_images(ds.samples, ds.root, a.train_limit, a.seed)
    return Subset(ds, rows), paths, paths_digest(paths)


# ----------------------------------------------------------------------------------------------- models
def make_backbone(a) -> tuple[nn.Module, int, nn.Module]:
    """lightly's CIFAR ResNet (3x3 stem, no max-pool) without its classifier, as lightly's examples build it.

    DIFFERENCE (lightly's idiom, kept): ``nn.Sequential(*children[:-1])`` leaves out the ReLU that
    ResNetGenerator.forward applies after the stem's BN (kontrast's ResNet has it); ``--stem-relu`` puts it back.
    BatchNorm splits (MoCo's shuffling-BN emulation) use ResNetGenerator's ``num_splits`` (SplitBatchNorm).
    """
    resnet = ResNetGenerator(a.arch, width=a.width, num_splits=a.bn_splits if a.method == "moco_v2" else 0)
    if a.zero_init_residual:  # the SimSiam authors' zero-initialised residual blocks (lightly has no option for it)
        for m in resnet.modules():
            if isinstance(m, (BasicBlock, Bottleneck)):
                nn.init.zeros_((m.bn2 if isinstance(m, BasicBlock) else m.bn3).weight)
    children = list(resnet.children())[:-1]
    if a.stem_relu:
        children.insert(2, nn.ReLU())
    return nn.Sequential(*children, nn.AdaptiveAvgPool2d(1), nn.Flatten()), resnet.linear.in_features, resnet


def mlp_head(d_in: int, hidden: int, d_out: int, *, hidden_bn: bool = True, out_bn: bool = False) -> ProjectionHead:
    """A 2-layer head with lightly's ProjectionHead blocks (as lightly's CIFAR-10 benchmark builds its heads)."""
    if hidden == 0:
        return ProjectionHead([(d_in, d_out, None, None)])
    return ProjectionHead([(d_in, hidden, nn.BatchNorm1d(hidden) if hidden_bn else None, nn.ReLU()),
                           (hidden, d_out, nn.BatchNorm1d(d_out, affine=False) if out_bn else None, None)])


class SimCLR(nn.Module):
    """lightly's SimCLR example: each view through backbone and head on its own, NT-Xent over both."""

    def __init__(self, backbone, dim, a):
        super().__init__()
        self.backbone = backbone
        # kontrast's head: Linear-BN-ReLU-Linear (lightly's SimCLRProjectionHead would add a BN on the output)
        self.projection_head = mlp_head(dim, a.proj_hidden or dim, a.proj_dim)
        self.criterion = NTXentLoss(temperature=a.temperature)

    def trainable(self):
        return [self.backbone, self.projection_head]

    def training_step(self, views, step, epoch):
        z0, z1 = (self.projection_head(self.backbone(x)) for x in views)
        return self.criterion(z0, z1)


class MoCoV2(nn.Module):
    """lightly's MoCo: momentum backbone and head, shuffled key batch, NTXentLoss with a memory bank.

    Symmetric loss as in lightly's CIFAR-10 benchmark, but with one call of the criterion on both
    directions (``cat[q0, q1]`` against ``cat[k1, k0]``): every query meets the bank as it was before this
    step, as in kontrast and the MoCo authors' CIFAR demo. (Two calls, as the benchmark writes it, put the
    first direction's keys in the bank the second direction scores against: each query then meets the key
    of its own view as a negative.)
    Shuffling BN is emulated as in lightly's CIFAR-10 benchmark: SplitBatchNorm in the backbone
    (``--bn-splits`` splits of each view; kontrast's ``bn_groups``), keys shuffled with batch_shuffle.
    DIFFERENCE: the head's BN sees the whole view; kontrast's grouped forward normalises the head in the
    same groups as the backbone.
    """

    def __init__(self, backbone, dim, a):
        super().__init__()
        self.backbone = backbone
        if a.proj_bn:  # kontrast's MoCo v2 head: BN after the hidden layer only
            self.projection_head = mlp_head(dim, a.proj_hidden, a.proj_dim)
        else:
            self.projection_head = MoCoProjectionHead(dim, a.proj_hidden, a.proj_dim) if a.proj_hidden else \
                mlp_head(dim, 0, a.proj_dim)
        self.backbone_momentum = copy.deepcopy(self.backbone)
        self.projection_head_momentum = copy.deepcopy(self.projection_head)
        deactivate_requires_grad(self.backbone_momentum)
        deactivate_requires_grad(self.projection_head_momentum)
        self.criterion = NTXentLoss(temperature=a.temperature, memory_bank_size=(a.queue_size, a.proj_dim))
        self.m, self.symmetric = a.ema_momentum, a.symmetric

    def trainable(self):
        return [self.backbone, self.projection_head]

    @torch.no_grad()
    def key(self, x):
        x, shuffle = batch_shuffle(x)
        k = self.projection_head_momentum(self.backbone_momentum(x))
        return batch_unshuffle(k, shuffle)

    def training_step(self, views, step, epoch):
        update_momentum(self.backbone, self.backbone_momentum, m=self.m)
        update_momentum(self.projection_head, self.projection_head_momentum, m=self.m)
        x0, x1 = views
        q0 = self.projection_head(self.backbone(x0))
        if not self.symmetric:
            return self.criterion(q0, self.key(x1))
        q1 = self.projection_head(self.backbone(x1))
        return self.criterion(torch.cat([q0, q1]), torch.cat([self.key(x1), self.key(x0)]))


class BYOL(nn.Module):
    """lightly's BYOL benchmark: cosine momentum schedule, loss 2 * NegCos per direction, summed."""

    def __init__(self, backbone, dim, a):
        super().__init__()
        self.backbone = backbone
        self.projection_head = BYOLProjectionHead(dim, a.proj_hidden, a.proj_dim)
        self.prediction_head = BYOLPredictionHead(a.proj_dim, a.pred_hidden, a.proj_dim)
        self.backbone_momentum = copy.deepcopy(self.backbone)
        self.projection_head_momentum = copy.deepcopy(self.projection_head)
        deactivate_requires_grad(self.backbone_momentum)
        deactivate_requires_grad(self.projection_head_momentum)
        self.criterion = NegativeCosineSimilarity()
        self.base_momentum, self.total_steps = a.ema_momentum, a.total_steps

    def trainable(self):
        return [self.backbone, self.projection_head, self.prediction_head]

    def training_step(self, views, step, epoch):
        m = cosine_schedule(step, self.total_steps, self.base_momentum, 1.0)
        update_momentum(self.backbone, self.backbone_momentum, m=m)
        update_momentum(self.projection_head, self.projection_head_momentum, m=m)
        x0, x1 = views
        p0, p1 = (self.prediction_head(self.projection_head(self.backbone(x))) for x in (x0, x1))
        with torch.no_grad():
            z0, z1 = (self.projection_head_momentum(self.backbone_momentum(x)) for x in (x0, x1))
        # 2 * NegCos = |p/|p| - z/|z||^2 - 2: the paper's loss (and kontrast's) up to a constant
        return 2 * self.criterion(p0, z1) + 2 * self.criterion(p1, z0)


class SwAV(nn.Module):
    """lightly's SwAV benchmark: each crop through backbone and head, normalised, lightly's prototypes,
    SwaVLoss (Sinkhorn codes of the global crops), prototypes frozen for the first steps, optional queue
    (lightly's MemoryBankModule per global crop) that joins the codes once full.

    DIFFERENCE: lightly's SwaVPrototypes is an nn.Linear with a bias (kontrast's prototypes have none).
    """

    def __init__(self, backbone, dim, a):
        super().__init__()
        self.backbone = backbone
        self.projection_head = SwaVProjectionHead(dim, a.proj_hidden, a.proj_dim)
        frozen_steps = round(a.freeze_prototypes_epochs * a.steps_per_epoch)
        self.prototypes = SwaVPrototypes(a.proj_dim, a.num_prototypes, n_steps_frozen_prototypes=frozen_steps)
        self.criterion = SwaVLoss(temperature=a.temperature, sinkhorn_iterations=a.sinkhorn_iterations,
                                  sinkhorn_epsilon=a.sinkhorn_epsilon)
        self.global_views, self.queue_size, self.queue_start = a.global_views, a.queue_size, a.queue_start_epochs
        self.queues = nn.ModuleList(MemoryBankModule(size=(a.queue_size, a.proj_dim))
                                    for _ in range(a.global_views if a.queue_size > 0 else 0))
        self.pushed = 0  # keys pushed into each queue so far

    def trainable(self):
        return [self.backbone, self.projection_head, self.prototypes]

    def training_step(self, views, step, epoch):
        self.prototypes.normalize()
        projections = [F.normalize(self.projection_head(self.backbone(x)), dim=1) for x in views]
        logits = [self.prototypes(z, step=step) for z in projections]
        queue_logits = None
        if self.queues and epoch >= self.queue_start:
            with torch.no_grad():
                banks = [queue(z.detach(), update=True)[1].T for queue, z in zip(self.queues, projections)]
                if self.pushed >= self.queue_size:  # a full queue joins the Sinkhorn problem (as kontrast)
                    queue_logits = [self.prototypes(bank, step=step) for bank in banks]
                self.pushed += len(projections[0])
        return self.criterion(logits[: self.global_views], logits[self.global_views:], queue_logits)


class SimSiam(nn.Module):
    """lightly's SimSiam (CIFAR-10 benchmark: a 2-layer projection head), symmetric negative cosine."""

    def __init__(self, backbone, dim, a):
        super().__init__()
        self.backbone = backbone
        self.projection_head = mlp_head(dim, a.proj_hidden, a.proj_dim, out_bn=True)
        self.prediction_head = SimSiamPredictionHead(a.proj_dim, a.pred_hidden, a.proj_dim)
        self.criterion = NegativeCosineSimilarity()
        self.stop_gradient = a.stop_gradient

    def trainable(self):
        return [self.backbone, self.projection_head, self.prediction_head]

    def training_step(self, views, step, epoch):
        z0, z1 = (self.projection_head(self.backbone(x)) for x in views)
        p0, p1 = self.prediction_head(z0), self.prediction_head(z1)
        if self.stop_gradient:
            z0, z1 = z0.detach(), z1.detach()
        return 0.5 * (self.criterion(p0, z1) + self.criterion(p1, z0))


MODELS = {"simclr": SimCLR, "moco_v2": MoCoV2, "byol": BYOL, "swav": SwAV, "simsiam": SimSiam}


# ----------------------------------------------------------------------------------------------- optimizer
class ClippedLARS(LARS):
    """kontrast's ``optim.lars_clip`` form on lightly's LARS: the adaptive rate capped by the scheduled lr.

    DIFFERENCE: not lightly's. lightly.utils.lars.LARS scales the update by ``lr * eta ||w|| / (||g|| + wd ||w||)``;
    solo-learn's clipped form (kontrast's ``lars_clip``) uses ``min(eta ||w|| / (||g|| + wd ||w||), lr)``.
    Used only with ``--lars-clip``; parity.py leaves it off unless asked (``--peer-lars-clip``).
    """

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            wd, lr = group["weight_decay"], group["lr"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                d = p.grad.add(p, alpha=wd) if wd else p.grad.clone()
                if wd != 0:  # lightly's rule: groups without weight decay (norms, biases) get no adaptation
                    w_norm, g_norm = torch.linalg.vector_norm(p), torch.linalg.vector_norm(p.grad)
                    rate = group["trust_coefficient"] * w_norm / (g_norm + wd * w_norm + group["eps"])
                    scale = torch.clamp(rate / lr, max=1.0) if lr > 0 else torch.ones_like(rate)
                    d.mul_(torch.where((w_norm > 0) & (g_norm > 0), scale, 1.0))
                state = self.state[p]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = d.clone()
                else:
                    state["momentum_buffer"].mul_(group["momentum"]).add_(d)
                p.add_(state["momentum_buffer"], alpha=-lr)


def make_optimizer(model, a, notes: list):
    """Weight decay off for norms and biases (lightly's get_weight_decay_parameters, as its benchmarks do).

    Groups marked ``fixed_lr`` (SimSiam's predictor with ``--fix-pred-lr``) keep the peak lr.
    """
    fixed = [model.prediction_head] if a.method == "simsiam" and a.fix_pred_lr else []
    scheduled = [m for m in model.trainable() if all(m is not f for f in fixed)]
    groups = []
    for modules, is_fixed in ((scheduled, False), (fixed, True)):
        if modules:
            params, no_wd = get_weight_decay_parameters(modules)
            groups += [{"params": params, "weight_decay": a.weight_decay, "fixed_lr": is_fixed},
                       {"params": no_wd, "weight_decay": 0.0, "fixed_lr": is_fixed}]
    groups = [g for g in groups if g["params"]]
    if a.optim == "sgd":
        return torch.optim.SGD(groups, lr=a.peak_lr, momentum=a.momentum)
    if a.optim == "lars":
        if not a.lars_clip and a.kontrast_lars_clip:
            notes.append(LARS_NOTE)
        cls = ClippedLARS if a.lars_clip else LARS
        return cls(groups, lr=a.peak_lr, momentum=a.momentum, trust_coefficient=a.lars_eta)
    if a.optim == "adamw":
        return torch.optim.AdamW(groups, lr=a.peak_lr, betas=tuple(a.betas))
    raise SystemExit(f"unknown optimizer {a.optim!r}")


def lr_at(step: int, a) -> float:
    """Linear warm-up from 0, then cosine to min_lr (an absolute rate, as kontrast's optim.min_lr): lightly's
    cosine_warmup_schedule, per step."""
    if a.warmup_steps > a.total_steps:  # lightly's schedule refuses this; kontrast's stays in its warm-up
        return a.peak_lr * (step + 1) / a.warmup_steps
    return cosine_warmup_schedule(step, a.total_steps, a.peak_lr, a.min_lr, a.warmup_steps, 0.0)


# ----------------------------------------------------------------------------------------------- kNN
@torch.no_grad()
def features(backbone, ds, a) -> tuple[torch.Tensor, torch.Tensor]:
    loader = DataLoader(ds, batch_size=512, num_workers=a.workers)
    feats, labels = [], []
    for x, y in loader:
        with torch.autocast(a.device.split(":")[0], dtype=torch.bfloat16, enabled=a.bf16):
            feats.append(backbone(x.to(a.device)).float().cpu())
        labels.append(y)
    return torch.cat(feats), torch.cat(labels)


def knn_score(backbone, a, train_paths: list[str]) -> float:
    """kontrast eval's protocol: frozen pooled backbone features of the test split (ToTensor + the recipe's
    normalisation, no resize at 32 px), weighted kNN against the bank (peer_common.knn_top1)."""
    ev = T.Compose([T.ToTensor(), T.Normalize(a.views[0]["mean"], a.views[0]["std"])])
    train = torchvision.datasets.ImageFolder(os.path.join(a.data, "train"), transform=ev)
    test = torchvision.datasets.ImageFolder(os.path.join(a.data, "test"), transform=ev)
    order, paths = sorted_order(train.samples, train.root)
    if a.knn_bank == "used":
        where = {p: i for i, p in enumerate(paths)}
        bank = [order[where[p]] for p in train_paths]
    else:
        bank = order
    if a.knn_max_train and a.knn_max_train < len(bank):
        bank = [bank[i] for i in kontrast_subset(len(bank), a.knn_max_train, a.seed)]
    test_rows = sorted_order(test.samples, test.root)[0]
    if a.knn_max_test and a.knn_max_test < len(test_rows):
        test_rows = [test_rows[i] for i in kontrast_subset(len(test_rows), a.knn_max_test, a.seed)]
    backbone.eval()
    f_bank, y_bank = features(backbone, Subset(train, bank), a)
    f_test, y_test = features(backbone, Subset(test, test_rows), a)
    return knn_top1(f_bank, y_bank, f_test, y_test, k=a.knn_k, temperature=a.knn_temperature,
                    num_classes=len(train.classes))


# ----------------------------------------------------------------------------------------------- main
def main(argv=None) -> int:
    a = parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    random.seed(a.seed)
    np.random.seed(a.seed)  # lightly's GaussianBlur and solarization draw from numpy
    notes: list[str] = []
    data, paths, digest = train_images(a, build_transform(a, notes))
    loader = DataLoader(data, batch_size=a.batch, shuffle=True, drop_last=True, num_workers=a.workers,
                        persistent_workers=a.workers > 0, generator=torch.Generator().manual_seed(a.seed))
    a.steps_per_epoch = len(loader)
    a.total_steps = a.epochs * a.steps_per_epoch
    a.warmup_steps = round(a.warmup_epochs * a.steps_per_epoch)
    a.peak_lr = a.lr * a.batch / a.lr_batch
    if a.warmup_steps > a.total_steps:
        notes.append(f"warm-up ({a.warmup_steps} steps) longer than the run ({a.total_steps}): lr stays in the "
                     "linear warm-up (kontrast's schedule; lightly's cosine_warmup_schedule refuses it)")
    backbone, dim, _ = make_backbone(a)
    model = MODELS[a.method](backbone, dim, a).to(a.device)
    if a.channels_last:
        model = model.to(memory_format=torch.channels_last)
    optimizer = make_optimizer(model, a, notes)
    run_steps = min(a.total_steps, a.max_steps) if a.max_steps else a.total_steps
    step, loss, compute = 0, torch.zeros(()), 0.0
    model.train()
    t_start = time.perf_counter()
    for epoch in range(a.epochs):
        for views, _ in loader:
            t0 = time.perf_counter()
            views = [v.to(a.device, memory_format=torch.channels_last if a.channels_last else torch.preserve_format)
                     for v in views]
            lr = lr_at(step, a)
            for group in optimizer.param_groups:
                group["lr"] = a.peak_lr if group["fixed_lr"] else lr
            with torch.autocast(a.device.split(":")[0], dtype=torch.bfloat16, enabled=a.bf16):
                loss = model.training_step(views, step, epoch)
            optimizer.zero_grad()
            loss.float().backward()
            optimizer.step()
            loss = loss.detach()
            compute += time.perf_counter() - t0
            step += 1
            if step % a.log_every == 0 or step == run_steps:
                print(f"step {step}/{run_steps} epoch {epoch} lr {lr:.4g} loss {loss.item():.4f}", file=sys.stderr,
                      flush=True)
            if step >= run_steps:
                break
        if step >= run_steps:
            break
    wall = time.perf_counter() - t_start
    t_eval = time.perf_counter()
    top1 = knn_score(backbone, a, paths)
    settings = {k: v for k, v in vars(a).items() if k not in ("data",)}
    print(json.dumps({"method": a.method, "seed": a.seed, "knn_top1": top1,
                      "img_per_s": round(step * a.batch / wall, 1),
                      "img_per_s_compute": round(step * a.batch / max(compute, 1e-9), 1), "steps": step,
                      "epochs": a.epochs, "train_images": len(data), "train_subset_sha": digest,
                      "wall_s": round(wall, 1), "eval_s": round(time.perf_counter() - t_eval, 1),
                      "final_loss": float(loss), "knn_bank": a.knn_bank, "lightly": _lightly_version(),
                      "torch": torch.__version__, "differences": list(dict.fromkeys(notes)), "settings": settings}))
    return 0


def _lightly_version() -> str:
    import lightly

    return lightly.__version__


if __name__ == "__main__":
    sys.exit(main())
