"""Numeric precision: the one place that decides autocast and the float32 islands inside it.

``train.precision`` is ``fp32`` (no autocast) or ``bf16`` (``torch.autocast`` with bfloat16:
matmuls and convolutions in bf16, reductions and losses as autocast's op lists decide).
Training, evaluation and the benchmarks all enter :func:`autocast`; code that must stay in
float32 under it (score matrices with a small temperature, SwAV's Sinkhorn, blocked NT-Xent)
enters :func:`float32`. Nothing else in kontrast creates or disables an autocast context.
"""

from __future__ import annotations

import contextlib

import torch

from kontrast.errors import UserError

PRECISIONS = ("fp32", "bf16")


def check_precision(precision: str) -> None:
    """One-line error for a precision kontrast does not have."""
    if precision not in PRECISIONS:
        raise UserError(f"unknown precision {precision!r}; choose one of: {', '.join(PRECISIONS)}")


def autocast(device: torch.device | str, precision: str) -> torch.autocast:
    """The autocast context of ``precision`` on ``device`` (disabled for fp32)."""
    check_precision(precision)
    device_type = torch.device(device).type
    return torch.autocast(device_type, dtype=torch.bfloat16, enabled=precision == "bf16")


def float32(x: torch.Tensor):
    """Autocast switched off on ``x``'s device for the block (a no-op where autocast is off).

    For computations whose inputs must stay float32 under bf16 autocast: a small temperature
    amplifies bf16 rounding (at tau 0.01, 2e-3 relative loss error in bf16, 1e-7 in fp32).
    """
    device = x.device.type
    if device in ("cpu", "cuda") and torch.is_autocast_enabled(device):
        return torch.autocast(device, enabled=False)
    return contextlib.nullcontext()


def at_least_float32(x: torch.Tensor) -> torch.Tensor:
    """``x`` in float32 if it is a half type; float32 and float64 stay as they are."""
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
