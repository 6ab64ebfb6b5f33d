"""CPC v1 on sequences (van den Oord, Li & Vinyals 2018, https://arxiv.org/abs/1807.03748).

sequence -> strided conv g_enc -> z_t -> GRU g_ar -> c_t; for each step k = 1..K a bilinear
score ``z_j^T W_k c_t`` (eq. 3) -> InfoNCE (eq. 4): c_t must pick z_{t+k} among the steps of its
own sequence and of the other sequences in its negative pool. Paper defaults (audio, section
3.1): 256-unit GRU, K = 12, Adam lr 2e-4 at 64 sequences per batch. Evaluation reads the
context c_t averaged over time (``PooledContext``), as the paper's linear probes read c_t.

No image views: ``recipe = None`` tells the loop to hand the raw float batch [B, C, L].
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn

from kontrast.config import checked
from kontrast.errors import UserError
from kontrast.extract import GRUContext, PooledContext
from kontrast.losses import info_nce, mi_bound
from kontrast.losses.local import negative_pools
from kontrast.methods.base import Method, Needs, Progress, Ranks
from kontrast.precision import at_least_float32
from kontrast.registry import METHODS
from kontrast.similarity import bilinear


@dataclass(frozen=True)
class CPCParams:
    context_dim: int = checked(256, ge=1)  # GRU units
    steps: int = checked(12, ge=1)  # K: predict z_{t+1} .. z_{t+K}
    negative_pool: int = checked(8, ge=1)  # sequences whose steps are each other's negatives (bounds the score matrix)


@METHODS.register("cpc")
class CPC(Method):
    description = ("CPC v1: conv g_enc + GRU g_ar on sequences, bilinear z^T W_k c per step, InfoNCE "
                   "(van den Oord et al. 2018)")
    recipe = None  # sequences, not images
    Params = CPCParams
    defaults = {"data": {"source": "sequences"}, "encoder": {"name": "conv1d"},
                "optim": {"name": "adamw", "lr": 2e-4, "lr_batch": 64, "weight_decay": 0.0}}
    # pools of negative_pool sequences never span processes (each process's share divides by it): no communication
    needs = Needs(processes=True, pool="negative_pool")

    def __init__(self, encoder, params: CPCParams, num_samples: int = 0, ranks: Ranks = Ranks()):
        if not hasattr(encoder, "forward_sequence"):
            raise UserError("cpc needs a sequence encoder (encoder.name conv1d or cpc_audio)")
        super().__init__(PooledContext(encoder, GRUContext(encoder.dim, params.context_dim)), params, num_samples,
                         ranks)
        # one W_k per step: [K, D_z, D_c]; near zero at start, so candidates score alike and the loss starts at ~log N
        self.predictors = nn.Parameter(torch.randn(params.steps, encoder.dim, params.context_dim)
                                       * 0.01 / params.context_dim**0.5)

    def training_step(self, views: list[torch.Tensor], indices: torch.Tensor | None = None,
                      progress: Progress | None = None) -> dict[str, torch.Tensor]:
        z, c = self.in_micro_batches(self.encoder.forward_sequence, views[:1])  # [B, T, D], [B, T, H] per sample
        (b, t), steps, pool = z.shape[:2], self.params.steps, self.params.negative_pool
        if t <= steps:
            raise UserError(f"cpc: sequences give {t} encoder steps, need more than method.steps={steps}")
        losses, bounds = [], []
        for k in range(1, steps + 1):
            targets = torch.arange(k, t, device=z.device)  # [T-k]: z_{t+k} for anchors c_0 .. c_{T-k-1}
            total = c.new_zeros((), dtype=at_least_float32(c).dtype)
            for anchors, candidates, positives in negative_pools(c[:, : t - k], z, targets, pool):  # g sequences each
                scores = bilinear(anchors, candidates, self.predictors[k - 1])  # [g(T-k), gT] z_j^T W_k c_t (eq. 3)
                total = total + info_nce(scores, positives) * len(positives)  # eq. 4: c_t picks z_{t+k}
            loss_k = total / (b * (t - k))  # mean over all B (T-k) anchors
            losses.append(loss_k)
            bounds.append(mi_bound(loss_k, min(pool, b) * t))
        return {"loss": torch.stack(losses).mean(), "mi_bound": torch.stack(bounds).mean()}
