"""Self-distillation without labels: DINO's loss, its centre and its teacher temperature.

Caron et al. 2021, "Emerging Properties in Self-Supervised Vision Transformers",
https://arxiv.org/abs/2104.14294, section 3.1 and Algorithm 1. The teacher's output on a global view,
centred and sharpened, ``P_t = softmax((g_t(x) - c) / tau_t)``, is the target of the student's
``P_s = softmax(g_s(x') / tau_s)`` on every *other* view x' (global and local):

    L = 1 / #pairs * sum_{x in global views} sum_{x' != x} mean_batch H(P_t(x), P_s(x')),  H(a, b) = -a . log b

(the authors' ``DINOLoss``: each pair's cross-entropy averaged over the batch, then the mean over the
``A (V - 1)`` pairs of A teacher views and V student views). That is SwAV's swapped-prediction average with
the teacher's distribution in place of the Sinkhorn codes, so the sum is written once
(:func:`~kontrast.losses.swav.swapped_prediction`). Centring (``- c``) stops one prototype from dominating,
sharpening (``tau_t < tau_s``) stops the uniform output; either alone collapses (section 5.3, figure 7).
The centre follows the teacher's mean output over the global batch, ``c <- m c + (1 - m) mean(g_t)``; it
never carries a gradient.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kontrast.losses.swav import swapped_prediction
from kontrast.precision import at_least_float32


@torch.no_grad()
def teacher_distribution(teacher: torch.Tensor, centre: torch.Tensor, temperature: float) -> torch.Tensor:
    """``softmax((teacher - centre) / tau_t)`` over the last dim: ``[..., K]``, ``centre [K]``; no gradient."""
    teacher = at_least_float32(teacher)
    return torch.softmax((teacher - centre.to(teacher.dtype)) / temperature, dim=-1)


def dino_loss(student: torch.Tensor, teacher: torch.Tensor, centre: torch.Tensor, student_temperature: float,
              teacher_temperature: float) -> torch.Tensor:
    """DINO's loss (Algorithm 1, over every view pair): 0-d.

    student: [V, B, K] logits of every view (the first A are the global views the teacher saw)
    teacher: [A, B, K] the teacher's logits of the A global views (no gradient flows into them)
    centre:  [K]
    Loss = mean over a < A, v != a of mean_b ``-sum_k P_t[a, b, k] log softmax(student[v, b] / tau_s)_k``.
    """
    targets = teacher_distribution(teacher, centre, teacher_temperature)  # [A, B, K], sharpened and centred
    return swapped_prediction(student, targets, student_temperature)


@torch.no_grad()
def mean_entropy(p: torch.Tensor) -> torch.Tensor:
    """Mean entropy of the distributions ``p [..., K]`` (a metric: log K uniform, 0 one-hot; figure 7's)."""
    return -(p * p.clamp_min(1e-30).log()).sum(-1).mean()


@torch.no_grad()
def target_statistics(q: torch.Tensor) -> dict[str, torch.Tensor]:
    """Metrics of the targets ``q [..., K]`` (figure 7's): ``teacher_entropy`` per sample (log K: the uniform
    collapse; near 0: confident, healthy or not), ``teacher_batch_entropy`` of the batch-mean target (near 0: one
    prototype for every image) and ``teacher_top_share``, the most-used prototype's share (1: dominance collapse)."""
    used = q.reshape(-1, q.shape[-1]).mean(0)  # [K] the batch-mean target: how much each prototype is used
    return {"teacher_entropy": mean_entropy(q), "teacher_batch_entropy": mean_entropy(used),
            "teacher_top_share": used.max()}


def teacher_temperature(epochs: float, warmup_temperature: float, temperature: float, warmup_epochs: float) -> float:
    """Linear warm-up of tau_t from ``warmup_temperature`` to ``temperature`` over ``warmup_epochs``, then flat.

    ``epochs`` is the (fractional) number of epochs done, so the warm-up moves every step; the authors' code
    steps once per epoch (``np.linspace(warmup, tau_t, warmup_epochs)[epoch]``, reaching tau_t at epoch
    ``warmup_epochs - 1``). ``warmup_epochs = 0``: tau_t throughout (solo-learn's default).
    """
    if epochs >= warmup_epochs:
        return temperature
    return warmup_temperature + (temperature - warmup_temperature) * epochs / warmup_epochs


@torch.no_grad()
def update_centre(centre: torch.Tensor, batch_mean: torch.Tensor, momentum: float) -> None:
    """``centre <- momentum * centre + (1 - momentum) * batch_mean`` in place (``[K]`` each; eq. 4).

    ``batch_mean``: the teacher's mean logits over the global batch's global views (every rank's samples).
    ``momentum = 1`` leaves the centre where it is (0 from the start: no centring, the paper's ablation).
    """
    centre.mul_(momentum).add_(batch_mean.to(centre.dtype), alpha=1.0 - momentum)


def masked_patch_loss(student: torch.Tensor, targets: torch.Tensor, image: torch.Tensor, images: int,
                      student_temperature: float) -> torch.Tensor:
    """iBOT's masked-image-modelling loss (Zhou et al. 2022, https://arxiv.org/abs/2111.07832, eq. 2, in DINOv2's
    weighting): 0-d. ``student [M, K]``: logits of the M masked patch tokens; ``targets [M, K]``: the teacher's
    distributions at the same patches (its unmasked view; no gradient); ``image [M]``: which of the ``images`` images
    each patch is in. Each patch's ``H(target, softmax(student / tau_s))`` weighs 1 / (the masked patches of its
    image), so every masked image counts once, then the sum is divided by ``images`` (all of them, masked or not)."""
    log_p = F.log_softmax(at_least_float32(student) / student_temperature, dim=1)  # [M, K]
    ce = -(targets.to(log_p.dtype) * log_p).sum(1)  # [M] cross-entropy per masked patch
    per_image = torch.bincount(image, minlength=images).to(ce.dtype)  # [images] masked patches of each
    return (ce / per_image[image]).sum() / images
