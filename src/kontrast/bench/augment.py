"""Augmentation throughput: kontrast's batched ``make_views`` against torchvision's PIL pipeline.

Both run one thread (``torch.set_num_threads(1)``) on the same images and the same recipe;
a figure is source images per second through *every* view of the recipe (SimCLR: two views).
torchvision starts from decoded PIL images (the JPEG decoding the peer also pays is left out,
in its favour) and ends with a normalised float tensor, as a DataLoader worker would.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import replace

import torch
from torch import Tensor

from kontrast.augment import SampleRNG, ViewSpec, derive_key, get_recipe, key_tensor, make_views, view_maker
from kontrast.augment.spec import SOLARIZE_THRESHOLD, blur_kernel_for


def resolved_recipe(name: str, size: int) -> tuple[ViewSpec, ...]:
    """The recipe's specs at ``size`` pixels (times each view's ``size_factor``), as a run resolves them."""
    return tuple(replace(s, size=max(1, round(size * s.size_factor))) for s in get_recipe(name))


def torchvision_pipeline(spec: ViewSpec):
    """The torchvision v2 transform (PIL in, normalised float tensor out) of one ``ViewSpec``.

    Same ops, parameters and order as :func:`kontrast.augment.views.make_view`. RandAugment is
    torchvision's (its magnitude bins differ from PyContrast's), AMDIM's translation is reflect
    padding + random crop; both match in cost, not bit for bit.
    """
    from torchvision.transforms import v2

    t: list = [v2.RandomResizedCrop(spec.size, scale=spec.crop_scale, ratio=spec.crop_ratio, antialias=True)]
    if spec.translate_p > 0 and spec.translate > 0:
        t.append(v2.RandomApply([v2.Pad(spec.translate, padding_mode="reflect"), v2.RandomCrop(spec.size)],
                                p=spec.translate_p))
    if spec.flip_p > 0:
        t.append(v2.RandomHorizontalFlip(spec.flip_p))
    if spec.jitter_p > 0 and any(v > 0 for v in spec.jitter):
        t.append(v2.RandomApply([v2.ColorJitter(*spec.jitter)], p=spec.jitter_p))
    if spec.gray_p > 0:
        t.append(v2.RandomGrayscale(spec.gray_p))
    if spec.blur_p > 0:
        t.append(v2.RandomApply([v2.GaussianBlur(spec.blur_kernel or blur_kernel_for(spec.size), spec.blur_sigma)],
                                p=spec.blur_p))
    if spec.randaugment_n > 0:
        t.append(v2.RandAugment(num_ops=spec.randaugment_n, magnitude=round(spec.randaugment_m * 3)))
    t += [v2.ToImage(), v2.ToDtype(torch.float32, scale=True)]
    if spec.solarize_p > 0:
        t.append(v2.RandomSolarize(SOLARIZE_THRESHOLD, p=spec.solarize_p))
    t.append(v2.Normalize(list(spec.mean), list(spec.std)))
    return v2.Compose(t)


def _timed(fn, min_seconds: float, min_iters: int) -> tuple[float, int]:
    """Run ``fn`` (after one warm-up call) until both limits are reached; (seconds, iterations)."""
    fn()
    iters, start = 0, time.perf_counter()
    while iters < min_iters or time.perf_counter() - start < min_seconds:
        fn()
        iters += 1
    return time.perf_counter() - start, iters


def augment_throughput(images: Tensor, recipes: list[str], *, batch: int, seconds: float, pil_images: int = 128,
                       rounds: int = 3, device: str = "cpu", compiled: bool = False) -> list[dict]:
    """images/s per thread of each recipe: ours (``make_views``, one batch) vs torchvision (per image).

    images: uint8 [N, 3, H, W] (N >= batch); the first ``pil_images`` go through torchvision.
    ``seconds`` per side and recipe, split into ``rounds`` alternating rounds (medians reported).
    ``compiled``: also ours under ``torch.compile`` (:func:`~kontrast.augment.view_maker`, as
    ``train.compile`` runs it), in the same rounds; its first call's time is ``compile_s``.
    """
    from torchvision.transforms.v2 import functional as TF

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        size = images.shape[-1]
        x, ids = images[:batch].to(device), torch.arange(batch, device=device)  # ours on the device, PIL on the host
        sync = torch.cuda.synchronize if x.device.type == "cuda" else (lambda: None)
        pil = [TF.to_pil_image(img) for img in images[:pil_images]]
        rows = []
        for name in recipes:
            specs = resolved_recipe(name, size)
            key = derive_key("bench", name)
            pipes = [torchvision_pipeline(s) for s in specs]
            row: dict = {}
            if compiled:
                # every recipe compiles the same function: without a reset the 9th recipe hits dynamo's
                # recompile limit and silently runs eager
                torch._dynamo.reset()
                fast, key_t = view_maker(specs, compile=True), key_tensor(key, device)
                start = time.perf_counter()
                fast(x, ids, key_t), sync()
                row["compile_s"] = round(time.perf_counter() - start, 1)
            ours, theirs, comp = [], [], []
            for _ in range(rounds):  # alternate, so a change in machine load hits both sides alike
                took, n = _timed(lambda: (make_views(x, specs, SampleRNG(key, ids)), sync()), seconds / rounds, 2)
                ours.append(batch * n / took)
                took, n = _timed(lambda: [p(img) for img in pil for p in pipes], seconds / rounds, 1)
                theirs.append(len(pil) * n / took)
                if compiled:
                    took, n = _timed(lambda: (fast(x, ids, key_t), sync()), seconds / rounds, 2)
                    comp.append(batch * n / took)
            ours, theirs = statistics.median(ours), statistics.median(theirs)
            if compiled:
                row.update(compiled_img_per_s=round(statistics.median(comp), 1),
                           compiled_ratio=round(statistics.median(comp) / theirs, 2))
            rows.append({"recipe": name, "views": len(specs), "ours_img_per_s": round(ours, 1),
                         "torchvision_img_per_s": round(theirs, 1), "ratio": round(ours / theirs, 2), **row})
        return rows
    finally:
        torch.set_num_threads(threads)
