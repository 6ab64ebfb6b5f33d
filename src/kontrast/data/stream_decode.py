"""Decode one image at its views' crops: the recipe's first op, the random resized crop, done at decode time.

The memory path crops from an image already shrunk to ``data.size``; here each view's crop box is drawn on
the full image (so RandomResizedCrop sees the whole photo, as in the papers) and only that box is resized to
the view's side. The box is drawn exactly as the memory path draws it on the device
(:func:`kontrast.augment.ops.sample_resized_crop` through a :class:`~kontrast.augment.rng.SampleRNG` keyed by
(seed, epoch), the sample's number and the view), so it depends on nothing else: not on the worker that
decodes it, nor on the batch, nor on where a run resumed. The device then applies the rest of the recipe,
drawing from the same per-(sample, view) stream after the crop's draws (``view_maker(..., cropped=True)``).

Decoding is PIL's, with JPEG draft mode: when every crop of the image is at least 2x (4x, 8x) the view's
side, libjpeg decodes at 1/2 (1/4, 1/8) scale, skipping most of the inverse DCT work (the GUIDE's hint; the
resize from the reduced image stays an antialiased bilinear, ``Image.resize`` with a box). Guards are the
memory path's: the decompression-bomb limit from the header before any pixel is decoded, any PIL mode to
RGB as :func:`kontrast.data.decode.pil_to_rgb_array` does, and a bad file returns its reason, never raises.
"""

from __future__ import annotations

import io
import math
import warnings
from typing import Sequence

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError

from kontrast.augment.ops import sample_resized_crop
from kontrast.augment.rng import SampleRNG
from kontrast.augment.views import ViewSpec
from kontrast.data.decode import _too_large, pil_to_rgb_array

MAX_DRAFT = 8  # libjpeg's smallest scale is 1/8


def crop_boxes(key: int, sample: int, height: int, width: int, specs: Sequence[ViewSpec]) -> torch.Tensor:
    """float ``[V, 4]`` (top, left, h, w) per view on a ``height x width`` image: the boxes the device would draw."""
    rng = SampleRNG(key, torch.tensor([sample], dtype=torch.int64))
    return torch.cat([sample_resized_crop(1, height, width, s.crop_scale, s.crop_ratio, rng.for_view(v))
                      for v, s in enumerate(specs)])  # [V, 4]


def batch_crop_boxes(key: int, samples: torch.Tensor, heights: torch.Tensor, widths: torch.Tensor,
                     specs: Sequence[ViewSpec], tries: int = 10) -> torch.Tensor:
    """float ``[B, V, 4]``: :func:`crop_boxes` of every sample at once, each on its own ``heights[b] x widths[b]``.

    The per-sample op count of :func:`crop_boxes` (about 0.9 ms of small tensor ops per sample for 2 views)
    cost as much as decoding a 256-px JPEG; here it is one pass per batch. Bit for bit the same boxes: the same
    uniforms (``SampleRNG`` of the batch's ids), the same float32 arithmetic with the sizes as ``[B, 1]`` tensors
    instead of scalars, and torchvision's central-crop fallback in Python per sample, as the scalar code has it.
    """
    rng = SampleRNG(key, samples.to(torch.int64))
    h_in, w_in = heights.to(torch.float32)[:, None], widths.to(torch.float32)[:, None]  # [B, 1]
    out = []
    for v, spec in enumerate(specs):
        (s0, s1), (r0, r1) = spec.crop_scale, spec.crop_ratio
        u = rng.for_view(v).rand((len(samples), tries, 4))  # [B, T, 4]: area, ratio, top, left draws
        target_area = (h_in * w_in) * (s0 + (s1 - s0) * u[..., 0])  # [B, T]
        aspect = torch.exp(math.log(r0) + (math.log(r1) - math.log(r0)) * u[..., 1])  # [B, T]
        w = torch.round(torch.sqrt(target_area * aspect))  # [B, T]
        h = torch.round(torch.sqrt(target_area / aspect))  # [B, T]
        fits = (w > 0) & (w <= w_in) & (h > 0) & (h <= h_in)  # [B, T]
        first = fits.to(torch.int32).argmax(dim=1, keepdim=True)  # [B, 1]
        h, w = h.gather(1, first)[:, 0], w.gather(1, first)[:, 0]  # [B]
        u_top, u_left = u[..., 2].gather(1, first)[:, 0], u[..., 3].gather(1, first)[:, 0]  # [B]
        top = torch.minimum(torch.floor(u_top * (h_in[:, 0] - h + 1)), h_in[:, 0] - h)  # [B]
        left = torch.minimum(torch.floor(u_left * (w_in[:, 0] - w + 1)), w_in[:, 0] - w)  # [B]
        boxes = torch.stack([top, left, h, w], dim=1)  # [B, 4]
        found = fits.any(dim=1)  # [B]
        if not bool(found.all()):
            fallback = torch.tensor([_central(int(hh), int(ww), spec.crop_ratio) for hh, ww in zip(heights, widths)])
            boxes = torch.where(found[:, None], boxes, fallback.to(boxes.dtype))
        out.append(boxes)
    return torch.stack(out, dim=1)  # [B, V, 4]


def _central(height: int, width: int, ratio: tuple[float, float]) -> list[float]:
    """torchvision's fallback when no try fits: the largest centred crop within the ratio range (top, left, h, w)."""
    in_ratio = width / height
    if in_ratio < min(ratio):
        fb_w, fb_h = width, int(round(width / min(ratio)))
    elif in_ratio > max(ratio):
        fb_h, fb_w = height, int(round(height * max(ratio)))
    else:
        fb_w, fb_h = width, height
    return [float((height - fb_h) // 2), float((width - fb_w) // 2), float(fb_h), float(fb_w)]


def draft_factor(boxes: torch.Tensor, specs: Sequence[ViewSpec]) -> int:
    """The largest power of 2 (up to 8) by which every view's crop can shrink and still cover its side."""
    factor = MAX_DRAFT
    for (_, _, h, w), spec in zip(boxes.tolist(), specs):
        while factor > 1 and min(h, w) / factor < spec.size:
            factor //= 2
    return factor


def image_size(data: bytes) -> tuple[int, int] | str:
    """``(width, height)`` from the image's header (nothing decoded), or why the bytes are not a usable image."""
    if not data:
        return "empty file (0 bytes)"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # PIL's DecompressionBombWarning: the limit is checked below
            with Image.open(io.BytesIO(data)) as im:  # reads the header only
                width, height = im.size
    except UnidentifiedImageError:
        return "not a recognised image format"
    except Exception as exc:  # PIL raises many types for bad headers (OSError, SyntaxError, ...)
        return " ".join(f"{type(exc).__name__}: {exc}".split())
    return _too_large(height, width) or (width, height)


def decode_views(data: bytes, key: int, sample: int, specs: Sequence[ViewSpec]) -> list[torch.Tensor] | str:
    """uint8 ``[3, S_v, S_v]`` per view (``S_v = specs[v].size``) of the image in ``data``, each its own crop
    keyed by (key, sample, view); else the reason the bytes are not a usable image (one line)."""
    size = image_size(data)
    if isinstance(size, str):
        return size
    return decode_crops(data, crop_boxes(key, sample, size[1], size[0], specs), specs)


def decode_crops(data: bytes, boxes: torch.Tensor, specs: Sequence[ViewSpec]) -> list[torch.Tensor] | str:
    """The crops ``boxes`` (float ``[V, 4]`` top, left, h, w in the full image's pixels) of the image in ``data``,
    each resized to uint8 ``[3, S_v, S_v]``; else the reason the image cannot be decoded (one line)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # PIL's per-file chatter; the bomb limit was checked from the header
            with Image.open(io.BytesIO(data)) as im:  # reads the header only
                width, height = im.size
                factor = draft_factor(boxes, specs)
                if factor > 1 and im.format in ("JPEG", "MPO"):
                    im.draft("RGB", (width // factor, height // factor))  # decode at 1/factor scale (or finer)
                im.load()  # truncated and corrupt files fail here
                rgb = im if im.mode == "RGB" else Image.fromarray(pil_to_rgb_array(im))
                sx, sy = width / rgb.width, height / rgb.height  # source pixels per decoded pixel
                return [_crop(rgb, box, sx, sy, spec.size) for box, spec in zip(boxes.tolist(), specs)]
    except UnidentifiedImageError:
        return "not a recognised image format"
    except Exception as exc:  # PIL raises many types for bad files (OSError, SyntaxError, ...)
        return " ".join(f"{type(exc).__name__}: {exc}".split())


def _crop(im: Image.Image, box: list[float], sx: float, sy: float, size: int) -> torch.Tensor:
    """The box (top, left, h, w in source pixels) of ``im`` resized to uint8 ``[3, size, size]`` (antialiased)."""
    top, left, h, w = box
    region = (left / sx, top / sy, (left + w) / sx, (top + h) / sy)
    out = np.asarray(im.resize((size, size), Image.Resampling.BILINEAR, box=region))  # uint8 [S, S, 3]
    return torch.from_numpy(out.copy()).permute(2, 0, 1).contiguous()  # uint8 [3, S, S]
