"""A training set read sample by sample: an ImageFolder tree or tar shards, addressed by sample number.

The memory path (:func:`kontrast.data.load_images`) decodes a whole split once into one uint8 tensor at
``data.size``. The streaming path instead keeps only what says where each image is: the folder's planned
files (:mod:`kontrast.data.layout`, the same splits, classes and labels as the memory path), or the shard
index (:func:`kontrast.data.shard_index.open_shards`: every sample's byte offset, checked against each
shard's sha256). :meth:`StreamSource.read` returns sample ``i``'s file bytes, one file read or one seek.

Sources it reads (:func:`is_shard_spec` tells shards from a folder):

* an ImageFolder directory (``train/`` + ``test/``, class folders only, or a flat folder);
* shards: a folder written by ``kontrast shards`` (with ``index.json``), a folder of ``.tar`` files, or a
  brace pattern ``"shards/train-{000000..000127}.tar"`` (WebDataset's convention); on disk or at a URL
  (``s3://``, ``gs://``, ``https://``: read through a local cache, :mod:`kontrast.data.shard_cache`).

The ``webdataset`` package's reader is not used (the files follow its convention, so it reads them): it is
an IterableDataset that streams each shard in order through a shuffle buffer, so it cannot fetch sample ``i``,
and with it neither the global permutation of (seed, epoch) nor a resume at a given sample would hold. The
index gives each sample with one seek; PIL decodes (:mod:`kontrast.data.stream_decode`), torch's DataLoader runs
the workers.

Both pass every image's header once at start-up (folders: :mod:`kontrast.data.folder_index`; shards: the
index pass), so bad files are named before training, as the memory path does; what a header cannot show
is found when the image is decoded (:mod:`kontrast.data.stream_decode`).
"""

from __future__ import annotations

import io
import os
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from kontrast.data.cifar import find_cifar_folder
from kontrast.data.decode import decode_blobs, read_regular_file, report_bad_images
from kontrast.data.folder_index import check_folder_headers
from kontrast.data.layout import HOLDOUT_EVERY, is_image_path, list_files, plan_layout
from kontrast.data.reader import unlabelled_test_error
from kontrast.data.remote import Unreachable, is_url
from kontrast.data.samples import Samples
from kontrast.data.shard_cache import RemoteShard
from kontrast.data.shard_index import ShardIndex, names_index_folder, open_shards, read_sample
from kontrast.data.shard_writer import INDEX_NAME
from kontrast.errors import UserError

RANGE_SAMPLE = 256  # shards: headers read (evenly spread) for the start-up line's resolution range


def is_shard_spec(source: str) -> bool:
    """Shards: a brace pattern of ``.tar`` files, a folder with ``index.json``, or a folder of ``.tar`` files and no
    images or sub-folders (a photo folder holding a stray ``.tar`` stays a photo folder); any URL (shards are what
    kontrast reads from one)."""
    path = Path(source).expanduser()
    if is_url(source) or ("{" in source and ".tar" in source):
        return True
    if not path.is_dir():
        return False
    if (path / INDEX_NAME).is_file():
        return True
    entries = list(path.iterdir())
    return any(p.suffix == ".tar" for p in entries) and not any(p.is_dir() or is_image_path(p.name) for p in entries)


def is_folder_spec(source: str) -> bool:
    """An ImageFolder directory (not shards, not CIFAR pickles) the streaming path can read."""
    path = Path(source).expanduser()
    return path.is_dir() and not is_shard_spec(source) and find_cifar_folder(path) is None


@dataclass
class StreamSource:
    """One split, addressable by sample number; cheap to send to DataLoader workers (no pixels).

    ``root`` + ``paths``: a folder's images (relative paths); ``shards``: a shard index. ``sizes``: int64
    ``[M, 2]`` (width, height) of every image (folders) or of an even spread of them (shards).
    """

    name: str  # "DIR (train)": for messages
    where: str  # the source as the user gave it
    labels: torch.Tensor | None  # int64 [N], None when unlabelled
    classes: list[str]
    paths: list[str]  # each sample's path (relative to the folder, or the shard sample's source path)
    layout: str
    sizes: np.ndarray
    root: Path | None = None
    shards: ShardIndex | None = None
    captions: None = None  # no paired captions on this path (CLIP makes them from the labels)

    def __len__(self) -> int:
        return len(self.paths)

    def subset(self, n: int, seed: int = 0) -> StreamSource:
        """The rows :meth:`kontrast.data.Samples.subset` keeps (a fixed random ``n``); self if ``n`` covers all."""
        if not 0 < n < len(self):
            return self
        return self.rows(torch.randperm(len(self), generator=torch.Generator().manual_seed(seed))[:n])

    def rows(self, keep: torch.Tensor) -> StreamSource:
        """The samples ``keep`` (int64 [n]), in that order."""
        rows = keep.tolist()
        files = [self.paths[i] for i in rows]
        shards = None if self.shards is None else _index_rows(self.shards, keep.numpy())
        sizes = self.sizes[keep.numpy()] if self.shards is None else self.sizes
        return replace(self, labels=None if self.labels is None else self.labels[keep], paths=files, sizes=sizes,
                       shards=shards)

    def decoded(self, n: int, size: int, seed: int = 0) -> Samples:
        """A fixed random ``n`` samples (all when ``n`` covers them) decoded whole at ``size`` by the memory path's
        decoder (shorter side, centre crop), for what scores a training set (the kNN monitor); bad ones left out."""
        part = self.subset(n, seed)
        images, _ = decode_blobs(((str(i), _bytes(part.read(i))) for i in range(len(part))), size)
        keep = [i for i in range(len(part)) if str(i) in images]
        if not keep:
            raise UserError(f"none of {len(part)} images of {self.name} could be decoded")
        return Samples(torch.stack([images[str(i)] for i in keep]), None if part.labels is None else part.labels[keep],
                       part.classes, part.name, [part.paths[i] for i in keep], layout=part.layout)

    def read(self, i: int) -> bytes | str:
        """Sample ``i``'s file bytes as stored, or why they cannot be read now."""
        if self.shards is not None:
            try:
                return read_sample(self.shards, i)[0]
            except (OSError, UserError) as exc:  # at a URL: the storage failed, not the image
                remote = isinstance(self.shards.shards[int(self.shards.shard_of[i])], RemoteShard)
                return Unreachable(exc) if remote else f"cannot read it: {exc}"
        return read_regular_file(self.root / self.paths[i])

    def locate(self, i: int) -> str:
        """How to name sample ``i`` in a message: the file, or shard:key (source path)."""
        if self.shards is not None:
            shard = self.shards.shards[int(self.shards.shard_of[i])]
            return f"{shard}:{self.shards.keys[i]} ({self.paths[i]})"
        return str(self.root / self.paths[i])

    def resolution_range(self) -> str:
        """``"96x64 to 256x256 px"`` (width x height, by area) over the headers read at start-up."""
        return size_range(self.sizes, sampled=self.shards is not None)

    def summary(self, size: int, workers: int, why: str) -> str:
        """The run's start-up line: path, count, labels, source resolutions, training resolution."""
        kind = f"labelled, {len(self.classes)} classes" if self.labels is not None else "unlabelled"
        indexed = self.layout == "shards" and names_index_folder(self.where)
        held = {"holdout": f"every {HOLDOUT_EVERY}th image of each class held out for `kontrast eval`",
                "splits": "the train split", "flat": "nothing held out",
                "shards": "the train shards" if indexed else "every sample of the shards named"}.get(self.layout, "")
        first = self.shards.shards[0] if self.shards is not None else None
        remote = f"; {first.cache.summary()}" if isinstance(first, RemoteShard) else ""
        return (f"data: streaming {len(self)} training images from {self.name}; {kind}; {held}; source "
                f"{self.resolution_range()}, cropped at decode time to {size}x{size} px in {workers} worker(s)"
                f"{remote}; {why}")


def open_stream(source: str | os.PathLike, split: str = "train", *, cache_dir: str | Path | None = None,
                skip_bad_images: bool = False) -> StreamSource:
    """Open one split of a folder or a set of shards for streaming (see the module doc).

    Raises UserError for a source of another kind, a missing split, or bad images (unless ``skip_bad_images``,
    which warns and leaves them out).
    """
    where = os.fspath(source)
    if is_shard_spec(where):
        return _open_shards(where, split, cache_dir, skip_bad_images)
    if not is_folder_spec(where):
        raise UserError(f"data.mode=stream reads an ImageFolder directory or tar shards; {where} is neither "
                        "(an archive, CIFAR pickles or a built-in set): use data.mode=memory")
    root = Path(where).expanduser()
    plan = plan_layout(list_files(root), where)
    split_plan = plan.splits.get(split)
    if split_plan is None or (split == "test" and split_plan.labels is None):
        raise unlabelled_test_error(where)
    headers = check_folder_headers(root, split_plan.paths, cache_dir)
    bad = [(p, h) for p, h in zip(split_plan.paths, headers) if isinstance(h, str)]
    if bad:
        report_bad_images(bad, where, skip_bad_images, locate=lambda p: f"{where}/{p}", stacklevel=4)
    keep = [i for i, h in enumerate(headers) if not isinstance(h, str)]
    if not keep:
        raise UserError(f"no readable {split} images in {where}")
    labels = None if split_plan.labels is None else torch.tensor([split_plan.labels[i] for i in keep])
    return StreamSource(f"{where} ({split})", where, labels, list(plan.classes) if labels is not None else [],
                        [split_plan.paths[i] for i in keep], plan.layout,
                        np.array([headers[i] for i in keep], dtype=np.int64).reshape(-1, 2), root=root)


def _open_shards(where: str, split: str, cache_dir, skip_bad_images: bool) -> StreamSource:
    index = open_shards(where, split=split, cache_dir=cache_dir, skip_bad_images=skip_bad_images)
    labels = None if index.labels is None else torch.from_numpy(index.labels)
    source = StreamSource(f"{where} ({split})", where, labels, list(index.classes) if labels is not None else [],
                          list(index.paths), "shards", np.zeros((0, 2), dtype=np.int64), shards=index)
    source.sizes = spread_sizes(source.read, len(source))
    return source


def _index_rows(index: ShardIndex, rows: np.ndarray) -> ShardIndex:
    """The shard index of the samples ``rows`` (int64 [n]), renumbered 0..n-1 in that order."""
    return replace(index, shard_of=index.shard_of[rows], offsets=index.offsets[rows], sizes=index.sizes[rows],
                   labels=None if index.labels is None else index.labels[rows],
                   keys=[index.keys[i] for i in rows], paths=[index.paths[i] for i in rows])


def spread_sizes(read, n: int) -> np.ndarray:
    """int64 ``[M, 2]`` (width, height) from the headers of up to RANGE_SAMPLE of ``n`` images spread evenly;
    ``read(i)``: image i's bytes (or why not: skipped)."""
    picks = np.unique(np.linspace(0, n - 1, min(RANGE_SAMPLE, n)).astype(np.int64))
    return np.array([s for s in (_header_size(read(int(i))) for i in picks) if s], dtype=np.int64).reshape(-1, 2)


def size_range(sizes: np.ndarray, sampled: bool) -> str:
    """``"96x64 to 256x256 px"`` (the smallest and largest by area) of ``sizes`` ``[M, 2]`` (width, height)."""
    if len(sizes) == 0:
        return "unknown size"
    area = sizes[:, 0] * sizes[:, 1]
    lo, hi = sizes[int(area.argmin())], sizes[int(area.argmax())]
    spread = f" (headers of {len(sizes)} samples)" if sampled else ""
    if (lo == hi).all():
        return f"{lo[0]}x{lo[1]} px{spread}"
    return f"{lo[0]}x{lo[1]} to {hi[0]}x{hi[1]} px{spread}"


def _bytes(data: bytes | str) -> bytes:
    """A file's bytes, or none when it could not be read (the decoder then reports it as empty)."""
    return b"" if isinstance(data, str) else data


def _header_size(data: bytes | str) -> list[int] | None:
    """(width, height) from an image's header, None when it cannot be read."""
    if isinstance(data, str):
        return None
    try:
        with Image.open(io.BytesIO(data)) as im:
            return list(im.size)
    except Exception:  # a bad image is found and named when it is decoded
        return None
