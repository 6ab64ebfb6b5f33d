"""The spectral experiment's report: its four-panel figure, ``spectral.json`` and the logged table.

:mod:`kontrast.theory.spectral` runs and measures; this module turns a
:class:`~kontrast.theory.spectral.SpectralResult` into what ``kontrast theory spectral`` writes.
Presentation only: no measurement is made here, so the experiment module stays about the
experiment. matplotlib is imported only when a figure is drawn (:mod:`kontrast.plotting`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import torch

from kontrast.theory.spectral import SpectralConfig, SpectralResult, run_spectral

LOSS_LABELS = {
    "spectral": "spectral contrastive (HaoChen)",
    "infonce": "InfoNCE, Gaussian kernel",
    "laplacian": "Kernel-InfoNCE, Laplacian (gamma=1)",
    "gamma": "Kernel-InfoNCE, gamma-kernel",
    "mixture": "Kernel-InfoNCE, Gaussian + Laplacian",
}


def plot_spectral(result: SpectralResult, path: str | Path) -> Path:
    """Four panels: the world coloured by spectral clustering, the eigenvalues, alignment and ARI over steps."""
    from kontrast.plotting import pyplot, save

    plt = pyplot()
    cfg, world = result.cfg, result.world
    fig, ax = plt.subplots(2, 2, figsize=(11, 8.5))
    x = world.features
    ax[0, 0].scatter(x[:, 0], x[:, 1], c=result.truth, cmap="tab10", s=12, vmin=0, vmax=9)
    ax[0, 0].set_title(f"world: n={world.n}, colour = spectral clustering (k={cfg.k})")
    ax[0, 0].set_aspect("equal")
    vals = [float(v) for v in result.eigenvalues]
    ax[0, 1].bar(range(1, len(vals) + 1), vals, color=["C0"] * cfg.k + ["C7"] * (len(vals) - cfg.k))
    ax[0, 1].set_title("eigenvalues of D^-1/2 pi D^-1/2 (top k in blue)")
    ax[0, 1].set_xlabel("index")
    styles = {"table": "-", "mlp": "--"}
    for i, name in enumerate(cfg.losses):
        for enc in cfg.encoders:
            runs = [c for c in result.curves if c.loss == name and c.encoder == enc]
            steps = runs[0].steps
            for panel, key in ((ax[1, 0], "alignment"), (ax[1, 1], "ari")):
                mean = torch.tensor([getattr(c, key) for c in runs]).mean(0)  # [T] over seeds
                panel.plot(steps, mean.tolist(), styles.get(enc, ":"), color=f"C{i}",
                           label=f"{LOSS_LABELS[name]} / {enc}")
    ax[1, 0].set_title("alignment with eigenvectors 2..k (1 = equal up to affine map)")
    ax[1, 1].set_title("ARI: k-means on embeddings vs spectral clustering")
    for panel in (ax[1, 0], ax[1, 1]):
        panel.set_xlabel("step")
        panel.set_ylim(-0.02, 1.02)
        panel.grid(alpha=0.3)
    ax[1, 0].legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    return save(fig, path)


def write_spectral(cfg: SpectralConfig, out: str | Path, log: Callable[[str], None] = print) -> dict:
    """Run the experiment, write ``out/spectral.json`` and ``out/spectral.png``, log a table; return the summary."""
    out = Path(out)
    result = run_spectral(cfg, progress=log)
    summary = result.summary()
    out.mkdir(parents=True, exist_ok=True)
    (out / "spectral.json").write_text(json.dumps(summary, indent=1))
    plot_spectral(result, out / "spectral.png")
    log(f"eigenvalues {', '.join(f'{v:.3f}' for v in summary['eigenvalues'][: cfg.k + 2])} ...; "
        f"spectral clustering vs planted clusters: ARI {summary['ari_spectral_vs_planted']:.3f}")
    log(f"{'encoder':7s} {'loss':10s} {'alignment':>16s} {'ARI':>16s}")
    for row in summary["final"]:
        log(f"{row['encoder']:7s} {row['loss']:10s} {row['alignment']:9.4f} ± {row['alignment_std']:.4f}"
            f" {row['ari']:9.4f} ± {row['ari_std']:.4f}")
    log(f"wrote {out / 'spectral.json'} and {out / 'spectral.png'}")
    return summary
