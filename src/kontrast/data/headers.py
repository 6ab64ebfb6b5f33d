"""Image checks from the header alone: format, size and completeness, without decoding a pixel.

The shard writer and the shard index pass (:mod:`kontrast.data.shard_writer`,
:mod:`kontrast.data.shard_index`) look at every image once; decoding them all there would cost
as much as an epoch. PIL's ``Image.open`` reads only the header (format, width, height), and the
decompression-bomb limit is the memory path's (:data:`kontrast.data.decode.MAX_IMAGE_PIXELS`).
Truncation is caught without decoding where the format has an end marker: a JPEG must have its
end-of-image marker (``FF D9``) after its first start-of-scan (``FF DA``; entropy-coded data
never holds ``FF D9``, so a cut file lacks it), a PNG its ``IEND`` chunk.

What the header cannot show (bytes garbled inside the scan data of an otherwise well-formed
file) is only found by decoding; the streaming path reports such a file when it meets it.
"""

from __future__ import annotations

import io
import warnings

from PIL import Image, UnidentifiedImageError

from kontrast.data.decode import MAX_IMAGE_PIXELS

_JPEG_SOS, _JPEG_EOI = b"\xff\xda", b"\xff\xd9"
# Member and file extensions for PIL's format names (what a shard's image member is called)
FORMAT_EXTENSIONS = {"JPEG": "jpg", "PNG": "png", "WEBP": "webp", "BMP": "bmp", "GIF": "gif", "TIFF": "tiff",
                     "PPM": "ppm", "MPO": "jpg"}  # MPO: a JPEG with extra frames (phone cameras)


def check_image_header(data: bytes) -> tuple[str, int, int] | str:
    """``(format, width, height)`` of the image in ``data``, read from its header; else why it is unusable.

    The reasons are one line each, in the words the memory path uses (:mod:`kontrast.data.decode`),
    so :func:`kontrast.data.decode.report_bad_images` can name the files.
    """
    if not data:
        return "empty file (0 bytes)"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # PIL's DecompressionBombWarning: the limit is checked below
            with Image.open(io.BytesIO(data)) as im:  # reads the header only
                fmt, (width, height) = im.format or "", im.size
    except UnidentifiedImageError:
        return "not a recognised image format"
    except Image.DecompressionBombError:  # PIL refuses above twice its limit, before we see the size
        return f"over the decompression-bomb limit of {MAX_IMAGE_PIXELS} pixels (not decoded)"
    except Exception as exc:  # PIL raises many types for bad headers (OSError, SyntaxError, ...)
        return " ".join(f"{type(exc).__name__}: {exc}".split())  # one line
    if width * height > MAX_IMAGE_PIXELS:
        return f"{width}x{height} pixels, over the decompression-bomb limit of {MAX_IMAGE_PIXELS} (not decoded)"
    if width < 1 or height < 1:
        return f"{width}x{height} pixels: an empty image"
    truncated = _truncated(fmt, data)
    return truncated if truncated else (fmt, width, height)


def _truncated(fmt: str, data: bytes) -> str | None:
    """Why ``data`` is cut short, judged from its end markers; None when it looks complete."""
    if fmt in ("JPEG", "MPO"):
        scan = data.find(_JPEG_SOS)
        if scan < 0 or data.rfind(_JPEG_EOI) < scan:
            return "truncated JPEG: no end-of-image marker after its image data (not decoded)"
    if fmt == "PNG" and data.rfind(b"IEND") < 0:
        return "truncated PNG: no IEND chunk (not decoded)"
    return None


def image_extension(fmt: str) -> str:
    """The member extension for a PIL format name (``"JPEG"`` -> ``"jpg"``); ``"img"`` for the rare rest."""
    return FORMAT_EXTENSIONS.get(fmt, fmt.lower() or "img")
