"""MoCo v2: momentum key encoder + queue of negatives (Chen et al. 2020, https://arxiv.org/abs/2003.04297).

augment: MoCo v2 recipe (crop 0.2-1, jitter, grayscale, blur) -> encoder
-> mlp(dim, 2048, 128) -> cosine / tau against [key, queue] -> InfoNCE. ``training_step`` returns the
step's momentum keys as ``out["keys"]``; ``after_step`` L2-normalises them into the queue.
Paper: tau = 0.2, MLP head, momentum 0.999, queue 65536 (ImageNet).
CIFAR-scale defaults, from the authors' CIFAR-10 demo (facebookresearch/moco,
colab notebook): queue 4096, momentum 0.99, symmetric loss, SGD lr 0.06,
weight decay 5e-4; shuffling BN emulated as the demo's 8 GPUs: each view is forwarded on its own, cut
into 8 BN groups of near-equal size (any batch >= 16), the keys' groups drawn at random within their view
(see encoders/batchnorm.py). ``symmetric = False`` (MoCo v1) forwards only what its loss uses: view 1
through the query encoder, view 2 through the key encoder.

One deliberate difference from the paper's head: BN after the hidden layer (``proj_bn``, as MoCo v3
and SimCLR do); without it this CIFAR ResNet collapses in its first epoch (docs/methods.md, "MoCo").
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn

from kontrast.config import checked
from kontrast.encoders.batchnorm import grouped_forward, shuffled_forward
from kontrast.encoders.target import MomentumTarget
from kontrast.errors import UserError
from kontrast.extract import mlp
from kontrast.losses import Queue, mi_bound, moco_loss
from kontrast.methods.base import Method, Needs, Progress, Ranks, embedding_std
from kontrast.precision import at_least_float32
from kontrast.registry import METHODS


@dataclass(frozen=True)
class MoCoV2Params:
    temperature: float = checked(0.2, gt=0)  # tau of the scores q.k / tau
    queue_size: int = checked(4096, ge=1)  # K negatives kept from earlier batches' keys
    momentum: float = checked(0.99, ge=0, le=1)  # the key encoder's EMA momentum
    proj_hidden: int = checked(2048, ge=0)  # 0 = a linear head (MoCo v1)
    proj_dim: int = checked(128, ge=1)  # output width of the projection head
    symmetric: bool = True  # loss on both (q1, k2) and (q2, k1)
    proj_bn: bool = True  # BN in the head's hidden layer (not the paper's; without it the CIFAR ResNet collapses)
    bn_groups: int = checked(8, ge=1)  # shuffling-BN emulation: BN groups per view, as 8 GPUs (the authors' CIFAR demo)
    head_bn_groups: bool = True  # the head's BN in those groups too, as each GPU runs the whole network; False: over
    # the whole view (lightly's SplitBatchNorm sits in the backbone only; one process only)

    def validate(self, cfg) -> None:
        """The queue must hold at least one step's keys; micro-batches need the head's BN in groups too."""
        keys = cfg.train.batch_size * (2 if self.symmetric else 1)
        if self.queue_size < keys:
            raise UserError(f"config key 'method.queue_size' ({self.queue_size}) is smaller than the keys pushed "
                            f"per step ({keys} = batch {cfg.train.batch_size}"
                            f"{' x 2 views' if self.symmetric else ''}); raise it or lower the batch size")
        if cfg.train.accumulate > 1 and not self.head_bn_groups:  # (the groups themselves: kontrast.decisions)
            raise UserError(f"train.accumulate ({cfg.train.accumulate}) needs method.head_bn_groups true: each "
                            "micro-batch forwards its BN groups through the whole network, as a process does")


@METHODS.register("moco_v2")
class MoCoV2(Method):
    description = "MoCo v2: momentum encoder, queue of negatives, MLP head (Chen et al. 2020)"
    recipe = "moco_v2"
    Params = MoCoV2Params
    # several processes with the head's BN in groups too; shuffling BN: per-group statistics, the groups spread over
    # the processes (encoders/batchnorm.py), so train.sync_bn does not apply
    needs = Needs(processes="head_bn_groups", sync_bn=False, bn_groups="bn_groups")
    defaults = {"optim": {"name": "sgd", "lr": 0.06, "lr_batch": 256, "momentum": 0.9, "weight_decay": 5e-4}}

    def __init__(self, encoder, params: MoCoV2Params, num_samples: int = 0, ranks: Ranks = Ranks()):
        super().__init__(encoder, params, num_samples, ranks)
        hidden = [params.proj_hidden] if params.proj_hidden else []
        self.projector = mlp([encoder.dim, *hidden, params.proj_dim], norm=params.proj_bn)
        self.target = MomentumTarget(self._online())
        self.queue = Queue(params.queue_size, params.proj_dim)

    def _online(self) -> nn.Module:
        return nn.Sequential(self.encoder, self.projector)

    def training_step(self, views: list[torch.Tensor], indices: torch.Tensor | None = None,
                      progress: Progress | None = None) -> dict[str, torch.Tensor]:
        p, ranks = self.params, self.ranks
        online, target = self._online(), self.target.net
        groups = p.bn_groups // (ranks.world * self.micro_batches)  # each rank (micro-batch) has bn_groups / W K GPUs
        queries = lambda x: self._grouped(online, x, lambda n, y: grouped_forward(n, y, groups))  # noqa: E731
        q1 = self.in_micro_batches(queries, views[:1])  # [B, proj_dim] queries, per sample (base.py)
        with torch.no_grad():  # keys: random BN groups within view 2 (across ranks on several)
            k2 = self._grouped(target, views[1], lambda n, x: shuffled_forward(n, x, p.bn_groups, ranks))  # [B, D]
        queue = self.queue.items.clone()  # [K, proj_dim] negatives before this step's push
        # Algorithm 1: scores [B, 1+K] = cos(q1, [k2, queue]) / tau, InfoNCE with the key of the same image in column 0
        loss = moco_loss(q1, k2, queue, p.temperature)
        keys = ranks.gather(k2)  # [BW, proj_dim] every rank's keys enter the queue (one process: k2)
        if p.symmetric:  # the other direction; the asymmetric loss (MoCo v1) forwards neither q2 nor k1
            q2 = self.in_micro_batches(queries, views[1:2])  # [B, proj_dim]
            with torch.no_grad():
                k1 = self._grouped(target, views[0], lambda n, x: shuffled_forward(n, x, p.bn_groups, ranks))
            loss = (loss + moco_loss(q2, k1, queue, p.temperature)) / 2  # the same for cos(q2, [k1, queue]) / tau
            keys = torch.cat([ranks.gather(k1), keys])  # [2BW, proj_dim]
        n = 1 + queue.shape[0]  # candidates per query: its key and the queue
        return {"loss": loss, "embedding_std": embedding_std(q1), "mi_bound": mi_bound(loss, n),
                "keys": keys}  # [2BW or BW, proj_dim] for the queue, pushed in after_step

    def _grouped(self, net: nn.Sequential, x: torch.Tensor, forward) -> torch.Tensor:
        """``forward(net, x)`` (one view in BN groups); with ``head_bn_groups`` false the groups reach the encoder
        ``net[0]`` only and the head ``net[1]`` runs once on the whole view."""
        return forward(net, x) if self.params.head_bn_groups else net[1](forward(net[0], x))

    def after_step(self, out: dict[str, torch.Tensor], progress: Progress) -> None:
        self.target.update(self._online(), self.params.momentum)
        self.queue.push(nn.functional.normalize(at_least_float32(out["keys"]), dim=1))
