"""Linear probe: a softmax classifier trained on frozen, precomputed features.

The linear evaluation protocol of self-supervised learning (e.g. SimCLR, Chen et al. 2020,
https://arxiv.org/abs/2002.05709): the encoder stays frozen, only a linear layer on its
features is trained, and its test top-1 measures how linearly separable the classes are.

Solver: full-batch L-BFGS on the L2-regularised cross-entropy (multinomial logistic
regression, as in CLIP's linear probes, https://arxiv.org/abs/2103.00020), chosen over
mini-batch Adam/SGD with a cosine schedule: on three feature sets their accuracies tie and
both take seconds at 512-d (measurements: docs/lab/evaluation.md, "Linear probe solver"),
so the choice rests on what else differs. The objective is convex and the full-batch solve
heads for its regularised optimum, which depends on the data and ``weight_decay`` alone --
not on a learning rate, a batch size, a schedule length or a shuffling seed. The number is
then a property of the features, reproducible bit for bit, and comparable across runs and methods.

Its one hyperparameter, ``weight_decay``, is never chosen on the test split: by default
(:func:`choose_weight_decay`) each of :data:`WEIGHT_DECAYS` is fitted on 90 % of the training
features and scored on the other 10 % (class-balanced, a fixed seed), and the best is refitted on
the whole training split; only then is the test split scored, once. Mini-batch training stops somewhere on an
optimisation path whose end point moves with each of those knobs. Mini-batch
wins only where the features no longer fit in one matrix product (ImageNet-scale), which
is not this library's CPU setting.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def standardise(
    train: torch.Tensor, test: torch.Tensor, eps: float = 1e-6
) -> tuple[torch.Tensor, torch.Tensor]:
    """Zero mean, unit variance per feature, with the TRAIN statistics for both splits.

    Makes one ``weight_decay`` and the unit L-BFGS step fit features of any scale.
    """
    mean = train.mean(dim=0)  # [D]
    std = train.std(dim=0) + eps  # [D]
    return (train - mean) / std, (test - mean) / std


def regularised_loss(
    x: torch.Tensor, y: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, weight_decay: float
) -> torch.Tensor:
    """Mean cross-entropy of ``x @ weight + bias`` + ``weight_decay/2 · ‖weight‖²`` (bias free)."""
    logits = x @ weight + bias  # [N, D] @ [D, C] -> [N, C]
    return F.cross_entropy(logits, y) + 0.5 * weight_decay * weight.square().sum()


def fit_lbfgs(
    x: torch.Tensor,
    y: torch.Tensor,
    num_classes: int,
    *,
    epochs: int,
    lr: float,
    weight_decay: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Weights ``[D, C]`` and bias ``[C]`` minimising ``regularised_loss``, from zeros.

    ``epochs`` caps the L-BFGS iterations; each iteration is one or a few full passes
    (strong-Wolfe line search), so total passes stay under ``1.25 · epochs``.
    """
    weight = torch.zeros(x.shape[1], num_classes, device=x.device, requires_grad=True)
    bias = torch.zeros(num_classes, device=x.device, requires_grad=True)
    opt = torch.optim.LBFGS(
        [weight, bias],
        lr=lr,
        max_iter=epochs,
        max_eval=epochs * 5 // 4,
        history_size=10,
        line_search_fn="strong_wolfe",
    )

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = regularised_loss(x, y, weight, bias, weight_decay)
        loss.backward()
        return loss

    with torch.enable_grad():
        opt.step(closure)
    return weight.detach(), bias.detach()


def top1(x: torch.Tensor, y: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> float:
    """Fraction of rows whose highest logit is their label."""
    return ((x @ weight + bias).argmax(dim=1) == y).float().mean().item()  # [N, C] -> [N]


# the probe's candidates: the solver comparison's range (3e-3 to 1e-2, docs/lab/evaluation.md), widened both ways
WEIGHT_DECAYS = (1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2)
VALIDATION_FRACTION = 0.1  # of the training labels, held out to choose the weight decay
FALLBACK_WEIGHT_DECAY = 5e-3  # where no sample can be held out (one per class)


def validation_split(labels: torch.Tensor, fraction: float = VALIDATION_FRACTION,
                     seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``(fit rows, validation rows)`` of the training split: ``round(fraction x count)`` random rows of each
    class held out (at least one, never a whole class), the rest to fit on."""
    g = torch.Generator().manual_seed(seed)
    held = []
    for c in labels.unique():
        rows = (labels == c).nonzero().squeeze(1)  # [N_c]
        n = min(max(1, round(fraction * len(rows))), len(rows) - 1)
        held.append(rows[torch.randperm(len(rows), generator=g)[:n]])
    val = torch.cat(held).sort().values  # [n_val]
    fit = torch.ones(len(labels), dtype=torch.bool)
    fit[val] = False
    return fit.nonzero().squeeze(1), val


def choose_weight_decay(features: torch.Tensor, labels: torch.Tensor, *, epochs: int = 100,
                        candidates: tuple[float, ...] = WEIGHT_DECAYS) -> tuple[float, float]:
    """The weight decay of :data:`WEIGHT_DECAYS` whose probe, fitted on the training split less a held-out
    tenth, scores best on that tenth (:func:`validation_split`): ``(weight_decay, validation top-1)``. The
    test split takes no part. The smallest wins a tie."""
    fit, val = validation_split(labels.cpu())
    if len(val) == 0:  # one sample per class: nothing to hold out
        return FALLBACK_WEIGHT_DECAY, float("nan")
    scores = [linear_probe(features[fit], labels[fit], features[val], labels[val], epochs=epochs,
                           weight_decay=wd)["top1"] for wd in candidates]
    best = max(range(len(candidates)), key=lambda i: (scores[i], -i))
    return candidates[best], scores[best]


def linear_probe(
    train_features: torch.Tensor,
    train_labels: torch.Tensor,
    test_features: torch.Tensor,
    test_labels: torch.Tensor,
    *,
    epochs: int = 100,
    lr: float = 1.0,
    weight_decay: float | str = "auto",
    seed: int = 0,
) -> dict[str, float]:
    """Train a linear classifier on frozen features; return ``{"top1", "train_top1", "weight_decay"}`` (and
    ``"val_top1"`` when ``weight_decay="auto"``: chosen on a validation split of the training features,
    :func:`choose_weight_decay`).

    Features (``[N, D]``, ``[M, D]``) are standardised with the train statistics, then a
    multinomial logistic regression is solved by full-batch L-BFGS (see the module doc
    for why not mini-batch SGD/Adam). Seconds for 50k × 512 features on 2 CPU threads
    (docs/lab/evaluation.md).

    Args:
        epochs: L-BFGS iteration cap (≈ full passes over the train features).
        lr: L-BFGS step scale; 1 is the natural quasi-Newton step, the line search adapts it.
        weight_decay: L2 penalty on the weights, in units of the mean cross-entropy, or
            ``"auto"``: chosen on a validation split carved from the training features.
        seed: accepted for one call shape across evaluators; the solve starts from zeros
            and uses no randomness, so the result does not depend on it.
    """
    del seed  # deterministic by construction: zero init, full batch, no shuffling
    chosen = {}
    if weight_decay == "auto":
        weight_decay, chosen["val_top1"] = choose_weight_decay(train_features, train_labels, epochs=epochs)
    y_train = train_labels.long().to(train_features.device)  # [N]
    y_test = test_labels.long().to(test_features.device)  # [M]
    num_classes = int(max(y_train.max(), y_test.max())) + 1
    x_train, x_test = standardise(train_features.float(), test_features.float())
    weight, bias = fit_lbfgs(
        x_train, y_train, num_classes, epochs=epochs, lr=lr, weight_decay=weight_decay
    )
    return {
        "top1": top1(x_test, y_test, weight, bias),
        "train_top1": top1(x_train, y_train, weight, bias),
        "weight_decay": weight_decay,
        **chosen,
    }
