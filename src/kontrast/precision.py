"""Numeric precision: the one place that decides autocast and the float32 islands inside it.

``train.precision`` is ``fp32`` (no autocast), ``bf16`` (``torch.autocast`` with bfloat16:
matmuls and convolutions in bf16, reductions and losses as autocast's op lists decide) or ``auto``
(the default): bf16 only where the device computes it natively -- a CUDA GPU with bf16, a CPU with
AMX or AVX512-BF16 -- and fp32 elsewhere, because on a CPU without them bf16 autocast was measured
slower than fp32 (issue 19: SimCLR, ResNet-18 width 0.5, batch 384: 34 against 40 images/s).
``train.channels_last: auto`` follows the same rule (it was measured faster together with bf16). In fp32
on a CPU without native bf16 channels_last was measured 1.3-2x faster too (issue 19), but torch 2.14.1 aborts
there ("double free or corruption") in the backward of a ResNet step whose batch is odd (3, 5, 7, 9 images per
forward; even ones run), so ``auto`` leaves it off until that is understood; ``train.channels_last=true`` turns it on.
:func:`choose_precision` resolves both once per run; the run's config keeps the choice.
Training, evaluation and the benchmarks all enter :func:`autocast`; code that must stay in
float32 under it (score matrices with a small temperature, SwAV's Sinkhorn, blocked NT-Xent)
enters :func:`float32`. Nothing else in kontrast creates or disables an autocast context.
"""

from __future__ import annotations

import contextlib

import torch

from kontrast.errors import UserError

PRECISIONS = ("auto", "fp32", "bf16")
CPU_BF16_FLAGS = ("amx_bf16", "avx512_bf16")  # /proc/cpuinfo flags of native bf16 arithmetic


def cpu_flags() -> set[str]:
    """This CPU's feature flags (Linux /proc/cpuinfo; empty elsewhere)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def native_bf16(device: torch.device | str) -> tuple[bool, str]:
    """(whether ``device`` computes bf16 natively, the reason in words)."""
    device = torch.device(device)
    if device.type == "cuda":
        ok = torch.cuda.is_available() and torch.cuda.is_bf16_supported()
        return ok, f"CUDA device {'supports' if ok else 'lacks'} bf16"
    if device.type == "cpu":
        capability = torch.backends.cpu.get_cpu_capability()
        found = sorted(set(CPU_BF16_FLAGS) & cpu_flags())
        if found:
            return True, f"CPU {capability} with {' and '.join(found)}"
        return False, f"CPU {capability} without AMX or AVX512-BF16"
    return False, f"{device.type} device"


def choose_precision(precision: str, channels_last, device: torch.device | str) -> tuple[str, bool, str]:
    """Resolve ``auto`` in ``train.precision`` / ``train.channels_last`` for ``device``:
    (precision, channels_last, one line saying what was chosen and why)."""
    check_precision(precision)
    native, why = native_bf16(device)
    chosen = ("bf16" if native else "fp32") if precision == "auto" else precision
    layout = native if channels_last == "auto" else bool(channels_last)

    def said(given, value) -> str:
        return f"{value} ({'auto' if given == 'auto' else 'set'})"

    return chosen, layout, (f"numerics: precision {said(precision, chosen)}, channels_last "
                            f"{said(channels_last, 'on' if layout else 'off')}; {why}")


def check_precision(precision: str) -> None:
    """One-line error for a precision kontrast does not have."""
    if precision not in PRECISIONS:
        raise UserError(f"unknown precision {precision!r}; choose one of: {', '.join(PRECISIONS)}")


def autocast(device: torch.device | str, precision: str) -> torch.autocast:
    """The autocast context of ``precision`` on ``device`` (disabled for fp32)."""
    check_precision(precision)
    if precision == "auto":
        precision = choose_precision(precision, False, device)[0]
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
