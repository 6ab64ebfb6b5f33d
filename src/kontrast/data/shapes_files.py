"""The shapes world written as JPEG files at any resolution: test and benchmark data for file-backed paths.

No large real image set can be downloaded here, so the streaming path, the shard writer and their
benchmarks read this instead: :func:`write_shapes_files` draws the built-in shapes
(:func:`kontrast.data.shapes.make_shapes`, which renders at any size with the same anti-aliasing,
so 256 px is drawn at 256 px, not upscaled) and writes them as

* an ImageFolder tree ``OUT/{train,test}/<class>/NNNNNN.jpg`` (the folder reader's ``splits``
  layout), or
* WebDataset-convention tar shards + ``index.json`` (:mod:`kontrast.data.shard_writer`), with the
  same relative paths in each sample's ``KEY.json``.

``n`` training images and ``n // 5`` test images, as the built-in ``shapes:N``. Images are drawn
in chunks of ``CHUNK`` (bounded memory at 256 px: about 100 MB a chunk), each chunk from its own
seed derived from (``seed``, split, chunk number): the same ``seed`` gives the same files, and
a larger ``n`` extends a smaller one (its first images are the same). Classes are balanced per
chunk, so per split the counts differ by at most two.
"""

from __future__ import annotations

import hashlib
import io
from collections.abc import Iterator
from pathlib import Path

from PIL import Image

from kontrast.data.shapes import SHAPE_CLASSES, make_shapes
from kontrast.data.shard_writer import DEFAULT_PER_SHARD, Record, ShardSetWriter, fresh_output_folder
from kontrast.errors import UserError

CHUNK = 20  # images per make_shapes call: a multiple of the 10 classes, so each chunk is balanced
JPEG_QUALITY = 90  # PIL's encoder, 4:2:0 subsampling: about 18 KB per 256-px image
TEST_FRACTION = 5  # n // 5 test images, as the built-in shapes:N


def write_shapes_files(out: str | Path, n: int, *, size: int = 256, seed: int = 0, shards: bool = False,
                       per_shard: int = DEFAULT_PER_SHARD) -> dict:
    """Write ``n`` train and ``n // 5`` test shape images of ``size`` px into the new folder ``out``.

    As a JPEG ImageFolder tree, or as tar shards with ``shards`` (``per_shard`` samples each).
    Returns ``{"out", "train", "test", "size", "shards"}`` (``shards``: how many tar files, 0 for a tree).
    Raises UserError for ``n < 5``, ``size < 8`` or an ``out`` that already holds files.
    """
    for name, value, least in (("--n", n, TEST_FRACTION), ("--size", size, 8)):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise UserError(f"{name} must be an integer of at least {least}, got {value!r}")
    counts = {"train": n, "test": n // TEST_FRACTION}
    with fresh_output_folder(out) as folder:
        written = 0
        if shards:
            writer = ShardSetWriter(folder, list(SHAPE_CLASSES), "splits", per_shard)
            for split, count in counts.items():
                writer.add_split(split, shape_records(split, count, size=size, seed=seed))
            written = len(writer.finish()["shards"])
        else:
            for split, count in counts.items():
                for record in shape_records(split, count, size=size, seed=seed):
                    path = folder / record.path
                    path.parent.mkdir(parents=True, exist_ok=True)
                    path.write_bytes(record.data)
    return {"out": str(folder), **counts, "size": size, "shards": written}


def shape_records(split: str, count: int, *, size: int, seed: int) -> Iterator[Record]:
    """``count`` shape images of one split as JPEG Records ``{split}/{class}/{i:06d}.jpg``, in order."""
    for chunk in range(-(-count // CHUNK)):
        images, labels = make_shapes(CHUNK, seed=_chunk_seed(seed, split, chunk), size=size)  # uint8 [CHUNK, 3, s, s]
        for j in range(min(CHUNK, count - chunk * CHUNK)):
            i, label = chunk * CHUNK + j, int(labels[j])
            yield Record(f"{split}/{SHAPE_CLASSES[label]}/{i:06d}.jpg", _jpeg(images[j]), "jpg", label)


def _chunk_seed(seed: int, split: str, chunk: int) -> int:
    """A seed per (seed, split, chunk), so chunks are independent and a prefix does not depend on ``n``."""
    digest = hashlib.sha256(f"kontrast-shapes-files/{seed}/{split}/{chunk}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1  # 63 bits: any torch.Generator seed


def _jpeg(image) -> bytes:
    """uint8 ``[3, H, W]`` -> JPEG bytes (baseline, fixed quality: the same pixels give the same bytes)."""
    out = io.BytesIO()
    Image.fromarray(image.permute(1, 2, 0).numpy()).save(out, "JPEG", quality=JPEG_QUALITY)
    return out.getvalue()
