"""Decode one image at its views' crops: the recipe's first op, the random resized crop, done at decode time.

The memory path crops from an image already shrunk to ``data.size``; here each view's crop box is drawn on
the full image (so RandomResizedCrop sees the whole photo, as in the papers) and only that box is resized to
the view's side. The box is drawn exactly as the memory path draws it on the device
(:func:`kontrast.augment.ops.sample_resized_crop` through a :class:`~kontrast.augment.rng.SampleRNG` keyed by
(seed, epoch), the sample's number and the view), so it depends on nothing else: not on the worker that
decodes it, nor on the batch, nor on where a run resumed. The device then applies the rest of the recipe,
drawing from the same per-(sample, view) stream after the crop's draws (``view_maker(..., cropped=True)``).

Two decoders, each where it was measured faster (docs/lab/performance.md, "Streaming"): when every crop of the image
is at least 2x (4x, 8x) the view's side, PIL's JPEG draft mode has libjpeg decode at 1/2 (1/4, 1/8) scale,
skipping most of the inverse DCT work, and ``Image.resize`` with a box resizes each crop (antialiased bilinear);
a JPEG that must be decoded at full scale goes to ``torchvision.io.decode_jpeg`` and torchvision's antialiased
``resized_crop`` of the uint8 tensor (1.3-1.8x PIL's full-scale decode and resize from 256-px JPEGs to 96 and
224 px). Other formats and modes are PIL's. Which decoder an image takes depends only on its boxes, so a sample
is decoded alike in every run. Guards are the
memory path's: the decompression-bomb limit from the header before any pixel is decoded, any PIL mode to
RGB as :func:`kontrast.data.decode.pil_to_rgb_array` does, and a bad file returns its reason, never raises.
"""

from __future__ import annotations

import io
import warnings
from collections.abc import Sequence

import numpy as np
import torch
import torchvision.transforms.v2.functional as TF
from PIL import Image, UnidentifiedImageError
from torchvision.io import ImageReadMode, decode_jpeg

from kontrast.augment.ops import sample_resized_crop
from kontrast.augment.rng import SampleRNG
from kontrast.augment.views import ViewSpec
from kontrast.data.decode import pil_to_rgb_array
from kontrast.data.headers import check_image_header

MAX_DRAFT = 8  # libjpeg's smallest scale is 1/8
MIN_DRAFT = 2  # the smallest reduction worth PIL's draft decode over torchvision's full-scale one
FULL_SCALE_JPEG = "torchvision"  # the decoder of JPEGs no crop lets draft mode shrink: "torchvision" or "pil"


def crop_boxes(key: int, sample: int, height: int, width: int, specs: Sequence[ViewSpec]) -> torch.Tensor:
    """float ``[V, 4]`` (top, left, h, w) per view on a ``height x width`` image: the boxes the device would draw."""
    rng = SampleRNG(key, torch.tensor([sample], dtype=torch.int64))
    return torch.cat([sample_resized_crop(1, height, width, s.crop_scale, s.crop_ratio, rng.for_view(v))
                      for v, s in enumerate(specs)])  # [V, 4]


def batch_crop_boxes(key: int, samples: torch.Tensor, heights: torch.Tensor, widths: torch.Tensor,
                     specs: Sequence[ViewSpec]) -> torch.Tensor:
    """float ``[B, V, 4]``: :func:`crop_boxes` of every sample at once, each on its own ``heights[b] x widths[b]``.

    Drawn per sample, the boxes cost about 0.9 ms of small tensor ops (2 views), as much as decoding a 256-px
    JPEG; here one pass per batch (about 10 us a sample), the same boxes bit for bit (tested).
    """
    rng = SampleRNG(key, samples.to(torch.int64))
    return torch.stack([sample_resized_crop(len(samples), heights, widths, s.crop_scale, s.crop_ratio, rng.for_view(v))
                        for v, s in enumerate(specs)], dim=1)  # [B, V, 4]


def draft_factor(boxes: torch.Tensor, specs: Sequence[ViewSpec]) -> int:
    """The largest power of 2 (up to 8) by which every view's crop can shrink and still cover its side."""
    factor = MAX_DRAFT
    for (_, _, h, w), spec in zip(boxes.tolist(), specs):
        while factor > 1 and min(h, w) / factor < spec.size:
            factor //= 2
    return factor


def image_size(data: bytes) -> tuple[int, int] | str:
    """``(width, height)`` from the image's header (nothing decoded), or why the bytes are not a usable image: the
    index pass's check (:func:`kontrast.data.headers.check_image_header`), so both name a bad file alike."""
    checked = check_image_header(data)
    return checked if isinstance(checked, str) else (checked[1], checked[2])


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
                full_scale = factor < MIN_DRAFT and FULL_SCALE_JPEG == "torchvision"
                if full_scale and im.format == "JPEG" and im.mode in ("RGB", "L"):
                    return _full_scale_crops(data, boxes, specs)
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


def _full_scale_crops(data: bytes, boxes: torch.Tensor, specs: Sequence[ViewSpec]) -> list[torch.Tensor]:
    """A JPEG decoded at full scale by torchvision.io, each box resized by torchvision (uint8 ``[3, S, S]``)."""
    image = decode_jpeg(torch.frombuffer(bytearray(data), dtype=torch.uint8), mode=ImageReadMode.RGB)  # [3, H, W]
    return [TF.resized_crop(image, *map(int, box), [spec.size, spec.size], antialias=True)
            for box, spec in zip(boxes.tolist(), specs)]


def _crop(im: Image.Image, box: list[float], sx: float, sy: float, size: int) -> torch.Tensor:
    """The box (top, left, h, w in source pixels) of ``im`` resized to uint8 ``[3, size, size]`` (antialiased)."""
    top, left, h, w = box
    region = (left / sx, top / sy, (left + w) / sx, (top + h) / sy)
    out = np.asarray(im.resize((size, size), Image.Resampling.BILINEAR, box=region))  # uint8 [S, S, 3]
    return torch.from_numpy(out.copy()).permute(2, 0, 1).contiguous()  # uint8 [3, S, S]
