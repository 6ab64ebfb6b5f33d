"""Optimizers (SGD, LARS, AdamW) and per-step schedules, precomputed.

Norm and bias parameters (ndim <= 1) get no weight decay and, under LARS,
no layer-wise adaptation (as in SimCLR and BYOL, and solo-learn's ``exclude_bias_n_norm``).
LARS comes in two forms (``optim.lars_clip``); see :class:`LARS`.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn

from kontrast.config import OptimConfig
from kontrast.errors import UserError


class LARS(torch.optim.Optimizer):
    """SGD with momentum and layer-wise adaptive rate scaling (You et al. 2017, https://arxiv.org/abs/1708.03888).

    For each parameter with ``lars=True`` in its group (weights; ``param_groups`` excludes norms and
    biases, which get plain SGD), the update ``d = g + wd * w`` is scaled before momentum, in one of two forms:

    ``clip=False`` (SimCLR's and BYOL's own code): ``d *= eta * ||w|| / ||g + wd * w||``; the step is
        ``lr * eta * ||w|| / ||d||``, whatever ``lr`` is.
    ``clip=True`` (solo-learn's ``clip_lr``, NVIDIA apex's LARC with clipping; the form solo-learn's CIFAR
        recipes, and so MoCo v3's, SwAV's and BYOL's defaults here, were tuned with):
        ``d *= min(eta * ||w|| / (||g|| + wd * ||w||) / lr, 1)``: the effective rate is
        ``min(eta * ||w|| / (||g|| + wd * ||w||), lr)``, the adaptive rate capped by the scheduled ``lr``.

    When either norm is 0 the scale is 1.
    """

    def __init__(self, params, lr: float, momentum: float = 0.9, weight_decay: float = 0.0, eta: float = 0.02,
                 clip: bool = False):
        super().__init__(params, dict(lr=lr, momentum=momentum, weight_decay=weight_decay, eta=eta, lars=True,
                                      clip=clip))

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            wd, clip = group["weight_decay"], group.get("clip", False)  # checkpoints before `clip`: the unclipped form
            for p in group["params"]:
                if p.grad is None:
                    continue
                d = p.grad.add(p, alpha=wd) if wd else p.grad.clone()
                if group["lars"]:
                    w_norm = torch.linalg.vector_norm(p)
                    if clip:
                        g_norm = torch.linalg.vector_norm(p.grad)
                        rate = group["eta"] * w_norm / (g_norm + wd * w_norm)  # adaptive rate
                        scale = torch.clamp(rate / group["lr"], max=1.0) if group["lr"] > 0 else torch.ones_like(rate)
                    else:
                        g_norm = torch.linalg.vector_norm(d)
                        scale = group["eta"] * w_norm / g_norm
                    d.mul_(torch.where((w_norm > 0) & (g_norm > 0), scale, 1.0))
                buf = self.state[p].get("momentum_buffer")
                if buf is None:
                    buf = self.state[p]["momentum_buffer"] = d
                else:
                    buf.mul_(group["momentum"]).add_(d)
                p.add_(buf, alpha=-group["lr"])


def param_groups(model: nn.Module, weight_decay: float, fixed_lr: tuple[str, ...] = ()) -> list[dict]:
    """Weights with decay (groups marked ``decay``: a weight-decay schedule sets theirs); norms and biases
    without (and without LARS scaling). Parameters under the submodules named in ``fixed_lr`` get groups of
    their own marked ``fixed_lr`` (the loop keeps their learning rate at the peak); empty groups are dropped."""
    groups = {(fixed, small): [] for fixed in (False, True) for small in (False, True)}
    for name, p in model.named_parameters():
        if p.requires_grad:
            fixed = any(name == m or name.startswith(m + ".") for m in fixed_lr)
            groups[fixed, p.ndim <= 1].append(p)
    return [
        {"params": params, "weight_decay": 0.0 if small else weight_decay, "decay": not small,
         **({"lars": False} if small else {}),
         **({"fixed_lr": True} if fixed else {})}
        for (fixed, small), params in groups.items() if params
    ]


def peak_lr(cfg: OptimConfig, batch_size: int) -> float:
    """Linear scaling rule (Goyal et al. 2017): lr x batch / lr_batch."""
    return cfg.lr * batch_size / cfg.lr_batch


def create_optimizer(model: nn.Module, cfg: OptimConfig, batch_size: int) -> torch.optim.Optimizer:
    groups = param_groups(model, cfg.weight_decay, getattr(model, "fixed_lr_modules", ()))
    lr = peak_lr(cfg, batch_size)
    if cfg.name == "sgd":
        for g in groups:
            g.pop("lars", None)
        return torch.optim.SGD(groups, lr=lr, momentum=cfg.momentum)
    if cfg.name == "lars":
        return LARS(groups, lr=lr, momentum=cfg.momentum, eta=cfg.lars_eta, clip=cfg.lars_clip)
    if cfg.name == "adamw":
        for g in groups:
            g.pop("lars", None)
        return torch.optim.AdamW(groups, lr=lr, betas=tuple(cfg.betas))
    raise UserError(f"unknown optimizer {cfg.name!r}; choose sgd, lars or adamw (optim.name)")


def lr_schedule(peak: float, total_steps: int, warmup_steps: int, min_lr: float = 0.0) -> torch.Tensor:
    """Per-step learning rates ``[total_steps]``: linear warm-up to ``peak``, then cosine to ``min_lr``, an
    absolute rate (``optim.min_lr``; the authors' DINO and timm read it so), which must not exceed ``peak``."""
    if min_lr > peak:
        raise UserError(f"optim.min_lr {min_lr:g} is above the peak lr {peak:g} (optim.lr x batch / lr_batch); "
                        "set optim.min_lr below it (it is an absolute rate, the last step's)")
    steps = torch.arange(total_steps, dtype=torch.float64)
    warm = peak * (steps + 1) / max(warmup_steps, 1)  # [T]
    cos = cosine(peak, min_lr, (steps - warmup_steps) / max(total_steps - warmup_steps, 1))  # [T]
    return torch.where(steps < warmup_steps, warm, cos)


def cosine(start: float, end: float, t: torch.Tensor) -> torch.Tensor:
    """``end + (start - end) (1 + cos(pi t)) / 2``: ``start`` at t = 0, ``end`` at t = 1."""
    return end + (start - end) * 0.5 * (1 + torch.cos(math.pi * t))


def weight_decay_schedule(cfg: OptimConfig, total_steps: int) -> list[float] | None:
    """Per-step weight decay of the decayed groups: a cosine from ``weight_decay`` to ``weight_decay_end`` over
    the run (DINO's ViT recipe: 0.04 -> 0.4; the authors' ``cosine_scheduler``, no warm-up); None when constant."""
    if cfg.weight_decay_end is None or cfg.weight_decay_end == cfg.weight_decay:
        return None
    t = torch.arange(total_steps, dtype=torch.float64) / max(total_steps, 1)  # [T]
    return cosine(cfg.weight_decay, cfg.weight_decay_end, t).tolist()


@torch.no_grad()
def clip_per_parameter(params: list[torch.Tensor], max_norm: float) -> None:
    """Each parameter's gradient scaled to L2 norm at most ``max_norm``, one parameter at a time (DINO's
    ``clip_gradients``: ``g *= min(max_norm / (||g|| + 1e-6), 1)``), not the global norm of
    ``torch.nn.utils.clip_grad_norm_``."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return
    norms = torch._foreach_norm(grads)  # one 0-d tensor per parameter
    scales = [torch.clamp(max_norm / (n + 1e-6), max=1.0) for n in norms]
    torch._foreach_mul_(grads, scales)
