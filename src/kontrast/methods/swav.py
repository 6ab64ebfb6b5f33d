"""SwAV: swapped prediction of online cluster codes (Caron et al. 2020, https://arxiv.org/abs/2006.09882).

augment: multi-crop, 2 global + 4 small crops -> encoder (one pass per resolution)
-> mlp(dim, 2048, 128) -> cosine with K learnable prototypes -> Sinkhorn-Knopp codes of the
2 global crops (ε = 0.05, 3 iterations, no gradient) -> each code predicted from every other
crop with softmax(scores / τ), τ = 0.1. Optional queue of past global-crop embeddings
(for small batches) joins the Sinkhorn problem from epoch ``queue_start_epochs`` on; the
prototypes get no gradient for the first ``freeze_prototypes_epochs`` epochs.
CIFAR defaults from solo-learn's CIFAR recipe: 3000 prototypes, queue 3840 from epoch 50,
prototypes frozen for 2 epochs, LARS in solo-learn's clipped form (``optim.lars_clip``, eta 0.02) lr 0.6
x batch/256, weight decay 1e-6, 10 warm-up epochs.
Epoch-based switches read ``progress.epochs_done`` (finished steps / steps per epoch; without a
``progress``, as outside training, epoch 0). Once the queue is in use ``training_step`` returns the
global crops' embeddings as ``out["keys"]`` [global_views, B, proj_dim], pushed by ``after_step``.
On W processes the codes come from one transport over every rank's samples (their scores gathered:
the same plan as one process on the global batch) and the queue takes every rank's embeddings.
Scores, codes and loss run in float32, Sinkhorn-Knopp in the log domain (docs/methods.md, "SwAV").
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from kontrast.config import checked
from kontrast.encoders.multicrop import encode_views
from kontrast.extract import Prototypes, mlp
from kontrast.losses import Queue
from kontrast.losses.swav import sinkhorn, swapped_prediction
from kontrast.methods.base import Method, Needs, Progress, Ranks, embedding_std
from kontrast.precision import at_least_float32, float32
from kontrast.registry import METHODS


@dataclass(frozen=True)
class SwAVParams:
    temperature: float = checked(0.1, gt=0)  # tau of the prototype scores' softmax
    num_prototypes: int = checked(3000, ge=1)  # K prototypes (the codes' classes)
    proj_hidden: int = checked(2048, ge=1)  # hidden width of the projector MLP
    proj_dim: int = checked(128, ge=1)  # output width of the projector (the prototypes' dimension)
    sinkhorn_epsilon: float = checked(0.05, gt=0)  # entropy weight of the Sinkhorn-Knopp codes (smaller: sharper)
    sinkhorn_iterations: int = checked(3, ge=1)  # Sinkhorn-Knopp iterations per batch
    queue_size: int = checked(3840, ge=0)  # per global crop; 0 = no queue
    queue_start_epochs: float = checked(50.0, ge=0)  # from this epoch on, earlier features join the codes' problem
    freeze_prototypes_epochs: float = checked(2.0, ge=0)  # epochs during which the prototypes get no gradient
    global_views: int = checked(2, ge=1)  # the first views of the recipe are the global crops (the codes' source)

    @property
    def views_needed(self) -> int:
        """Views a step compares: the ``global_views`` global crops, and at least 2."""
        return max(2, self.global_views)


@METHODS.register("swav")
class SwAV(Method):
    description = "SwAV: swapped prediction of Sinkhorn cluster codes, multi-crop (Caron et al. 2020)"
    recipe = "swav_multicrop"
    Params = SwAVParams
    defaults = {"optim": {"name": "lars", "lars_clip": True, "lr": 0.6, "weight_decay": 1e-6, "warmup_epochs": 10.0}}
    # the transport over every rank's samples (gathered scores), the queue of every rank's
    needs = Needs(views="views_needed", processes=True, idle_parameters=True)  # the prototypes frozen early
    retired_state = ("steps",)  # the step counter older versions kept; epochs now come from progress

    def __init__(self, encoder, params: SwAVParams, num_samples: int = 0, ranks: Ranks = Ranks()):
        super().__init__(encoder, params, num_samples, ranks)
        self.projector = mlp([encoder.dim, params.proj_hidden, params.proj_dim])
        self.prototypes = Prototypes(params.proj_dim, params.num_prototypes)
        self.queues = nn.ModuleList(Queue(params.queue_size, params.proj_dim) for _ in range(params.global_views)
                                    if params.queue_size > 0)

    def training_step(self, views: list[torch.Tensor], indices: torch.Tensor | None = None,
                      progress: Progress | None = None) -> dict[str, torch.Tensor]:
        p, b, n_views = self.params, views[0].shape[0], len(views)
        epochs = progress.epochs_done if progress is not None else 0.0
        # per sample, in micro-batches (base.py): the encoder per crop size, the projector on every crop
        h = encode_views(self.encoder, views, self.in_micro_batches)  # [V*B, dim]
        z = F.normalize(self.in_micro_batches(self.projector, list(h.split(b))), dim=1)  # [V*B, proj_dim]
        frozen = self.num_samples > 0 and epochs < p.freeze_prototypes_epochs
        with float32(z):  # scores and codes in float32 (exp(s / ε) is sensitive)
            scores = self.prototypes(at_least_float32(z), frozen=frozen).view(n_views, b, -1)  # [V, B, K] cos(z, c_k)
            codes, mine = [], self.ranks.own(b)  # this rank's rows of the batch
            for a in range(p.global_views):
                s = self.ranks.gather(scores[a].detach())  # [BW, K] every rank's samples share the prototypes
                if self.queues and self.queues[a].full:  # a full queue joins the transport
                    s = torch.cat([s, self.prototypes(self.queues[a].items)])  # [BW+Q, K]
                codes.append(sinkhorn(s, p.sinkhorn_epsilon, p.sinkhorn_iterations)[mine])  # [B, K]
        loss = swapped_prediction(scores, torch.stack(codes), p.temperature)  # -sum_k q_k log softmax(scores / tau)_k
        out = {"loss": loss, "embedding_std": embedding_std(z[:b]), "prototypes_frozen": torch.tensor(float(frozen))}
        if self.queues and self.num_samples > 0 and epochs >= p.queue_start_epochs:
            keys = z[: p.global_views * b].detach().view(p.global_views, b, -1)  # [A, B, proj_dim] to queue
            out["keys"] = torch.stack([self.ranks.gather(k) for k in keys])  # [A, BW, proj_dim] every rank's
        return out

    def after_step(self, out: dict[str, torch.Tensor], progress: Progress) -> None:
        self.prototypes.normalize_()
        if "keys" in out:
            for queue, keys in zip(self.queues, out["keys"]):
                queue.push(at_least_float32(keys))
