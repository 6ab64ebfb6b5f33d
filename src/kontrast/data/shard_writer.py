"""Write a dataset as tar shards in the WebDataset convention, with an index of member offsets.

The convention (https://github.com/webdataset/webdataset): a shard is a plain POSIX tar whose
members are grouped by key, one sample per key, its parts told apart by extension. Each sample
here is ``KEY.jpg`` (the file's original bytes, never re-encoded; ``KEY.png`` etc. for other
formats), ``KEY.cls`` (the class index as decimal text, when labelled) and ``KEY.json``
(``{"path": ..., "class": ..., "split": ...}``). Shards are ``{split}-000000.tar``,
``{split}-000001.tar``, ..., so ``"train-{000000..000003}.tar"`` names them for any WebDataset
reader.

Beside them, ``index.json`` lists every shard with its sha256, byte size and sample count, and
per sample its key, label, source path and the byte offset and size of each member inside the
tar, so a sample is read by number with one seek (:func:`kontrast.data.shard_index.read_sample`).

Written with :mod:`tarfile` rather than the ``webdataset`` package (not installed here; on PyPI):
its ``ShardWriter`` records no member offsets, so the index would need a second scan of every
shard; it stamps each member with the current time, so shards would differ from run to run; and
writing a tar is a few lines of the standard library, so no dependency is added for it. The
output follows its convention, so its readers read these shards unchanged (checked by hand with
webdataset 1.0.2: ``WebDataset("train-{000000..000002}.tar")`` yields the same keys, image bytes
and labels as :func:`~kontrast.data.shard_index.read_sample`).

Samples are in sorted path order, so with class folders a shard holds few classes: kontrast reads
them by number through the index (any order), but a reader that streams shards with only a
small shuffle buffer should shuffle the shard list and use a large buffer.

Determinism: samples in sorted path order, members in a fixed order, USTAR headers with a fixed
mtime, mode, owner and group: the same input gives byte-identical shards and index.
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import tarfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from itertools import chain, islice
from pathlib import Path

from kontrast.data.cache import file_digest
from kontrast.data.decode import read_regular_file, report_bad_images
from kontrast.data.headers import check_image_header, image_extension
from kontrast.data.layout import list_files, plan_layout
from kontrast.errors import UserError

INDEX_NAME = "index.json"
INDEX_FORMAT = "kontrast-shards/1"
WEBDATASET_URL = "https://github.com/webdataset/webdataset"
DEFAULT_PER_SHARD = 1000
TAR_MTIME = 946_684_800  # 2000-01-01 UTC for every member: the same input gives the same bytes
_BLOCK = 512  # tar block: member data is padded to a multiple of it


@dataclass
class Record:
    """One sample to write: the image file's bytes as they are, and where it came from."""

    path: str  # relative path in the source, kept in KEY.json
    data: bytes  # the file's bytes, written unchanged
    ext: str  # image member extension ("jpg", "png", ...)
    label: int | None  # class index, None when unlabelled


class ShardSetWriter:
    """Writes the shards of one dataset into ``out``, split by split, then ``index.json``."""

    def __init__(self, out: Path, classes: list[str], layout: str, per_shard: int):
        self.out, self.classes, self.layout = out, list(classes), layout
        self.per_shard = check_per_shard(per_shard)
        self.shards: list[dict] = []
        self.counts: dict[str, int] = {}

    def add_split(self, split: str, records: Iterable[Record]) -> int:
        """Write ``records`` as ``{split}-NNNNNN.tar`` shards of ``per_shard`` samples; returns the count."""
        records, count, number = iter(records), 0, 0
        for first in records:  # one shard per pass, streamed: never more than one sample in memory
            chunk = chain([first], islice(records, self.per_shard - 1))
            entry = _write_shard(self.out / f"{split}-{number:06d}.tar", split, count, chunk, self.classes)
            self.shards.append(entry)
            count, number = count + entry["count"], number + 1
        self.counts[split] = count
        return count

    def finish(self) -> dict:
        """Write ``index.json`` (compact, keys sorted) and return it."""
        index = {"format": INDEX_FORMAT, "convention": WEBDATASET_URL, "layout": self.layout,
                 "classes": self.classes, "splits": self.counts, "shards": self.shards}
        text = json.dumps(index, sort_keys=True, separators=(",", ":"))
        (self.out / INDEX_NAME).write_text(text + "\n", encoding="utf-8")
        return index


def _write_shard(path: Path, split: str, first: int, records: Iterable[Record], classes: list[str]) -> dict:
    """One tar of ``records`` (keys numbered from ``first``); its index entry."""
    keys, labels, paths, members = [], [], [], []
    with open(path, "wb") as f, tarfile.open(fileobj=f, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for i, record in enumerate(records):
            key = f"{first + i:06d}"
            where: dict[str, list[int]] = {}
            for ext, payload in _sample_members(record, split, classes):
                tar.addfile(_member_info(f"{key}.{ext}", len(payload)), io.BytesIO(payload))
                padded = -(-len(payload) // _BLOCK) * _BLOCK
                where[ext] = [f.tell() - padded, len(payload)]  # data offset in the tar, size
            keys.append(key)
            labels.append(record.label)
            paths.append(record.path)
            members.append(where)
    labelled = any(label is not None for label in labels)
    return {"name": path.name, "split": split, "sha256": file_digest(path), "bytes": path.stat().st_size,
            "count": len(keys), "member_count": sum(len(m) for m in members), "keys": keys,
            "labels": labels if labelled else None, "paths": paths, "members": members}


def _sample_members(record: Record, split: str, classes: list[str]) -> Iterator[tuple[str, bytes]]:
    """(extension, bytes) of one sample's members, in a fixed order: image, cls, json."""
    yield record.ext, record.data
    meta: dict = {"path": record.path, "split": split}
    if record.label is not None:
        yield "cls", str(record.label).encode("ascii")
        meta["class"] = classes[record.label]
    yield "json", json.dumps(meta, sort_keys=True).encode("utf-8")


def _member_info(name: str, size: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = size, TAR_MTIME, 0o444
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def check_per_shard(per_shard: int) -> int:
    """``per_shard`` if it is an integer of at least 1, else UserError."""
    if isinstance(per_shard, bool) or not isinstance(per_shard, int) or per_shard < 1:
        raise UserError(f"--per-shard must be an integer of at least 1, got {per_shard!r}")
    return per_shard


@contextlib.contextmanager
def fresh_output_folder(out: str | Path) -> Iterator[Path]:
    """``out`` created (or found empty); on any error, what was written there is removed again.

    A folder that already holds files is refused before anything is written, so nothing of the
    user's is ever replaced.
    """
    out = Path(out).expanduser()
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UserError(f"--out {out} already exists and is not an empty folder; choose a new folder "
                        "(nothing was written)")
    created = not out.exists()
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"cannot create --out {out}: {exc.strerror or exc}") from exc
    try:
        yield out
    except BaseException:
        if created:
            shutil.rmtree(out, ignore_errors=True)
        else:
            for child in out.iterdir():
                shutil.rmtree(child, ignore_errors=True) if child.is_dir() else child.unlink(missing_ok=True)
        raise


def write_folder_shards(data: str | Path, out: str | Path, *, per_shard: int = DEFAULT_PER_SHARD,
                        skip_bad_images: bool = False) -> dict:
    """Write an image folder (any layout the folder reader accepts) as shards + ``index.json`` in ``out``.

    Splits and labels follow :func:`kontrast.data.layout.plan_layout` (``train/`` + ``test/``,
    class folders with every 10th image held out, or a flat unlabelled folder). Every image's
    header is checked (:func:`kontrast.data.headers.check_image_header`); bad files are named in
    one UserError and nothing is left in ``out``, or skipped with a warning (``skip_bad_images``).
    Returns the index.
    """
    source = Path(data).expanduser()
    if not source.exists():
        raise UserError(f"dataset not found: {source} does not exist; pass a folder of images")
    if not source.is_dir():
        raise UserError(f"--data {source} is not a folder; `kontrast shards` writes a folder of images "
                        "(class folders, train/ + test/, or flat)")
    check_per_shard(per_shard)
    plan = plan_layout(list_files(source), str(source))
    bad: list[tuple[str, str]] = []
    with fresh_output_folder(out) as folder:
        writer = ShardSetWriter(folder, plan.classes, plan.layout, per_shard)
        for split, split_plan in plan.splits.items():
            labels = split_plan.labels or [None] * len(split_plan.paths)
            writer.add_split(split, _folder_records(source, split_plan.paths, labels, bad))
        if bad:  # strict: raises, and the folder is emptied again; skipping: a warning
            report_bad_images(bad, str(source), skip_bad_images, stacklevel=3)
        if not writer.shards:
            raise UserError(f"no readable images in {source}")
        return writer.finish()


def _folder_records(root: Path, paths: list[str], labels: list, bad: list) -> Iterator[Record]:
    """The readable images of ``paths`` as Records; ``(path, reason)`` of the rest appended to ``bad``."""
    for rel, label in zip(paths, labels):
        data = read_regular_file(root / rel)
        header = check_image_header(data) if isinstance(data, bytes) else data
        if isinstance(header, str):
            bad.append((rel, header))
            continue
        yield Record(rel, data, image_extension(header[0]), label)
