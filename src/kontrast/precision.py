"""Numeric precision: the one place that decides autocast and the float32 islands inside it.

``train.precision`` is ``fp32`` (no autocast), ``bf16`` (``torch.autocast`` with bfloat16:
matmuls and convolutions in bf16, reductions and losses as autocast's op lists decide) or ``auto``
(the default): bf16 only where the device computes it natively -- a CUDA GPU with bf16, a CPU with
AMX or AVX512-BF16 -- and fp32 elsewhere, because on a CPU without them bf16 autocast is slower than fp32.
``fp64`` trains the method's parameters, buffers and views in float64 (1.8x fp32's time for ResNet-18 at width 1/8
on 16 px, 4.5x on 32 px; docs/lab/tolerances.md): for checking, not for training. Two runs that must agree
(processes against one, micro-batches, a resumed run) agree there to float64 rounding, which no CPU's kernels
carry across a ReLU's kink, where float32 rounding on one kernel set does.
``train.channels_last: auto`` is on for every CPU (oneDNN's convolutions run in NHWC, measured faster in fp32 too)
and, elsewhere, where bf16 is native (faster together with bf16 there) -- except for an encoder with a layer
that oneDNN's NHWC backward corrupts (:func:`channels_last_hazard`): there ``auto`` stays in NCHW and ``true``
is a one-line error. Measurements: docs/lab/performance.md, sections 6 and 10.
:func:`choose_precision` resolves both once per run; the run's config keeps the choice.
Training, evaluation and the benchmarks all enter :func:`autocast`; code that must stay in
float32 under it (score matrices with a small temperature, SwAV's Sinkhorn, blocked NT-Xent)
enters :func:`float32`. Nothing else in kontrast creates or disables an autocast context.
"""

from __future__ import annotations

import contextlib
import os

import torch
from torch import nn

from kontrast.errors import UserError

PRECISIONS = ("auto", "fp32", "bf16", "fp64")
CPU_BF16_FLAGS = ("amx_bf16", "avx512_bf16")  # /proc/cpuinfo flags of native bf16 arithmetic
# oneDNN instruction sets below native bf16: ONEDNN_MAX_CPU_ISA set to one of these keeps oneDNN off bf16 instructions
# (https://uxlfoundation.github.io/oneDNN/dev_guide_cpu_dispatcher_control.html), as on a CPU without them
ONEDNN_ISA_WITHOUT_BF16 = ("SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE", "AVX512_CORE_VNNI")
ONEDNN_IC_BLOCK = 16  # input channels per block of oneDNN's fp32 AVX-512 kernels (8 on AVX2)
ONEDNN_ISSUE = "https://github.com/uxlfoundation/oneDNN/issues/6035"


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


def kernels_capped() -> str:
    """Why PyTorch's and oneDNN's kernels run below this CPU's bf16 instructions (``ATEN_CPU_CAPABILITY`` under
    AVX-512, ``ONEDNN_MAX_CPU_ISA`` below AVX512_CORE_BF16: how a machine computes as an older one does); ``""``
    when they are not capped."""
    aten = torch.backends.cpu.get_cpu_capability()
    if aten not in ("AVX512", "AMX"):  # AMX: a capability name of later PyTorch builds
        return f"PyTorch's kernels are capped at {aten}"
    isa = os.environ.get("ONEDNN_MAX_CPU_ISA", "").upper()
    return f"ONEDNN_MAX_CPU_ISA={isa}" if isa in ONEDNN_ISA_WITHOUT_BF16 else ""


def native_bf16(device: torch.device | str) -> tuple[bool, str]:
    """(whether ``device`` computes bf16 natively, the reason in words)."""
    device = torch.device(device)
    if device.type == "cuda":
        ok = torch.cuda.is_available() and torch.cuda.is_bf16_supported()
        return ok, f"CUDA device {'supports' if ok else 'lacks'} bf16"
    if device.type == "cpu":
        capability = torch.backends.cpu.get_cpu_capability()
        found = sorted(set(CPU_BF16_FLAGS) & cpu_flags())
        capped = kernels_capped()
        if found and capped:
            return False, f"CPU {capability} with {' and '.join(found)}, but {capped}"
        if found:
            return True, f"CPU {capability} with {' and '.join(found)}"
        return False, f"CPU {capability} without AMX or AVX512-BF16"
    return False, f"{device.type} device"


def channels_last_hazard(encoder: nn.Module | None) -> str | None:
    """The first layer of ``encoder`` whose channels_last backward oneDNN corrupts on x86 CPUs, in words; else None.

    A 1x1 convolution with stride > 1 and fewer input channels (per group) than oneDNN's channel block:
    its backward-weights kernel writes past its workspace in NHWC (``ONEDNN_ISSUE``). Under torch 2.14.1
    on an AVX-512 CPU that aborts the process ("double free or corruption") when the batch is odd;
    ResNet-18 below width 0.25 has such a layer (``layer2.0.downsample.0``: 8 input channels at 0.125).
    With 16 or more input channels the NHWC weight gradients equal the NCHW ones (largest relative
    difference 3.5e-7 over 744 shapes: 16-128 input and output channels, batches 1-255 odd ones
    included, 4-32 px; docs/lab/performance.md section 10).
    """
    for name, conv in (encoder.named_modules() if encoder is not None else ()):
        if not (isinstance(conv, nn.Conv2d) and conv.kernel_size == (1, 1)):
            continue
        stride, channels = max(conv.stride), conv.in_channels // conv.groups
        if stride > 1 and channels < ONEDNN_IC_BLOCK:
            return (f"encoder layer {name} is a 1x1 stride-{stride} convolution with {channels} input channels, "
                    f"whose channels_last backward oneDNN corrupts on CPU ({ONEDNN_ISSUE})")
    return None


def channels_last_features(encoder: nn.Module, device: torch.device | str, dtype: torch.dtype) -> bool:
    """Whether feature extraction feeds ``encoder`` NHWC batches: on a CPU, in float32 (oneDNN has no float64
    kernels), for an encoder without the layer of :func:`channels_last_hazard` (inference runs only its forward,
    but kontrast keeps to the layouts it has measured). oneDNN's CPU convolutions run faster on NHWC input: ResNet-18
    at width 0.25, 32 px, batches of 512, 2 threads, 436 -> 654 images/s (docs/lab/performance.md section 10)."""
    return torch.device(device).type == "cpu" and dtype == torch.float32 and channels_last_hazard(encoder) is None


def choose_precision(precision: str, channels_last, device: torch.device | str,
                     encoder: nn.Module | None = None) -> tuple[str, bool, str]:
    """Resolve ``auto`` in ``train.precision`` / ``train.channels_last`` for ``device`` and ``encoder``
    (its layers only: a meta-device copy will do): (precision, channels_last, one line saying what was
    chosen and why)."""
    check_precision(precision)
    device = torch.device(device)
    native, why = native_bf16(device)
    chosen = ("bf16" if native else "fp32") if precision == "auto" else precision
    layout = (native or device.type == "cpu") if channels_last == "auto" else bool(channels_last)
    if chosen == "fp64" and device.type == "mps":
        raise UserError("train.precision=fp64: an MPS device has no float64; use fp32, or train.device=cpu to check "
                        "numerics in float64")
    if chosen == "fp64" and channels_last == "auto":  # oneDNN has no float64 convolutions: NHWC buys nothing
        layout, why = False, f"{why}; fp64: parameters and views in float64, channels_last off (no oneDNN float64)"
    hazard = channels_last_hazard(encoder) if layout and device.type == "cpu" else None
    if hazard and channels_last != "auto":
        raise UserError(f"train.channels_last=true: {hazard}; set train.channels_last=auto (NCHW here) or use a "
                        f"wider encoder ({ONEDNN_IC_BLOCK}+ input channels in every 1x1 strided convolution)")
    if hazard:
        layout, why = False, f"{why}; channels_last off: {hazard}"

    def said(given, value) -> str:
        return f"{value} ({'auto' if given == 'auto' else 'set'})"

    return chosen, layout, (f"numerics: precision {said(precision, chosen)}, channels_last "
                            f"{said(channels_last, 'on' if layout else 'off')}; {why}")


def check_precision(precision: str) -> None:
    """One-line error for a precision kontrast does not have."""
    if precision not in PRECISIONS:
        raise UserError(f"unknown precision {precision!r}; choose one of: {', '.join(PRECISIONS)}")


def in_precision(x, precision: str):
    """``x`` (a method, or a floating view) in float64 under ``fp64``: parameters, buffers and views; as it is
    otherwise (autocast decides the rest)."""
    if precision != "fp64" or (torch.is_tensor(x) and not x.is_floating_point()):
        return x
    return x.to(torch.float64)


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
