"""Decoding with its guards: file bytes -> RGB uint8 ``[3, size, size]``, and what to do with bad files.

JPEGs go through ``torchvision.io.decode_jpeg`` on lists of 256 (about 4x faster than PIL here:
34 vs 132 us per 32x32 CIFAR JPEG); everything else, and any JPEG that torchvision refuses, goes
through PIL. Thread and process pools did not pay on 2 cores. Every image becomes RGB uint8 at
``size`` x ``size`` (shorter side resized with bilinear antialiasing, then centre-cropped).

Guards: only regular files up to ``MAX_FILE_BYTES`` are read, and images over ``MAX_IMAGE_PIXELS``
(decompression bombs) are refused from their header, before any pixel is decoded. A bad file
never raises here: it gets a reason, and :func:`report_bad_images` refuses or skips them all at once.
"""

from __future__ import annotations

import io
import stat
import warnings
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError
from torchvision.transforms import InterpolationMode
from torchvision.transforms.v2 import functional as TF

from kontrast.errors import UserError

try:  # deprecated since torchvision 0.29 (TorchCodec replaces it); PIL decodes all without it
    from torchvision.io import ImageReadMode, decode_jpeg
except ImportError:  # pragma: no cover - depends on the installed torchvision
    decode_jpeg = None

_DECODE_CHUNK = 256  # images per torchvision decode call
_BAD_SHOWN = 10  # unreadable paths named in the error message
_JPEG_MAGIC = b"\xff\xd8\xff"
# Decompression-bomb guard: PIL's own threshold (it only warns between 1x and 2x of it, and
# torchvision's JPEG decoder has none: a 30000x30000 header would allocate 2.7 GB). Larger images
# are reported as unreadable before any pixel is decoded.
MAX_IMAGE_PIXELS = 89_478_485
MAX_FILE_BYTES = 512 << 20  # larger files are not images to train on (and a link to /dev/zero has no end)

Blob = tuple[str, bytes]  # (path inside the source, file bytes)


def read_regular_file(path: Path) -> bytes | str:
    """The bytes of ``path`` (symbolic links followed), or why they cannot be used.

    Only regular files up to MAX_FILE_BYTES are read: a link to a device (``/dev/zero``) or a FIFO
    would never end or never answer; a symbolic-link loop or a dangling link is an OS error.
    """
    try:
        info = path.stat()
    except OSError as exc:
        return f"cannot read it: {exc.strerror or exc}"
    if not stat.S_ISREG(info.st_mode):
        return "not a regular file (a device, FIFO or socket)"
    if info.st_size > MAX_FILE_BYTES:
        return f"{info.st_size} bytes, larger than the {MAX_FILE_BYTES >> 20} MiB limit for an image file"
    try:
        with open(path, "rb") as f:
            return f.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        return f"cannot read it: {exc.strerror or exc}"


def report_bad_images(
    bad: list[tuple[str, str]], where: str, skip_bad: bool, *,
    locate: Callable[[str], str] = str, stacklevel: int = 2,
) -> None:
    """Refuse unreadable files (UserError) or, when skipping, warn about them.

    ``bad``: (path, reason) pairs; ``where``: the source as the user gave it; ``locate(path)``:
    how to name a file in the message; ``stacklevel``: the warning's, so it names the caller of
    ``load_images``.
    """
    shown = ", ".join(locate(path) for path, _ in bad[:_BAD_SHOWN])
    more = f" and {len(bad) - _BAD_SHOWN} more" if len(bad) > _BAD_SHOWN else ""
    if skip_bad:
        warnings.warn(
            f"skipped {len(bad)} unreadable image file(s) in {where}: {shown}{more}",
            stacklevel=stacklevel,
        )
        return
    raise UserError(
        f"{len(bad)} unreadable image file(s) in {where}: {shown}{more} "
        f"(first error: {bad[0][1]}); fix or remove them, or pass --skip-bad-images"
    )


def decode_blobs(
    blobs: Iterable[Blob], size: int
) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Decode ``(path, bytes)`` pairs to RGB uint8 ``[3, size, size]``, in chunks.

    Returns ``(images, bad)``: path -> image for the readable files, path -> reason for the
    rest. Never raises for a bad file, so every bad file can be reported at once.
    """
    images: dict[str, torch.Tensor] = {}
    bad: dict[str, str] = {}
    for chunk in _chunks(blobs, _DECODE_CHUNK):
        for path, result in _decode_chunk(chunk, size):
            if isinstance(result, str):
                bad[path] = result
            else:
                images[path] = result
    return images, bad


def _chunks(items: Iterable[Blob], n: int) -> Iterator[list[Blob]]:
    chunk: list[Blob] = []
    for item in items:
        chunk.append(item)
        if len(chunk) == n:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _decode_chunk(chunk: list[Blob], size: int) -> list[tuple[str, torch.Tensor | str]]:
    """JPEGs through torchvision in one call, the rest (and any it refuses) through PIL."""
    bombs = {i: _too_large(*_jpeg_size(data)) for i, (_, data) in enumerate(chunk) if data.startswith(_JPEG_MAGIC)}
    bombs = {i: why for i, why in bombs.items() if why}  # never handed to a decoder
    jpegs = [i for i, (_, data) in enumerate(chunk) if data.startswith(_JPEG_MAGIC) and i not in bombs]
    decoded: dict[int, torch.Tensor | None] = dict(
        zip(jpegs, _decode_jpegs([chunk[i][1] for i in jpegs]))
    )
    results: list[tuple[str, torch.Tensor | str]] = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # PIL's per-file chatter (EXIF, palettes, ...)
        for i, (path, data) in enumerate(chunk):
            image = decoded.get(i)
            if i in bombs:
                result = bombs[i]
            else:
                result = _decode_with_pil(data) if image is None else image
            results.append((path, result if isinstance(result, str) else fit_image(result, size)))
    return results


def _decode_jpegs(datas: list[bytes]) -> list[torch.Tensor | None]:
    """RGB uint8 ``[3, H, W]`` per JPEG, None where torchvision cannot decode it."""
    if not datas or decode_jpeg is None:
        return [None] * len(datas)
    joined = torch.frombuffer(bytearray(b"".join(datas)), dtype=torch.uint8)  # one copy
    tensors = list(joined.split([len(d) for d in datas]))  # uint8 [file bytes] each
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "The image decoding", DeprecationWarning)
        try:
            return list(decode_jpeg(tensors, mode=ImageReadMode.RGB))
        except RuntimeError:  # one bad file fails the whole call: retry one by one
            return [_decode_one_jpeg(t) for t in tensors]


_SOF_MARKERS = frozenset({0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF})


def _jpeg_size(data: bytes) -> tuple[int, int]:
    """(height, width) from a JPEG's frame header, read without decoding; (0, 0) if none is found."""
    i = 2
    while i + 9 < len(data):
        if data[i] != 0xFF:
            return 0, 0
        marker = data[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker in _SOF_MARKERS:
            return int.from_bytes(data[i + 5 : i + 7], "big"), int.from_bytes(data[i + 7 : i + 9], "big")
        if marker == 0xDA:  # start of scan before any frame header: not a valid JPEG
            return 0, 0
        if marker == 0x01 or 0xD0 <= marker <= 0xD8:  # markers without a length
            i += 2
            continue
        i += 2 + int.from_bytes(data[i + 2 : i + 4], "big")
    return 0, 0


def _too_large(height: int, width: int) -> str | None:
    if height * width > MAX_IMAGE_PIXELS:
        return (f"{width}x{height} pixels, over the decompression-bomb limit of {MAX_IMAGE_PIXELS} "
                "(not decoded)")
    return None


def _decode_one_jpeg(data: torch.Tensor) -> torch.Tensor | None:
    try:
        return decode_jpeg(data, mode=ImageReadMode.RGB)  # uint8 [3, H, W]
    except RuntimeError:  # corrupt, truncated, or an image extension that failed to load
        return None


def _decode_with_pil(data: bytes) -> torch.Tensor | str:
    """RGB uint8 ``[3, H, W]``, or the reason the bytes are not a readable image."""
    if not data:
        return "empty file (0 bytes)"
    try:
        with Image.open(io.BytesIO(data)) as im:  # reads the header only
            too_large = _too_large(im.height, im.width)
            if too_large:
                return too_large
            im.load()  # decode now: truncated and corrupt files fail here
            rgb = pil_to_rgb_array(im)  # uint8 [H, W, 3]
    except UnidentifiedImageError:
        return "not a recognised image format"
    except Exception as exc:  # PIL raises many types for bad files (OSError, SyntaxError, ...)
        return " ".join(f"{type(exc).__name__}: {exc}".split())  # one line
    return torch.from_numpy(rgb).permute(2, 0, 1).contiguous()


def pil_to_rgb_array(im: Image.Image) -> np.ndarray:
    """Any PIL mode as uint8 ``[H, W, 3]``.

    16- and 32-bit integer images keep their top 8 bits (PIL's own convert would clip them
    to white); float images are taken as [0, 1] when they fit there, else as [0, 255].
    Alpha is dropped, like ``convert("RGB")``.
    """
    if im.mode.startswith("I"):
        a = np.asarray(im).astype(np.int64)  # [H, W]
        if im.mode.startswith("I;16") or a.max(initial=0) > 255:
            a = np.clip(a, 0, 65535) >> 8
        return np.repeat(np.clip(a, 0, 255).astype(np.uint8)[..., None], 3, axis=2)
    if im.mode == "F":
        a = np.asarray(im).astype(np.float64)  # [H, W]
        if a.max(initial=0) <= 1.0:
            a = a * 255
        return np.repeat(np.clip(np.round(a), 0, 255).astype(np.uint8)[..., None], 3, axis=2)
    if im.mode in ("P", "PA") and "transparency" in im.info:
        im = im.convert("RGBA")  # PIL wants palette transparency resolved through RGBA
    return np.asarray(im.convert("RGB"))


def fit_image(image: torch.Tensor, size: int) -> torch.Tensor:
    """uint8 ``[C, H, W]`` -> ``[C, size, size]``: shorter side to ``size``, centre crop."""
    if image.shape[-2] == size and image.shape[-1] == size:
        return image
    image = TF.resize(image, [size], interpolation=InterpolationMode.BILINEAR, antialias=True)
    return TF.center_crop(image, [size, size]).contiguous()


def fit_batch(images: torch.Tensor, size: int) -> torch.Tensor:
    """uint8 ``[N, 3, H, W]`` -> ``[N, 3, size, size]`` in chunks (same rule as fit_image)."""
    if images.shape[-1] == size and images.shape[-2] == size:
        return images.contiguous()
    return torch.cat([fit_image(part, size) for part in images.split(4096)])
