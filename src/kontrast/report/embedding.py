"""The numbers behind the report's pictures: which images, their 2-D map, their neighbours, their views.

Everything here returns tensors (CPU) and strings; :mod:`kontrast.report.figures` draws them.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from kontrast.config import Config
from kontrast.data import Samples, load_images
from kontrast.errors import UserError


def report_samples(cfg: Config, limit: int, seed: int) -> tuple[Samples, torch.Tensor]:
    """At most ``limit`` images of the run's data, train and test together, and which are test (bool ``[N]``).

    Half from the test split when the source has one (an unlabelled folder or a paired file without labelled
    test rows has none: :func:`load_images` raises :class:`UserError`), the rest from the train split; each part
    a fixed random subset.
    """
    kw = dict(size=cfg.data.size, cache_dir=cfg.data.cache_dir, skip_bad_images=cfg.data.skip_bad_images)
    train = load_images(cfg.data.source, "train", **kw)
    try:
        test = load_images(cfg.data.source, "test", **kw)
    except UserError:
        test = None
    n_test = 0 if test is None else min(len(test), limit // 2)
    n_train = min(len(train), limit - n_test)
    n_test = 0 if test is None else min(len(test), limit - n_train)
    parts = [train.subset(n_train, seed=seed)] + ([test.subset(n_test, seed=seed)] if n_test else [])
    labelled = all(p.labels is not None for p in parts)
    data = Samples(torch.cat([p.x for p in parts]), torch.cat([p.labels for p in parts]) if labelled else None,
                   train.classes if labelled else [], cfg.data.source, [path for p in parts for path in p.paths])
    is_test = torch.arange(len(data)) >= len(parts[0])  # [N]
    return data, is_test


def spread_rows(features: torch.Tensor, labels: torch.Tensor | None, n: int) -> list[int]:
    """``n`` rows that cover the data: one per class in turn (labelled), else each the farthest (cosine) from
    those already taken, starting at row 0 (unlabelled): queries and previews not all from one class."""
    n = min(n, len(features))
    if labels is not None:
        by_class = [(labels == c).nonzero().flatten().tolist() for c in labels.unique(sorted=True).tolist()]
        rounds = [rows[k] for k in range(max(map(len, by_class), default=0)) for rows in by_class if k < len(rows)]
        return rounds[:n]
    z = torch.nn.functional.normalize(features.float(), dim=1)  # [N, D]
    taken = [0] if n else []
    nearest = z @ z[0] if n else None  # [N] similarity to the closest row taken
    while len(taken) < n:
        row = int(nearest.argmin())
        taken.append(row)
        nearest = torch.maximum(nearest, z @ z[row])
    return taken


def project_2d(features: torch.Tensor, seed: int = 0) -> tuple[torch.Tensor, str]:
    """``[N, D]`` features -> ``[N, 2]`` points and the projection's name: "UMAP" when ``umap`` is
    importable (cosine metric), else "PCA" (``torch.pca_lowrank``, centred)."""
    features = features.float()
    n = len(features)
    if n < 2:
        return torch.zeros(n, 2), "PCA"
    try:
        import umap  # optional: not a kontrast dependency
    except ImportError:
        umap = None
    if umap is not None and n > 3:
        reducer = umap.UMAP(n_components=2, n_neighbors=min(15, n - 1), metric="cosine", random_state=seed)
        return torch.as_tensor(reducer.fit_transform(features.numpy()), dtype=torch.float32), "UMAP"
    torch.manual_seed(seed)  # pca_lowrank draws a random sketch from the global generator
    q = min(2, *features.shape)
    centred = features - features.mean(dim=0)  # [N, D]
    _, _, v = torch.pca_lowrank(centred, q=q, center=False)  # v: [D, q]
    points = centred @ v  # [N, q]
    if q < 2:
        points = torch.cat([points, torch.zeros(n, 2 - q)], dim=1)  # [N, 2]
    return points, "PCA"


def nearest_neighbours(features: torch.Tensor, queries: Sequence[int], k: int = 5) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``k`` rows most cosine-similar to each query row, itself excluded.

    Returns (indices ``[Q, k]``, similarities ``[Q, k]``), best first; ``k`` is capped at N - 1.
    """
    z = torch.nn.functional.normalize(features.float(), dim=1)  # [N, D]
    q = torch.as_tensor(list(queries), dtype=torch.long)  # [Q]
    sims = z[q] @ z.T  # [Q, N]
    sims[torch.arange(len(q)), q] = float("-inf")  # never one's own neighbour
    k = max(0, min(k, len(z) - 1))
    best = sims.topk(k, dim=1)
    return best.indices, best.values


def denormalise(views: torch.Tensor, mean: Sequence[float], std: Sequence[float]) -> torch.Tensor:
    """Normalised float views ``[B, 3, S, S]`` -> displayable ``[B, 3, S, S]`` in [0, 1]."""
    m = torch.as_tensor(mean, dtype=views.dtype)[:, None, None]  # [3, 1, 1]
    s = torch.as_tensor(std, dtype=views.dtype)[:, None, None]  # [3, 1, 1]
    return (views * s + m).clamp_(0, 1)


def preview_views(images: torch.Tensor, specs: Sequence, seed: int = 0) -> list[torch.Tensor]:
    """Random views of uint8 images ``[B, 3, H, W]`` as training draws them, for display.

    One view per spec of the recipe (a one-view recipe is drawn twice, so there is a pair to
    compare); each ``[B, 3, S_v, S_v]`` in [0, 1] (multi-crop's small crops are smaller).
    """
    from kontrast.augment import make_views

    specs = tuple(specs)
    if len(specs) == 1:
        specs = specs * 2
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        views = make_views(images.cpu(), specs, gen)  # len(specs) x [B, 3, S, S]
    return [denormalise(v.float(), spec.mean, spec.std) for v, spec in zip(views, specs)]


def caption_of(data: Samples, row: int, width: int = 14) -> str:
    """What to print under image ``row``: its class name, else its caption (cut to ``width``), else ""."""
    if data.labels is not None:
        label = int(data.labels[row])
        return data.classes[label] if label < len(data.classes) else str(label)
    if data.captions is not None:
        text = data.captions[row]
        return text if len(text) <= width else text[: width - 1] + "\u2026"
    return ""
