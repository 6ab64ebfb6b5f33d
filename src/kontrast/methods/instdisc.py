"""InstDisc: non-parametric instance discrimination with a memory bank and NCE
(Wu, Xiong, Yu & Lin 2018, https://arxiv.org/abs/1805.01978).

augment: one view per image (crop 0.2-1, jitter 0.4 incl. hue, grayscale) -> encoder -> linear
128-d head -> L2 normalise -> f. Each image is its own class; its "weight" is its entry v_i in a
memory bank of every training image (``losses/negatives.py:MemoryBank``), random unit vectors at
the start. The loss is the NCE approximation of the non-parametric softmax with m noise entries
drawn uniformly from the bank and Z estimated by Monte Carlo (``losses/nce.py``); ``proximal =
lambda`` adds the paper's proximal term ``lambda |f_i - v_i|^2`` (section 3.4; the authors' code
leaves it out, so 0 here). After the step the batch's bank rows move towards f with momentum 0.5
and are re-normalised. No gradient reaches the bank.

Three differences from the authors' code, each measured (docs/methods.md, "InstDisc"): Z is
re-estimated on every step (``z_estimate = "step"``; ``"once"`` is the paper's fixed first-batch
estimate, which turns the loss into pure repulsion once the bank holds real features); an
affine-free BN after the linear head (``head_bn``; without it the bank fills with near-copies);
the m noise entries are drawn once per step and shared by the batch (same expectation, B x less memory).

CIFAR defaults from the authors' ``cifar.py`` (github.com/zhirongw/lemniscate.pytorch, current
version; the first release had lr 0.1): tau 0.1, m 4096, 128-d, bank momentum 0.5, SGD lr 0.03 at
batch 128, weight decay 5e-4. The bank has ``num_samples`` rows (the training-set size, from the
loop). Besides the loss, ``training_step`` reports ``log_z`` and ``pos_sim`` (mean cosine of f_i to
its bank entry: near 0 while the bank is random or stale, rising as the features settle), and returns
the bank update for ``after_step``: ``out["indices"]`` [B] (the rows) and ``out["features"]`` [B, D] (f).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from kontrast.config import checked
from kontrast.errors import UserError
from kontrast.extract import mlp
from kontrast.losses import MemoryBank, estimate_log_z, nce_loss
from kontrast.methods.base import Method, Needs, Progress, Ranks, embedding_std
from kontrast.precision import at_least_float32
from kontrast.registry import METHODS


@dataclass(frozen=True)
class InstDiscParams:
    temperature: float = 0.1  # tau of the non-parametric softmax v.f / tau
    noise_samples: int = 4096  # m
    bank_momentum: float = 0.5  # each memory-bank row moves this far toward its new feature
    proj_dim: int = 128  # width of the features kept in the memory bank
    proximal: float = 0.0  # lambda of the proximal regularisation (0 = off)
    head_bn: bool = True  # BN after the linear head (false: the paper's plain linear head)
    z_estimate: str = checked("step", choices=("step", "once"))  # Monte Carlo Z every step, or "once" (paper)


@METHODS.register("instdisc")
class InstDisc(Method):
    description = "InstDisc: memory bank of every image, NCE over noise samples from it (Wu et al. 2018)"
    recipe = "instdisc"
    Params = InstDiscParams
    # noise drawn alike on every rank (same generator state); every rank's bank updates
    needs = Needs(views=1, processes=True)
    defaults = {"optim": {"lr": 0.03, "lr_batch": 128, "weight_decay": 5e-4}}

    def __init__(self, encoder, params: InstDiscParams, num_samples: int = 0, ranks: Ranks = Ranks()):
        super().__init__(encoder, params, num_samples, ranks)
        self.projector = mlp([encoder.dim, params.proj_dim], last_norm=params.head_bn)
        self.bank = MemoryBank(num_samples, params.proj_dim, params.bank_momentum)
        self.register_buffer("log_z", torch.tensor(float("nan")))  # the last estimate; NaN until the first

    def training_step(self, views: list[torch.Tensor], indices: torch.Tensor | None = None,
                      progress: Progress | None = None) -> dict[str, torch.Tensor]:
        p, n = self.params, self.num_samples
        if indices is None or n == 0:
            raise UserError("instdisc needs each image's dataset index and the training-set size; train it "
                            "with `kontrast train` (the loop passes both)")
        f = self.in_micro_batches(lambda x: self.projector(self.encoder(x)), views[:1])  # [B, D], per sample
        f = F.normalize(at_least_float32(f), dim=1)  # [B, D]
        noise = self.bank.items[self.bank.sample(p.noise_samples)]  # [m, D], shared by the batch
        v = self.bank.items[indices]  # [B, D] own entries, before this step's update
        pos = (f * v).sum(1) / p.temperature  # [B] v_i.f_i / tau
        neg = f @ noise.T / p.temperature  # [B, m] v_j.f_i / tau
        if p.z_estimate == "step" or torch.isnan(self.log_z):  # "once": the first batch's estimate, then fixed
            # eq. 5 on the step's (all ranks') B x m noise scores
            self.log_z.copy_(estimate_log_z(self.ranks.gather(neg.detach()), n))
        loss = nce_loss(pos, neg, self.log_z, n)
        if p.proximal:
            loss = loss + p.proximal * ((f - v) ** 2).sum(1).mean()
        return {"loss": loss, "embedding_std": embedding_std(f), "log_z": self.log_z.clone(),
                "pos_sim": (f.detach() * v).sum(1).mean(),  # cosine of f_i to its own bank entry v_i
                # [BW], [BW, D]: the bank rows after_step moves, every rank's, so all banks stay equal
                "indices": self.ranks.gather(indices), "features": self.ranks.gather(f.detach())}

    def after_step(self, out: dict[str, torch.Tensor], progress: Progress) -> None:
        self.bank.update(out["indices"], out["features"])
