"""Semi-supervised evaluation: the whole encoder fine-tuned with a linear head on a class-balanced
fraction of the training labels, scored on the test split.

The protocol of SimCLR (Chen et al. 2020, https://arxiv.org/abs/2002.05709, appendix B.5) and SimCLR v2
(https://arxiv.org/abs/2006.10029, section 4), with 1 % or 10 % of the labels: SGD with Nesterov momentum
0.9, learning rate 0.05 x batch / 256, no warm-up, no weight decay or other regularisation, crops and
horizontal flips as the only augmentation (:func:`finetune_view`), 60 epochs on 1 % of the labels and 30
on 10 %; every labelled image in every epoch (:func:`epoch_batches`). These hyperparameters are the paper's,
fixed in advance: none is chosen on the test split. A fine-tuned copy is trained; the run's encoder is left as
it was.
"""

from __future__ import annotations

import copy

import torch
import torch.nn as nn
import torch.nn.functional as F

from kontrast.augment import ViewSpec, make_views
from kontrast.data import Samples
from kontrast.errors import UserError
from kontrast.evaluate.features import extract_features
from kontrast.evaluate.options import EvalOptions
from kontrast.precision import autocast


def check_finetune_args(fraction: float, epochs: int = 0) -> None:
    """One line for a fraction outside (0, 1] or negative epochs, before any work."""
    if not 0 < fraction <= 1 or epochs < 0:
        raise UserError(f"--labels-fraction must be in (0, 1] (e.g. 0.01 or 0.1) and --finetune-epochs >= 0; got "
                        f"{fraction} and {epochs}")


def class_balanced_indices(labels: torch.Tensor, fraction: float, seed: int = 0) -> torch.Tensor:
    """``round(fraction x count)`` random rows of each class (at least one): labels [N] -> sorted indices [n]."""
    check_finetune_args(fraction)
    g = torch.Generator().manual_seed(seed)
    picked = []
    for c in labels.unique():
        rows = (labels == c).nonzero().squeeze(1)  # [N_c]
        n = max(1, round(fraction * len(rows)))
        picked.append(rows[torch.randperm(len(rows), generator=g)[:n]])
    return torch.cat(picked).sort().values  # [n]


def default_epochs(fraction: float) -> int:
    """SimCLR's schedule: 60 epochs on 1 % of the labels (or fewer), 30 above."""
    return 60 if fraction <= 0.01 else 30


def finetune_view(size: int, mean, std) -> ViewSpec:
    """The fine-tuning augmentation: crops and flips only. SimCLR's Inception crop (8-100 % of the area) at
    ImageNet scale; on small images (64 px or less, CIFAR) the small-image convention instead, a shift by up to
    an eighth of the side (4 px at 32, reflect-padded) and a flip: a resized crop of 8 % of a 32-px image
    leaves a 9-px patch, and shifts fine-tuned better on each of three seeds (measurements: docs/lab/evaluation.md,
    "Fine-tuning views on small images")."""
    if size > 64:
        return ViewSpec(size=size, jitter_p=0.0, gray_p=0.0, mean=tuple(mean), std=tuple(std))
    return ViewSpec(size=size, crop_scale=(1.0, 1.0), crop_ratio=(1.0, 1.0), translate=size // 8, translate_p=1.0,
                    jitter_p=0.0, gray_p=0.0, mean=tuple(mean), std=tuple(std))


def epoch_batches(order: torch.Tensor, batch: int) -> tuple[torch.Tensor, ...]:
    """``order`` [n] in ``ceil(n / batch)`` batches of near-equal size, each at most ``batch``: every image is
    seen each epoch (500 labels at batch 256: 250 + 250, not 256 and 244 dropped), and no batch is left with
    one image (BatchNorm needs two)."""
    return torch.tensor_split(order, -(-len(order) // batch))


def finetune_top1(
    encoder: nn.Module, train: Samples, test: Samples, options: EvalOptions, *, mean, std, seed: int = 0,
) -> dict[str, float]:
    """Fine-tune a copy of ``encoder`` + ``Linear(dim, classes)`` on ``options.labels_fraction`` of the training
    labels (class-balanced, drawn from ``seed``, which also seeds the head and the order); test top-1.

    ``options.finetune_epochs`` 0 takes :func:`default_epochs`; ``options.finetune_lr`` is per 256 images (scaled
    by the batch size); ``mean`` and ``std`` normalise the encoder's inputs.
    Returns ``{"finetune_top1", "labels_fraction", "finetune_labelled", "finetune_epochs"}``.
    """
    if train.labels is None or test.labels is None or train.x.ndim != 4:
        raise UserError(f"--labels-fraction needs labelled images; {train.name} has none")
    fraction, device, precision = options.labels_fraction, options.device, options.precision
    rows = class_balanced_indices(train.labels, fraction, seed)
    images, labels = train.x[rows], train.labels[rows]  # [n, 3, H, W], [n]
    epochs = options.finetune_epochs or default_epochs(fraction)
    batch = min(options.finetune_batch_size, len(rows))
    model = copy.deepcopy(encoder).to(device).train()
    with torch.random.fork_rng(devices=[]):  # the head's initialisation follows ``seed``, not the global RNG
        torch.manual_seed(seed)
        head = nn.Linear(model.dim, len(train.classes) or int(train.labels.max()) + 1).to(device)
    params = [*model.parameters(), *head.parameters()]
    lr = options.finetune_lr * batch / 256  # the options' lr is per 256 images
    opt = torch.optim.SGD([p for p in params if p.requires_grad], lr=lr, momentum=0.9, nesterov=True)
    spec = finetune_view(images.shape[-1], mean, std)
    g = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        order = torch.randperm(len(rows), generator=g)  # [n]
        for idx in epoch_batches(order, batch):  # every labelled image, every epoch
            x = make_views(images[idx], [spec], g)[0].to(device)  # [b, 3, H, W] crop + flip, normalised
            with autocast(device, precision):
                logits = head(model(x))  # [b, classes]
            loss = F.cross_entropy(logits.float(), labels[idx].to(device))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    feats = extract_features(model, test.x, mean=mean, std=std, device=device, precision=precision)  # [M, dim]
    with torch.no_grad():
        predicted = head(feats.to(device)).argmax(1).cpu()  # [M]
    return {"finetune_top1": (predicted == test.labels).float().mean().item(), "labels_fraction": fraction,
            "finetune_labelled": len(rows), "finetune_epochs": epochs}
