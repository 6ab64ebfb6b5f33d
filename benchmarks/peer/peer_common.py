"""What the peer script shares with kontrast's protocol, in plain torch (no lightly): testable in either venv.

- the training images kontrast's ``data.limit`` takes (sorted path order, then ``Samples.subset``'s rule);
- the effective blur of kontrast's truncated Gaussian kernel (what lightly's PIL blur is handed);
- weighted kNN top-1 (Wu et al. 2018), kontrast's ``kontrast.evaluate.knn`` protocol.
"""
from __future__ import annotations

import hashlib
import os

import torch

CIFAR10 = {"mean": [0.4914, 0.4822, 0.4465], "std": [0.2470, 0.2435, 0.2616]}
# One view's augmentation in kontrast's ViewSpec fields, at their defaults (kontrast.augment.views.ViewSpec):
# a view is passed to the peer as the fields that differ from these.
VIEW_DEFAULTS = {"size": 32, "size_factor": 1.0, "crop_scale": [0.08, 1.0], "crop_ratio": [3 / 4, 4 / 3], "flip_p": 0.5,
                 "translate": 0, "translate_p": 0.0, "jitter": [0.4, 0.4, 0.4, 0.1], "jitter_p": 0.8, "gray_p": 0.2,
                 "blur_p": 0.0, "blur_sigma": [0.1, 2.0], "blur_kernel": 3, "solarize_p": 0.0, "randaugment_n": 0,
                 "randaugment_m": 10.0, "randaugment_std": 0.5, "randaugment_p": 0.5, **CIFAR10}


LARS_NOTE = ("LARS: kontrast's clipped form, rate min(eta|w|/(|g|+wd|w|), lr); lightly's LARS scales the update by "
             "lr * eta|w|/(|g|+wd|w|) (parity.py --peer-lars-clip runs the peer with the clipped form)")


def view_delta(view: dict) -> dict:
    """The fields of a full view (JSON-able) that differ from VIEW_DEFAULTS (``size_factor`` is already in ``size``)."""
    return {k: v for k, v in view.items() if k != "size_factor" and VIEW_DEFAULTS.get(k, object()) != v}


def full_view(delta: dict) -> dict:
    """A view from its differences; a field VIEW_DEFAULTS does not know is refused (the peer cannot apply it)."""
    unknown = sorted(set(delta) - set(VIEW_DEFAULTS))
    if unknown:
        raise ValueError(f"view fields the peer does not know: {', '.join(unknown)}")
    return {**VIEW_DEFAULTS, **delta}


def sorted_order(samples: list[tuple[str, int]], root: str) -> tuple[list[int], list[str]]:
    """Indices of ImageFolder ``samples`` in kontrast's order (paths relative to the folder above the
    split, e.g. ``train/cat/0001.jpg``, sorted as strings), and those relative paths in that order."""
    base = os.path.dirname(os.path.normpath(root))
    rel = [os.path.relpath(path, base).replace(os.sep, "/") for path, _ in samples]
    order = sorted(range(len(rel)), key=rel.__getitem__)
    return order, [rel[i] for i in order]


def kontrast_subset(n_total: int, limit: int, seed: int) -> list[int] | None:
    """Positions kontrast's ``Samples.subset(limit, seed)`` keeps, in its order (None: it keeps all)."""
    if not 0 < limit < n_total:
        return None
    return torch.randperm(n_total, generator=torch.Generator().manual_seed(seed))[:limit].tolist()


def chosen_images(samples: list[tuple[str, int]], root: str, limit: int, seed: int) -> tuple[list[int], list[str]]:
    """ImageFolder indices and relative paths of the training images kontrast's ``data.limit=limit`` takes."""
    order, paths = sorted_order(samples, root)
    rows = kontrast_subset(len(order), limit, seed)
    rows = list(range(len(order))) if rows is None else rows
    return [order[i] for i in rows], [paths[i] for i in rows]


def paths_digest(paths: list[str]) -> str:
    """Short digest of a list of relative paths (the same images in the same order give the same digest)."""
    return hashlib.sha256("\n".join(paths).encode()).hexdigest()[:16]


def effective_blur_std(sigma: float, kernel: int) -> float:
    """Standard deviation (pixels) of a normalised ``kernel``-tap Gaussian of ``sigma`` on integer offsets:
    kontrast's blur kernel (torchvision's). At 3 taps it saturates near 0.8 px however large sigma is."""
    offsets = torch.arange(kernel, dtype=torch.float64) - (kernel - 1) / 2
    w = torch.exp(-offsets**2 / (2 * sigma**2))
    return float(((w / w.sum()) * offsets**2).sum().sqrt())


def knn_top1(bank: torch.Tensor, bank_labels: torch.Tensor, test: torch.Tensor, test_labels: torch.Tensor, *,
             k: int = 200, temperature: float = 0.1, num_classes: int = 10, chunk: int = 1024) -> float:
    """Weighted kNN: the ``k`` most cosine-similar bank rows vote for their class with ``exp(sim / temperature)``."""
    bank = torch.nn.functional.normalize(bank.float(), dim=1)
    test = torch.nn.functional.normalize(test.float(), dim=1)
    k, correct = min(k, len(bank)), 0
    for start in range(0, len(test), chunk):
        sims, idx = (test[start:start + chunk] @ bank.T).topk(k, dim=1)
        votes = torch.zeros(len(sims), num_classes).scatter_add_(1, bank_labels[idx], (sims / temperature).exp())
        correct += int((votes.argmax(1) == test_labels[start:start + chunk]).sum())
    return correct / max(len(test), 1)
