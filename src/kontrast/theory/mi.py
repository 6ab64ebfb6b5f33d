"""InfoNCE lower-bounds mutual information: ``I(x; y) >= log N - L_N`` (CPC), checked where I is known.

van den Oord et al. 2018 (https://arxiv.org/abs/1807.03748, section 2.3 and appendix A.1): with one
positive among ``N`` candidates, ``I(x; y) >= log N - L_N`` for every critic. Poole et al. 2019
(https://arxiv.org/abs/1905.06922) add that the bound can never exceed ``log N``: to measure a large
I, InfoNCE needs ``N > e^I`` candidates.

The pairs are correlated Gaussians: ``x ~ N(0, I_d)``, ``y = rho x + sqrt(1 - rho^2) eps``, so
``I(x; y) = -d/2 log(1 - rho^2)`` exactly. For each ``N`` a separable critic ``f(x)^T g(y)`` (two
MLPs, dot-product scores) is trained with :func:`kontrast.losses.info_nce`,
and ``log N - L_N`` is measured on fresh pairs. The optimal critic, the true log density ratio
``log p(y|x) / p(y)``, is evaluated too: the best any critic can do at that ``N``.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn

from kontrast.errors import UserError
from kontrast.losses.infonce import info_nce


@dataclass(frozen=True)
class MIConfig:
    dim: int = 10  # independent coordinate pairs
    rho: float = 0.8  # correlation of each pair
    ns: tuple[int, ...] = (2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)  # candidates per anchor
    steps: int = 200  # critic training steps per N
    pairs: int = 1024  # pairs per training step, split into pairs // N InfoNCE problems of size N
    lr: float = 3e-3  # Adam
    hidden: int = 128
    embed: int = 32  # critic dimension of f(x) and g(y)
    eval_pairs: int = 32768  # fresh pairs for each estimate
    seed: int = 0


def true_mi(dim: int, rho: float) -> float:
    """``I(x; y) = -d/2 log(1 - rho^2)`` nats for ``d`` independent pairs of correlation ``rho``."""
    return -0.5 * dim * math.log(1 - rho * rho)


def sample(cfg: MIConfig, groups: int, n: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """``groups`` independent batches of ``n`` pairs: x, y each [groups, n, dim]."""
    x = torch.randn(groups, n, cfg.dim, generator=g)
    noise = torch.randn(groups, n, cfg.dim, generator=g)
    return x, cfg.rho * x + math.sqrt(1 - cfg.rho**2) * noise


def optimal_scores(x: torch.Tensor, y: torch.Tensor, rho: float) -> torch.Tensor:
    """``log p(y_j | x_i) / p(y_j)`` up to terms in ``x_i`` alone (a row softmax ignores them).

    ``= (rho x_i.y_j - rho^2 |y_j|^2 / 2) / (1 - rho^2)``: x, y [G, N, d] -> [G, N, N].
    """
    xy = x @ y.transpose(1, 2)  # [G, N, N]
    y2 = (y * y).sum(-1)[:, None, :]  # [G, 1, N]
    return (rho * xy - rho * rho * y2 / 2) / (1 - rho * rho)


def batched_info_nce(scores: torch.Tensor) -> torch.Tensor:
    """Mean InfoNCE over ``G`` independent problems, the positive of row i is column i: [G, N, N] -> scalar."""
    g, n, _ = scores.shape
    positives = torch.arange(n).repeat(g)  # [G*N]
    return info_nce(scores.reshape(g * n, n), positives)


class SeparableCritic(nn.Module):
    """``score(x, y) = f(x)^T g(y)`` with two MLPs ``d -> hidden -> hidden -> embed``."""

    def __init__(self, dim: int, hidden: int, embed: int):
        super().__init__()

        def net() -> nn.Sequential:
            return nn.Sequential(nn.Linear(dim, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                                 nn.Linear(hidden, embed))

        self.f, self.g = net(), net()

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """x, y [G, N, d] -> scores [G, N, N]."""
        fx, gy = self.f(x), self.g(y)  # [G, N, embed]
        return fx @ gy.transpose(1, 2)  # [G, N, N]: similarity.dot of each problem, batched


@torch.no_grad()
def estimate(critic: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], cfg: MIConfig, n: int,
             g: torch.Generator, chunks: int = 8) -> tuple[float, float]:
    """``log N - L_N`` on about ``eval_pairs`` fresh pairs: (mean, standard error over ``chunks`` equal parts)."""
    per_chunk = max(1, cfg.eval_pairs // (n * chunks))  # N-pair problems per chunk
    values = torch.tensor([math.log(n) - float(batched_info_nce(critic(*sample(cfg, per_chunk, n, g))))
                           for _ in range(chunks)], dtype=torch.float64)  # [chunks]
    return float(values.mean()), float(values.std() / math.sqrt(chunks))


def train_critic(cfg: MIConfig, n: int) -> tuple[SeparableCritic, list[float]]:
    """A critic trained with InfoNCE at batch ``N``; returns it and the training estimates ``log N - L``."""
    with torch.random.fork_rng():
        torch.manual_seed(cfg.seed + n)
        critic = SeparableCritic(cfg.dim, cfg.hidden, cfg.embed)
    opt = torch.optim.Adam(critic.parameters(), lr=cfg.lr)
    g = torch.Generator().manual_seed(cfg.seed + 7919 * n)
    history = []
    for _ in range(cfg.steps):
        x, y = sample(cfg, max(1, cfg.pairs // n), n, g)  # [G, N, d] each
        loss = batched_info_nce(critic(x, y))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        history.append(math.log(n) - float(loss.detach()))
    return critic, history


def run_mi(cfg: MIConfig, progress: Callable[[str], None] | None = None) -> dict:
    """Train a critic per N and measure both bounds; a JSON-able summary."""
    if not 0 < abs(cfg.rho) < 1 or cfg.dim < 1:
        raise UserError(f"need 0 < |rho| < 1 and dim >= 1, got rho={cfg.rho}, dim={cfg.dim}")
    if not cfg.ns or min(cfg.ns) < 2:
        raise UserError(f"every N must be >= 2 (one positive and at least one negative), got {cfg.ns}")
    if min(cfg.steps, cfg.pairs, cfg.eval_pairs, cfg.hidden, cfg.embed) < 1 or cfg.lr <= 0:
        raise UserError("steps, pairs, eval_pairs, hidden, embed must be >= 1 and lr > 0")
    truth = true_mi(cfg.dim, cfg.rho)
    rows, histories = [], {}
    for n in cfg.ns:
        start = time.perf_counter()
        critic, history = train_critic(cfg, n)
        g = torch.Generator().manual_seed(cfg.seed + 104729 + n)  # evaluation pairs never seen in training
        trained, trained_se = estimate(critic, cfg, n, g)
        best, best_se = estimate(lambda x, y: optimal_scores(x, y, cfg.rho), cfg, n, g)
        rows.append({"n": n, "log_n": math.log(n), "estimate": trained, "estimate_stderr": trained_se,
                     "optimal_critic": best, "optimal_critic_stderr": best_se, "true_mi": truth,
                     "seconds": time.perf_counter() - start})
        histories[n] = history
        if progress:
            progress(f"N={n:5d}  log N={math.log(n):6.3f}  trained critic {trained:6.3f}  "
                     f"optimal critic {best:6.3f}  true I={truth:.3f}")
    return {"config": asdict(cfg), "true_mi": truth, "rows": rows,
            "train_curves": {str(n): h for n, h in histories.items()}}


def plot_mi(summary: dict, path: str | Path) -> Path:
    """The estimates against log N (log-scale x axis), with the true I and the log N ceiling."""
    from kontrast.plotting import pyplot, save

    plt = pyplot()
    rows = summary["rows"]
    ns = [r["n"] for r in rows]
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    ax.plot(ns, [r["log_n"] for r in rows], ":", color="C7", label="log N (ceiling of any InfoNCE bound)")
    ax.axhline(summary["true_mi"], color="k", lw=1, label=f"true I(x; y) = {summary['true_mi']:.3f} nats")
    ax.plot(ns, [r["optimal_critic"] for r in rows], "s--", color="C1", ms=4, label="log N - L, optimal critic")
    ax.plot(ns, [r["estimate"] for r in rows], "o-", color="C0", ms=4, label="log N - L, trained critic")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("N (candidates per anchor)")
    ax.set_ylabel("nats")
    cfg = summary["config"]
    ax.set_title(f"InfoNCE bound on correlated Gaussians (d={cfg['dim']}, rho={cfg['rho']})")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return save(fig, path)


def write_mi(cfg: MIConfig, out: str | Path, log: Callable[[str], None] = print) -> dict:
    """Run, write ``out/mi.json`` and ``out/mi.png``, log the table; return the summary."""
    out = Path(out)
    summary = run_mi(cfg, progress=log)
    out.mkdir(parents=True, exist_ok=True)
    (out / "mi.json").write_text(json.dumps(summary, indent=1))
    plot_mi(summary, out / "mi.png")
    log(f"wrote {out / 'mi.json'} and {out / 'mi.png'}")
    return summary
