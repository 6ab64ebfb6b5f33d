"""Frozen features for evaluation: encoder features of uint8 images, and raw pixels.

Images arrive as one uint8 tensor ``[N, 3, H, W]`` (the airbench way: the whole dataset
in memory, converted and normalised per batch on the device), so evaluation needs no
DataLoader and no PIL.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch
from torch import nn

from kontrast.precision import autocast, channels_last_features, check_precision


@contextmanager
def eval_mode(module: nn.Module) -> Iterator[None]:
    """Put every submodule in eval mode, then restore each one's own previous flag.

    Restoring per submodule (not ``module.train(was_training)``) keeps deliberate mixes,
    e.g. a training encoder whose BatchNorms were frozen in eval mode.
    """
    flags = [(m, m.training) for m in module.modules()]
    module.eval()
    try:
        yield
    finally:
        for m, was_training in flags:
            m.training = was_training


def check_images(images: torch.Tensor) -> None:
    """Features are defined on uint8 ``[N, 3, H, W]`` images; say so if they are not."""
    if images.dtype != torch.uint8 or images.ndim != 4:
        raise ValueError(
            f"expected uint8 images [N, C, H, W], got {images.dtype} {tuple(images.shape)}"
        )


def normalise(batch: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """uint8 ``[B, C, H, W]`` -> float32 ``(x/255 - mean) / std``, per channel."""
    x = batch.float().div_(255)  # [B, C, H, W] in [0, 1]
    return x.sub_(mean[:, None, None]).div_(std[:, None, None])  # mean, std: [C]


@torch.no_grad()
def extract_features(
    encoder: nn.Module,
    images_uint8: torch.Tensor,
    *,
    mean: Sequence[float],
    std: Sequence[float],
    batch_size: int = 512,
    device: str | torch.device = "cpu",
    precision: str = "fp32",
) -> torch.Tensor:
    """Encoder features of every image: uint8 ``[N, 3, H, W]`` -> float32 ``[N, dim]`` on CPU.

    Runs in eval mode (BatchNorm uses running statistics; the previous modes are restored
    afterwards) without autograd. Each batch is moved to ``device``, scaled to [0, 1] and
    normalised there; ``precision="bf16"`` runs the encoder under bf16 autocast. The encoder
    must already live on ``device`` (it is not moved, so the caller's model is left as is).

    Float input (the built-in sequences, ``[N, C, T]``) is fed as is; ``mean`` and ``std`` are ignored.

    Args:
        mean, std: per-channel normalisation in [0, 1] units, e.g. CIFAR-10's
            ``(0.4914, 0.4822, 0.4465)``, ``(0.2470, 0.2435, 0.2616)``.
    """
    # float [N, C, T] sequences go in as they are
    sequences = images_uint8.is_floating_point() and images_uint8.ndim == 3
    if not sequences:
        check_images(images_uint8)
    check_precision(precision)
    device = torch.device(device)
    if not sequences:
        mean_t = torch.as_tensor(mean, dtype=torch.float32, device=device)  # [C]
        std_t = torch.as_tensor(std, dtype=torch.float32, device=device)  # [C]
    chunks = []
    dtype = next((p.dtype for p in encoder.parameters() if p.is_floating_point()), torch.float32)  # fp64 training
    layout = torch.contiguous_format
    if not sequences and channels_last_features(encoder, device, dtype):
        layout = torch.channels_last  # NHWC input: oneDNN's faster convolutions (the encoder's weights as they are)
    with eval_mode(encoder), autocast(device, precision):
        for start in range(0, len(images_uint8), batch_size):
            batch = images_uint8[start : start + batch_size].to(device, non_blocking=True)
            x = batch if sequences else normalise(batch, mean_t, std_t).contiguous(memory_format=layout)
            feats = encoder(x.to(dtype))  # [B, dim]
            chunks.append(feats.float().cpu())
    return torch.cat(chunks)  # [N, dim]


def raw_pixel_features(images_uint8: torch.Tensor) -> torch.Tensor:
    """Flattened pixels in [0, 1]: uint8 ``[N, 3, H, W]`` -> float32 ``[N, 3·H·W]``.

    The raw-pixel baseline: what kNN / a linear probe reach with no encoder at all.
    """
    check_images(images_uint8)
    return images_uint8.reshape(len(images_uint8), -1).float().div_(255)  # [N, 3·H·W]
