"""The side of a source's images as stored, read from a few file headers: what ``data.size: auto`` follows.

A folder of photos and CIFAR-10 want different training resolutions (and ResNet stems): the run plan asks
:func:`native_side` and decides (:func:`kontrast.decisions.auto_size`). Only headers are read (PIL opens an
image lazily), of the first :data:`SAMPLED` image files in sorted path order (a tar's member order), so the
answer costs milliseconds on any size of dataset and is the same on every process of a run.
"""

from __future__ import annotations

import io
import os
import statistics
import tarfile
import warnings
from collections.abc import Iterator
from pathlib import Path

from PIL import Image

from kontrast.data.layout import is_image_path
from kontrast.data.remote import is_url
from kontrast.errors import UserError
from kontrast.registry import SOURCES

SAMPLED = 16  # image headers read
BUILTIN_SIDE = 32  # the built-in shapes and CIFAR pickles: 32 px images


def native_side(source: str, cache_dir: str | None = None) -> int | None:
    """Median shorter side, in pixels, of the first images of ``source``; None for a source without image files
    (sequences) or whose images could not be read (the data loader reports those). ``cache_dir``: the run's
    ``data.cache_dir``, where shards at a URL are indexed."""
    kind = source_kind(source)
    if kind == "sequences":
        return None
    if kind in ("shapes", "cifar"):
        return BUILTIN_SIDE
    sides = [min(size) for size in _image_sizes(source, kind, cache_dir)]
    return int(statistics.median_low(sides)) if sides else None


def source_kind(source: str) -> str | None:
    """The registered kind of source that ``load_images`` would read ``source`` with (None: no match)."""
    for name in sorted(SOURCES.names(), key=lambda n: (SOURCES.get(n).order, n)):
        if SOURCES.get(name).matches(source):
            return name
    return None


def _image_sizes(source: str, kind: str | None, cache_dir: str | None) -> Iterator[tuple[int, int]]:
    path = Path(source).expanduser()
    if kind == "pairs":
        from kontrast.data.pairs import read_pairs

        try:
            rows = read_pairs(path)[:SAMPLED]
        except UserError:
            return
        blobs = (_read(path.parent / row["image"]) for row in rows)
    elif kind == "shards" and is_url(source):
        blobs = _remote_images(source, cache_dir)
    elif kind == "shards":
        from kontrast.data.shard_index import shard_files

        try:
            first = shard_files(source)[:1]
        except UserError:  # the loader says what is wrong with the shards
            return
        blobs = (blob for shard in first for blob in _tar_images(shard))
    elif kind == "tar":
        blobs = _tar_images(path)
    elif kind == "folder":
        blobs = (_read(file) for file in _folder_images(path))
    else:
        return
    for n, blob in enumerate(blobs):
        if n == SAMPLED:
            return
        try:
            yield Image.open(io.BytesIO(blob)).size  # the header only
        except (OSError, ValueError, Image.DecompressionBombError):
            continue


def _read(file: Path) -> bytes:
    try:
        with open(file, "rb") as f:
            return f.read(1 << 16)  # a header fits (JPEG's SOF, PNG's IHDR sit near the start)
    except OSError:
        return b""


def _folder_images(root: Path) -> Iterator[Path]:
    """Image files under ``root`` depth first in sorted order, lazily (a large folder is not listed whole)."""
    try:
        entries = sorted(os.scandir(root), key=lambda e: e.name)
    except OSError:
        return
    for entry in entries:
        if entry.is_dir(follow_symlinks=True) and not entry.name.startswith("."):
            yield from _folder_images(Path(entry.path))
        elif is_image_path(entry.name):
            yield Path(entry.path)


def _remote_images(source: str, cache_dir: str | None) -> Iterator[bytes]:
    """The first images of shards at a URL, through their index: the run's index pass (shards copied into the
    shard cache, the index recorded) happens here, and the loader's later opens read its records. A UserError
    (a missing shard, a refusal, a server that stays down after its retries) is raised here, as the loader would."""
    from kontrast.data.shard_index import open_shards, read_sample

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # bad images: the loader reports them
        index = open_shards(source, cache_dir=cache_dir, skip_bad_images=True)
    yield from (read_sample(index, i)[0] for i in range(min(SAMPLED, len(index))))


def _tar_images(path: Path) -> Iterator[bytes]:
    try:
        with tarfile.open(path, "r|*") as archive:  # streamed: only the first members are decompressed
            for member in archive:
                if member.isfile() and is_image_path(member.name):
                    f = archive.extractfile(member)
                    if f is not None:
                        yield f.read()
    except (OSError, tarfile.TarError):
        return
