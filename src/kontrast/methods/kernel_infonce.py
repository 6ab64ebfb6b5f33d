"""Kernel-InfoNCE: InfoNCE whose similarity is a kernel (Tan, Zhang, Yang & Yuan, ICLR 2024,
"Contrastive Learning Is Spectral Clustering on Similarity Graph", https://arxiv.org/abs/2303.15103).

augment: SimCLR's CIFAR recipe -> encoder -> mlp(dim, dim, 128) -> L2-normalised outputs (the
authors' code normalises the projection) -> log-kernel scores between all 2B views
(``similarity.py``) -> NT-Xent's targets (``two_view_info_nce``). ``kernel`` picks the similarity:

    gaussian    exp(-|z - z'|^2 / tau)                 (= SimCLR with cosine temperature tau / 2)
    laplacian   exp(-|z - z'| / tau)
    gamma       exp(-|z - z'|^gamma / tau)
    simple_sum  exp(-|z - z'|^2 / tau2) + exp(-|z - z'|^gamma / tau)                 (Simple Sum)
    concat_sum  the same two kernels on the two halves of the embedding dims    (Concatenation Sum)

with tau = ``temperature`` and tau2 = ``gaussian_temperature``. The paper's mixtures add the kernels
(inside the log); the authors' code instead adds the two InfoNCE losses with a weight. The
temperatures were tuned by random search and no CIFAR table of them is published; the defaults put
each kernel on the scale of SimCLR's tau = 0.5 (Gaussian tau2 = 1.0, i.e. cosine 0.5).

With MoCo-style negatives (a queue) the same scores apply: ``info_nce(cat([paired_kernel_scores(q, k),
kernel_scores(q, queue)], 1), zeros)`` (column 0 = the key; ``tests/unit/losses/test_kernels_spectral_nce.py``
checks the Gaussian case against ``moco_loss``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from kontrast.errors import UserError
from kontrast.extract import mlp
from kontrast.losses import mi_bound, two_view_info_nce
from kontrast.methods.base import Method, Needs, Progress, Ranks, embedding_std
from kontrast.precision import at_least_float32
from kontrast.registry import METHODS
from kontrast.similarity import concat_sum_scores, kernel_scores, simple_sum_scores

KERNELS = ("gaussian", "laplacian", "gamma", "simple_sum", "concat_sum")


@dataclass(frozen=True)
class KernelInfoNCEParams:
    kernel: str = "simple_sum"  # the similarity kernel: gaussian, laplacian, gamma, simple_sum or concat_sum
    gamma: float = 1.0  # exponent of the "gamma" kernel and of the mixtures' second kernel
    temperature: float = 0.5  # tau of the single kernel / the gamma kernel in mixtures
    gaussian_temperature: float = 1.0  # tau2 of the Gaussian kernel in mixtures
    proj_hidden: int = 0  # 0 = the encoder's feature dim
    proj_dim: int = 128  # output width of the projection head
    def __post_init__(self):
        if self.kernel not in KERNELS:
            raise UserError(f"unknown method.kernel {self.kernel!r}; choose one of: {', '.join(KERNELS)}")
        if not 0 < self.gamma <= 2:
            raise UserError(f"method.gamma must be in (0, 2] (a valid exponential kernel), got {self.gamma}")
        if self.kernel == "concat_sum" and self.proj_dim % 2:
            raise UserError(f"kernel concat_sum splits method.proj_dim in two; use an even size, got {self.proj_dim}")


def scores(p: KernelInfoNCEParams, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The configured log-kernel between ``a [N, D]`` and ``b [M, D]``: ``[N, M]``."""
    mixture = ((2.0, p.gaussian_temperature), (p.gamma, p.temperature))
    if p.kernel == "simple_sum":
        return simple_sum_scores(a, b, mixture)
    if p.kernel == "concat_sum":
        return concat_sum_scores(a, b, mixture)
    gamma = {"gaussian": 2.0, "laplacian": 1.0}.get(p.kernel, p.gamma)
    return kernel_scores(a, b, gamma, p.temperature)


@METHODS.register("kernel_infonce")
class KernelInfoNCE(Method):
    description = "Kernel-InfoNCE: InfoNCE with Gaussian/Laplacian kernels and their mixtures (Tan et al. 2024)"
    recipe = "simclr_cifar"
    Params = KernelInfoNCEParams
    needs = Needs(processes=True)
    # SimCLR's optimizer
    defaults = {"optim": {"name": "sgd", "lr": 0.06, "lr_batch": 256, "momentum": 0.9, "weight_decay": 5e-4}}

    def __init__(self, encoder, params: KernelInfoNCEParams, num_samples: int = 0, ranks: Ranks = Ranks()):
        super().__init__(encoder, params, num_samples, ranks)
        hidden = params.proj_hidden or encoder.dim
        self.projector = mlp([encoder.dim, hidden, params.proj_dim])

    def training_step(self, views: list[torch.Tensor], indices: torch.Tensor | None = None,
                      progress: Progress | None = None) -> dict[str, torch.Tensor]:
        b = views[0].shape[0]
        z = self.in_micro_batches(lambda x: self.projector(self.encoder(x)), views[:2])  # [2B, proj_dim], per sample
        z = F.normalize(at_least_float32(z), dim=1)  # [2B, proj_dim]
        candidates, mine = self.ranks.everyone(z)  # [2BW, proj_dim] every rank's cat(view 1, view 2) (one process: z)
        s = scores(self.params, z, candidates)  # [2B, 2BW] log k(z_i, z_j)
        loss = two_view_info_nce(s, b, mine.start)  # NT-Xent's targets: the other view; itself masked
        return {"loss": loss, "embedding_std": embedding_std(z[:b]),
                "mi_bound": mi_bound(loss, candidates.shape[0] - 1)}
