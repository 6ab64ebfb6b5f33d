"""Contrastive learning is spectral clustering: train on a known augmentation graph, compare with the truth.

HaoChen et al. 2021 (https://arxiv.org/abs/2106.04156, Theorem 3.2): the spectral contrastive loss
is minimised exactly by the top-k eigenvectors of the normalised adjacency, up to an invertible
linear map. Tan et al. 2023 (https://arxiv.org/abs/2303.15103): InfoNCE with a Gaussian kernel,
and Kernel-InfoNCE with other exponential kernels (Laplacian, ``exp(-|a-b|^gamma / tau)``,
mixtures), perform spectral clustering on the similarity graph.

:func:`run_spectral` trains a free embedding table and a small MLP with each loss on positive
pairs sampled from ``pi`` (:mod:`kontrast.theory.world`) and reports, over training:

* **alignment**: mean squared cosine of the principal angles between the non-trivial top
  eigenvectors ``U_2..U_k`` and the span of the embeddings plus a constant column (k-means and
  linear probes do not see a shift), in ``L2(pi)``: embedding rows scaled by ``sqrt(pi(x))``.
  1 means the embeddings are ``D^(-1/2) U_k`` up to an affine map; a random one scores about ``d/n``.
* **ARI**: adjusted Rand index between k-means on the embeddings and spectral clustering.

The figure, ``spectral.json`` and the logged table of ``kontrast theory spectral`` are made by
:mod:`kontrast.theory.spectral_report`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from kontrast.errors import UserError
from kontrast.evaluate.clustering import adjusted_rand_index, kmeans
from kontrast.losses.infonce import info_nce
from kontrast.losses.spectral import spectral_contrastive_loss
from kontrast.similarity import kernel_scores, simple_sum_scores
from kontrast.theory.world import World, make_world, sample_pairs, spectral_clustering, spectral_embedding

ENCODERS = ("table", "mlp")


@dataclass(frozen=True)
class SpectralConfig:
    """One experiment: the world, the losses and encoders to train, and the optimisation."""

    n: int = 240  # objects
    k: int = 4  # planted clusters = eigenvectors compared = embedding dim
    dim: int = 2  # object features (what the MLP sees)
    separation: float = 3.0  # radius of the circle of cluster prototypes
    spread: float = 1.0  # std of an object around its prototype
    bandwidth: float = 1.0  # augmentation kernel length scale
    losses: tuple[str, ...] = ("spectral", "infonce", "laplacian", "gamma", "mixture")
    encoders: tuple[str, ...] = ENCODERS
    steps: int = 800
    batch: int = 256  # positive pairs per step
    lr: float = 0.03  # Adam for the table, cosine decay to 0
    mlp_lr: float = 0.01  # Adam for the MLP (at 0.03 the spectral loss can kill an output direction)
    tau: float = 0.5  # temperature of every kernel
    gamma: float = 0.5  # exponent of the "gamma" kernel
    mu: float = 100.0  # spectral loss norm cap; large enough never to bind here
    hidden: int = 64  # MLP width
    eval_every: int = 25
    seed: int = 0  # world and first training seed
    seeds: int = 1  # training runs per (encoder, loss), seeds seed, seed+1, ...


def _infonce_loss(scores: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]):
    """Symmetric InfoNCE on L2-normalised embeddings, pair i's partner is column i."""

    def loss(z1: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
        a, b = F.normalize(z1, dim=1), F.normalize(z2, dim=1)  # [B, d] on the sphere
        s = scores(a, b)  # [B, B]
        target = torch.arange(len(a))  # [B]
        return (info_nce(s, target) + info_nce(s.T, target)) / 2

    return loss


def make_losses(cfg: SpectralConfig) -> dict[str, tuple[Callable, bool]]:
    """name -> (loss(z1, z2), whether the loss sees L2-normalised embeddings)."""
    t = cfg.tau
    return {
        "spectral": (lambda z1, z2: spectral_contrastive_loss(z1, z2, mu=cfg.mu), False),
        "infonce": (_infonce_loss(lambda a, b: kernel_scores(a, b, gamma=2.0, tau=t)), True),
        "laplacian": (_infonce_loss(lambda a, b: kernel_scores(a, b, gamma=1.0, tau=t)), True),
        "gamma": (_infonce_loss(lambda a, b: kernel_scores(a, b, gamma=cfg.gamma, tau=t)), True),
        "mixture": (_infonce_loss(lambda a, b: simple_sum_scores(a, b, ((2.0, t), (1.0, t)))), True),
    }


def subspace_alignment(a: torch.Tensor, b: torch.Tensor) -> float:
    """Mean squared cosine of the principal angles between ``span(b)`` and ``span(a)``.

    ``a: [n, p]``, ``b: [n, q]`` -> ``|Q_b^T Q_a|_F^2 / rank(b)`` in [0, 1]: 1 when ``span(b)``
    lies inside ``span(a)``, 0 when orthogonal (Björck & Golub's principal angles).
    """
    qa, qb = _basis(a.double()), _basis(b.double())
    if qb.shape[1] == 0:
        raise ValueError("subspace_alignment: b spans nothing (all zero)")
    return float((qb.T @ qa).pow(2).sum() / qb.shape[1])  # [q', p'] -> scalar


def _basis(x: torch.Tensor) -> torch.Tensor:
    """Orthonormal basis of the column span (rank-revealing SVD): [n, p] -> [n, r]."""
    u, s, _ = torch.linalg.svd(x, full_matrices=False)
    rank = int((s > s.max() * max(x.shape) * torch.finfo(x.dtype).eps).sum()) if s.numel() and s.max() > 0 else 0
    return u[:, :rank]


def spectral_alignment(embedding: torch.Tensor, world: World, eigvecs: torch.Tensor) -> float:
    """Alignment of embeddings ``[n, d]`` with the top eigenvectors ``U_k [n, k]``, in ``L2(pi)``.

    The spectral loss's optimum is ``D^(-1/2) U_k M``; scaling rows by ``sqrt(pi(x))`` turns it into
    ``U_k M``. ``U_1 = sqrt(pi)`` is what a constant embedding gives, so any embedding with a bias has
    it: the score is :func:`subspace_alignment` of ``sqrt(D) [1, embedding]`` and ``U_2..U_k``
    (a random ``d``-dim embedding scores about ``d / n``).
    """
    root = world.degrees.sqrt()[:, None]  # [n, 1]
    e = embedding.double()
    e = torch.cat([torch.ones_like(e[:, :1]), e], dim=1)  # [n, d+1] affine span
    return subspace_alignment(root * e, eigvecs[:, 1:])  # against U_2..U_k


@dataclass
class Curve:
    """One training run's measurements at ``steps``."""

    loss: str
    encoder: str
    seed: int
    steps: list[int] = field(default_factory=list)
    alignment: list[float] = field(default_factory=list)
    ari: list[float] = field(default_factory=list)
    train_loss: list[float] = field(default_factory=list)  # mean since the previous measurement
    ari_planted: float = 0.0  # final k-means vs the planted clusters (for context)
    seconds: float = 0.0
    gram_eigenvalues: list[float] = field(default_factory=list)  # of F^T F, F = sqrt(D) z: Lambda_k at the optimum
    embedding: torch.Tensor | None = field(default=None, repr=False)  # final [n, k], as the loss sees it

    def to_json(self) -> dict:
        return {k: v for k, v in asdict(self).items() if k != "embedding"}


def _measure(z: torch.Tensor, normalised: bool, world: World, eigvecs: torch.Tensor, truth: torch.Tensor,
             k: int, seed: int) -> tuple[float, float, torch.Tensor]:
    z = z.detach().double()
    if normalised:
        z = F.normalize(z, dim=1)  # what the kernel compares
    labels = kmeans(z, k, seed=seed)
    return spectral_alignment(z, world, eigvecs), adjusted_rand_index(labels, truth), labels


def _encoder(name: str, cfg: SpectralConfig, features: torch.Tensor, seed: int):
    """(module, function returning the embeddings of all n objects [n, k])."""
    if name == "table":
        g = torch.Generator().manual_seed(seed)
        table = nn.Parameter(0.1 * torch.randn(len(features), cfg.k, generator=g))  # [n, k] free embeddings
        return nn.ParameterList([table]), lambda: table
    if name == "mlp":
        with torch.random.fork_rng():  # seeded init without touching the caller's global RNG
            torch.manual_seed(seed)
            module = nn.Sequential(nn.Linear(features.shape[1], cfg.hidden), nn.ReLU(),
                                   nn.Linear(cfg.hidden, cfg.hidden), nn.ReLU(), nn.Linear(cfg.hidden, cfg.k))
        x = ((features - features.mean(0)) / features.std(0)).float()  # [n, dim] standardised
        return module, lambda: module(x)
    raise UserError(f"unknown encoder {name!r}; choose from: {', '.join(ENCODERS)}")


def train_one(loss_name: str, encoder: str, world: World, cfg: SpectralConfig, eigvecs: torch.Tensor,
              truth: torch.Tensor, seed: int) -> Curve:
    """Train one (loss, encoder) pair on pairs sampled from ``pi``; measure every ``eval_every`` steps."""
    losses = make_losses(cfg)
    if loss_name not in losses:
        raise UserError(f"unknown loss {loss_name!r}; choose from: {', '.join(losses)}")
    loss_fn, normalised = losses[loss_name]
    module, forward = _encoder(encoder, cfg, world.features, seed)
    opt = torch.optim.Adam(module.parameters(), lr=cfg.lr if encoder == "table" else cfg.mlp_lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5 * (1 + math.cos(math.pi * s / cfg.steps)))
    g = torch.Generator().manual_seed(seed + 10_000)
    curve, start, running = Curve(loss_name, encoder, seed), time.perf_counter(), []
    for step in range(cfg.steps + 1):
        if step % cfg.eval_every == 0 or step == cfg.steps:
            with torch.no_grad():
                align, ari, labels = _measure(forward(), normalised, world, eigvecs, truth, cfg.k, seed)
            curve.steps.append(step)
            curve.alignment.append(align)
            curve.ari.append(ari)
            curve.train_loss.append(sum(running) / len(running) if running else float("nan"))
            running = []
        if step == cfg.steps:
            break
        i, j = sample_pairs(world, cfg.batch, g)  # [B], [B] positive pairs ~ pi
        z = forward()  # [n, k]
        loss = loss_fn(z[i], z[j])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        running.append(float(loss.detach()))
    curve.ari_planted = adjusted_rand_index(labels, world.labels)
    with torch.no_grad():
        z = forward().detach().double()
        curve.embedding = F.normalize(z, dim=1) if normalised else z
        f = world.degrees.sqrt()[:, None] * curve.embedding  # [n, k]
        curve.gram_eigenvalues = torch.linalg.eigvalsh(f.T @ f).flip(0).tolist()  # [k] largest first
    curve.seconds = time.perf_counter() - start
    return curve


@dataclass
class SpectralResult:
    cfg: SpectralConfig
    world: World
    eigenvalues: torch.Tensor  # [<= 3k] largest first
    truth: torch.Tensor  # [n] spectral clustering
    curves: list[Curve]

    def table(self) -> list[dict]:
        """One row per (encoder, loss): final alignment and ARI, mean and std over seeds."""
        rows = []
        for enc in self.cfg.encoders:
            for name in self.cfg.losses:
                runs = [c for c in self.curves if c.encoder == enc and c.loss == name]
                align = torch.tensor([c.alignment[-1] for c in runs], dtype=torch.float64)
                ari = torch.tensor([c.ari[-1] for c in runs], dtype=torch.float64)
                rows.append({"encoder": enc, "loss": name, "alignment": float(align.mean()),
                             "alignment_std": float(align.std()) if len(runs) > 1 else 0.0,
                             "ari": float(ari.mean()), "ari_std": float(ari.std()) if len(runs) > 1 else 0.0,
                             "seeds": len(runs)})
        return rows

    def summary(self) -> dict:
        k = self.cfg.k
        return {
            "config": asdict(self.cfg),
            "eigenvalues": [float(v) for v in self.eigenvalues],
            "eigengap": float(self.eigenvalues[k - 1] - self.eigenvalues[k]) if len(self.eigenvalues) > k else None,
            "ari_spectral_vs_planted": adjusted_rand_index(self.truth, self.world.labels),
            "chance_alignment": k / self.world.n,
            "final": self.table(),
            "runs": [c.to_json() for c in self.curves],
        }


def run_spectral(cfg: SpectralConfig, progress: Callable[[str], None] | None = None) -> SpectralResult:
    """The whole experiment: ground truth, then every (encoder, loss, seed) run."""
    if cfg.steps < 1 or cfg.batch < 2 or cfg.eval_every < 1 or cfg.seeds < 1:
        raise UserError("the spectral experiment needs steps >= 1, batch >= 2, eval_every >= 1 and seeds >= 1")
    if min(cfg.lr, cfg.mlp_lr, cfg.tau, cfg.mu) <= 0 or not 0 < cfg.gamma <= 2:
        raise UserError(f"need lr, tau, mu > 0 and 0 < gamma <= 2, got lr={cfg.lr}, tau={cfg.tau}, "
                        f"mu={cfg.mu}, gamma={cfg.gamma}")
    known = make_losses(cfg)
    for kind, names, choices in (("loss", cfg.losses, known), ("encoder", cfg.encoders, ENCODERS)):
        bad = [x for x in names if x not in choices]
        if bad or not names:
            raise UserError(f"unknown {kind} {', '.join(bad) or '(none given)'}; choose from: {', '.join(choices)}")
    world = make_world(cfg.n, cfg.k, cfg.dim, cfg.separation, cfg.spread, cfg.bandwidth, cfg.seed)
    values, vectors = spectral_embedding(world.adjacency, min(cfg.n, 3 * cfg.k))
    truth = spectral_clustering(world.adjacency, cfg.k, seed=cfg.seed)
    curves = []
    for enc in cfg.encoders:
        for name in cfg.losses:
            for seed in range(cfg.seed, cfg.seed + cfg.seeds):
                c = train_one(name, enc, world, cfg, vectors[:, : cfg.k], truth, seed)
                curves.append(c)
                if progress:
                    progress(f"{enc:5s} {name:9s} seed {seed}: alignment {c.alignment[-1]:.4f}, "
                             f"ARI {c.ari[-1]:.4f} ({c.seconds:.1f} s)")
    return SpectralResult(cfg, world, values, truth, curves)
