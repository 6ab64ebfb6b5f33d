"""Tar shards on the memory path: every sample of a split decoded at ``size`` into one tensor.

For what reads a split whole (``kontrast eval``, ``embed``, ``report``, the kNN monitor, and ``data.mode=memory``
or ``auto`` when the decoded set fits the budget), shards are one more source: the index
(:func:`kontrast.data.shard_index.open_shards`, its header checks and bad-file reporting) says where each sample
is, and the memory path's decoder (:func:`kontrast.data.decode.decode_blobs`: shorter side to ``size``, centre
crop) turns the bytes into pixels, so a shard set and the folder it was written from load the same tensor. Not
cached: the index is, and decoding a split at training size costs about what reading a cache entry would save.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from kontrast.data.decode import decode_blobs, report_bad_images
from kontrast.data.samples import Samples, SourceKind
from kontrast.data.shard_index import names_index_folder, open_shards, read_sample
from kontrast.data.shard_writer import INDEX_NAME
from kontrast.data.stream_source import is_shard_spec
from kontrast.errors import UserError
from kontrast.registry import SOURCES


def load_shards(source: str | os.PathLike, split: str, *, size: int, cache_dir: str | Path | None = None,
                skip_bad_images: bool = False) -> Samples:
    """One split of a set of shards as uint8 ``[N, 3, size, size]``; a sample that fails to decode is named
    with the others (UserError) or left out with a warning (``skip_bad_images``)."""
    where = os.fspath(source)
    if split == "test" and not names_index_folder(where):
        raise UserError(f"{where} names shards without an {INDEX_NAME}: they hold one split, read as train; kNN and "
                        "linear scores need a test split: write the folder with `kontrast shards` (train and test "
                        "shards, index.json) and pass that folder")
    index = open_shards(where, split=split, cache_dir=cache_dir, skip_bad_images=skip_bad_images)
    images, bad = decode_blobs(((str(i), read_sample(index, i)[0]) for i in range(len(index))), size)
    if bad:
        named = [(f"{index.shards[int(index.shard_of[int(i)])].name}:{index.keys[int(i)]} ({index.paths[int(i)]})", why)
                 for i, why in sorted(bad.items(), key=lambda kv: int(kv[0]))]
        report_bad_images(named, where, skip_bad_images, stacklevel=4)
    keep = [i for i in range(len(index)) if str(i) in images]
    if not keep:
        raise UserError(f"no readable {split} images in {where}")
    labels = None if index.labels is None else torch.from_numpy(index.labels[keep])  # int64 [N]
    classes = list(index.classes) if labels is not None else []
    return Samples(torch.stack([images[str(i)] for i in keep]), labels, classes, f"{where} ({split})",
                   [index.paths[i] for i in keep], layout="shards")  # uint8 [N, 3, size, size]


SOURCES.register("shards")(SourceKind(order=1, matches=is_shard_spec, load=load_shards))
