"""Diagnostics of a representation: is it aligned, uniform, collapsed, low-rank, clustered?

* alignment and uniformity, Wang & Isola 2020 (https://arxiv.org/abs/2005.10242), on
  L2-normalised embeddings: ``align = E |f(x) - f(x+)|^alpha`` over positive pairs (0 best) and
  ``uniform = log E exp(-t |f(x) - f(y)|^2)`` over distinct samples (from 0, everything in one
  point, down to about -4 for t=2 and points spread over a high-dimensional sphere);
* std of L2-normalised embeddings, SimSiam (Chen & He 2021, section 4.1): 0 when collapsed,
  ``1/sqrt(d)`` for isotropic embeddings;
* effective rank of the covariance, Roy & Vetterli 2007: ``exp(entropy of its normalised
  eigenvalues)``, from 1 (one direction) to ``d`` (isotropic); dimensional collapse lowers it;
* the spectrum of the batch similarity graph ``W_ij = exp(cos(z_i, z_j) / tau)`` (``i != j``) of
  two views per image: the graph InfoNCE clusters (Tan et al. 2023, https://arxiv.org/abs/2303.15103).
  Eigenvalues of ``D^(-1/2) W D^(-1/2)`` near 1 count well-separated clusters.

:func:`diagnose_run` computes them for a trained run's encoder on images; the rest are plain
functions of embeddings, usable anywhere.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from kontrast.errors import UserError
from kontrast.evaluate.clustering import normalized_adjacency
from kontrast.methods.base import embedding_std


def alignment(z1: torch.Tensor, z2: torch.Tensor, alpha: float = 2.0) -> float:
    """Wang & Isola's ``L_align``: mean ``|f(x) - f(x+)|^alpha`` of normalised pairs ``[N, D], [N, D]``."""
    a, b = F.normalize(z1.double(), dim=1), F.normalize(z2.double(), dim=1)  # [N, D]
    return float((a - b).norm(dim=1).pow(alpha).mean())


def uniformity(z: torch.Tensor, t: float = 2.0) -> float:
    """Wang & Isola's ``L_uniform``: ``log mean_{i != j} exp(-t |f(x_i) - f(x_j)|^2)`` of ``[N, D]``.

    0 is its maximum (every point equal); lower is more uniform.
    """
    n = len(z)
    if n < 2:
        raise ValueError("uniformity needs at least 2 embeddings")
    u = F.normalize(z.double(), dim=1)  # [N, D]
    d2 = torch.cdist(u, u).pow(2)  # [N, N]
    off = ~torch.eye(n, dtype=torch.bool)  # [N, N] distinct pairs only
    return float(torch.logsumexp(-t * d2[off], dim=0) - math.log(n * (n - 1)))


def normalized_std(z: torch.Tensor) -> float:
    """Mean per-dimension std of L2-normalised embeddings ``[N, D]`` (``1/sqrt(D)`` isotropic, 0 collapsed)."""
    return float(embedding_std(z))


def covariance_spectrum(z: torch.Tensor) -> torch.Tensor:
    """Eigenvalues of the embeddings' covariance, largest first: ``[N, D] -> [D]`` (float64, >= 0)."""
    x = z.double() - z.double().mean(0)  # [N, D]
    cov = x.T @ x / max(len(z) - 1, 1)  # [D, D]
    return torch.linalg.eigvalsh(cov).flip(0).clamp_min(0)


def effective_rank(z: torch.Tensor) -> float:
    """``exp(H(p))`` with ``p`` the covariance eigenvalues over their sum; 0 when ``z`` does not vary at all."""
    values = covariance_spectrum(z)  # [D]
    total = values.sum()
    if total <= 0:
        return 0.0
    p = values[values > 0] / total
    return float(torch.exp(-(p * p.log()).sum()))


def similarity_graph_spectrum(z: torch.Tensor, temperature: float = 0.5) -> torch.Tensor:
    """Eigenvalues (largest first) of ``D^(-1/2) W D^(-1/2)``, ``W_ij = exp(cos(z_i, z_j) / tau)``, ``W_ii = 0``.

    ``[N, D] -> [N]`` float64; the largest is 1.
    """
    u = F.normalize(z.double(), dim=1)  # [N, D]
    w = torch.exp((u @ u.T - 1) / temperature)  # [N, N]; the shift by -1 cancels in the normalisation
    w.fill_diagonal_(0)
    return torch.linalg.eigvalsh(normalized_adjacency(w)).flip(0)


def positive_mass(z1: torch.Tensor, z2: torch.Tensor, temperature: float = 0.5) -> float:
    """Mean share of a view's similarity-graph weight that falls on its own other view (chance ``1/(2N-1)``).

    Over the ``2N`` views ``cat(z1, z2)`` with ``W`` as in :func:`similarity_graph_spectrum`; this is
    ``exp(-NT-Xent)`` per row, averaged.
    """
    n = len(z1)
    u = F.normalize(torch.cat([z1, z2]).double(), dim=1)  # [2N, D]
    logits = u @ u.T / temperature  # [2N, 2N]
    logits.fill_diagonal_(float("-inf"))
    partner = (torch.arange(2 * n) + n) % (2 * n)  # [2N]
    return float(logits.softmax(1)[torch.arange(2 * n), partner].mean())


def diagnose_embeddings(z1: torch.Tensor, z2: torch.Tensor, clean: torch.Tensor, *, temperature: float = 0.5,
                        graph_size: int = 256) -> dict:
    """Every diagnostic from two views ``z1, z2 [N, D]`` and un-augmented ``clean [N, D]`` embeddings.

    The similarity graph uses the first ``graph_size`` images (``2 * graph_size`` views).
    """
    b = min(graph_size, len(z1))
    cov = covariance_spectrum(clean)
    graph = similarity_graph_spectrum(torch.cat([z1[:b], z2[:b]]), temperature)
    return {
        "num_images": len(clean),
        "dim": clean.shape[1],
        "alignment": alignment(z1, z2),
        "uniformity": uniformity(clean),
        "normalized_std": normalized_std(clean),
        "isotropic_std": 1 / math.sqrt(clean.shape[1]),
        "effective_rank": effective_rank(clean),
        "positive_mass": positive_mass(z1[:b], z2[:b], temperature),
        "temperature": temperature,
        "graph_views": 2 * b,
        "covariance_eigenvalues": [float(v) for v in cov],
        "graph_eigenvalues": [float(v) for v in graph],
    }


@torch.no_grad()
def encode_views(encoder: torch.nn.Module, images: torch.Tensor, specs, *, seed: int = 0, batch_size: int = 256,
                 device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Encoder features of two augmented views and of the clean image: uint8 ``[N, 3, H, W]`` -> 3 x ``[N, dim]``."""
    from kontrast.augment import eval_view, make_views
    from kontrast.evaluate.features import eval_mode

    gen = torch.Generator(device=device).manual_seed(seed)
    pairs = (tuple(specs) * 2)[:2]  # a one-view recipe gives two draws of that view
    out: tuple[list, list, list] = ([], [], [])
    with eval_mode(encoder):
        for start in range(0, len(images), batch_size):
            batch = images[start : start + batch_size].to(device)
            views = [*make_views(batch, pairs, gen), eval_view(batch, pairs[0])]  # 3 x [B, 3, S, S]
            for chunks, view in zip(out, views):
                chunks.append(encoder(view).float().cpu())  # [B, dim]
    return tuple(torch.cat(chunks) for chunks in out)


def diagnose_run(path: str | Path, data: str | None = None, *, split: str = "test", limit: int = 512,
                 temperature: float = 0.5, graph_size: int = 256, seed: int = 0, device: str = "cpu",
                 out: str | Path | None = None, log: Callable[[str], None] = print) -> dict:
    """Diagnostics of a run's encoder (pooled features, never the head) on ``limit`` images of ``data``.

    Writes ``out/diagnostics.json`` and ``out/diagnostics.png`` (default ``out``: ``RUN/diagnostics``).
    """
    from kontrast.data import load_images
    from kontrast.evaluate.run import load_run, run_views

    if limit < 2 or graph_size < 2 or temperature <= 0:
        raise UserError("diagnose needs --limit >= 2, --graph-size >= 2 and --temperature > 0")
    cfg, method, ckpt = load_run(path)
    source = data or cfg.data.source
    images = load_images(source, split, size=cfg.data.size, cache_dir=cfg.data.cache_dir,
                         skip_bad_images=cfg.data.skip_bad_images).subset(limit, seed=seed).x
    if len(images) < 2:
        raise UserError(f"{source} ({split}) has {len(images)} image; diagnose needs at least 2")
    z1, z2, clean = encode_views(method.encoder.to(device), images, run_views(ckpt, cfg, method), seed=seed,
                                 device=device)
    result = {"checkpoint": str(ckpt), "method": cfg.method.name, "data": str(source), "split": split,
              **diagnose_embeddings(z1, z2, clean, temperature=temperature, graph_size=graph_size)}
    run_dir = ckpt.parent.parent
    out = Path(out) if out is not None else run_dir / "diagnostics"
    out.mkdir(parents=True, exist_ok=True)
    (out / "diagnostics.json").write_text(json.dumps(result, indent=1))
    plot_diagnostics(result, out / "diagnostics.png")
    log(summary_line(result))
    log(f"wrote {out / 'diagnostics.json'} and {out / 'diagnostics.png'}")
    return result


def summary_line(r: dict) -> str:
    """The scalar diagnostics on one line."""
    top = ", ".join(f"{v:.3f}" for v in r["graph_eigenvalues"][:5])
    return (f"{r['method']} on {r['data']} ({r['num_images']} images, dim {r['dim']}): "
            f"alignment {r['alignment']:.4f}, uniformity {r['uniformity']:.4f}, "
            f"std {r['normalized_std']:.4f} (isotropic {r['isotropic_std']:.4f}), "
            f"effective rank {r['effective_rank']:.1f}, positive mass {r['positive_mass']:.4f}, "
            f"graph eigenvalues {top} ...")


def plot_diagnostics(r: dict, path: str | Path) -> Path:
    """Covariance spectrum (log scale) and the batch similarity graph's top eigenvalues."""
    from kontrast.plotting import pyplot, save

    plt = pyplot()
    fig, ax = plt.subplots(1, 2, figsize=(11, 4))
    cov = torch.tensor(r["covariance_eigenvalues"])
    cov = cov / cov.sum() if cov.sum() > 0 else cov
    ax[0].semilogy(range(1, len(cov) + 1), cov.clamp_min(1e-12))
    ax[0].set_title(f"covariance eigenvalues / sum (effective rank {r['effective_rank']:.1f} of {r['dim']})")
    ax[0].set_xlabel("index")
    graph = r["graph_eigenvalues"][:64]
    ax[1].plot(range(1, len(graph) + 1), graph, "o-", ms=3)
    ax[1].set_title(f"similarity graph of {r['graph_views']} views, tau={r['temperature']}: top eigenvalues")
    ax[1].set_xlabel("index")
    for a in ax:
        a.grid(alpha=0.3)
    fig.suptitle(f"{r['method']}: alignment {r['alignment']:.3f}, uniformity {r['uniformity']:.3f}, "
                 f"std {r['normalized_std']:.3f}", fontsize=10)
    fig.tight_layout()
    return save(fig, path)
