"""Paired image-text files for CLIP: JSONL or CSV, one image path and caption per line.

    {"image": "train/cat/0001.jpg", "caption": "a photo of a cat.", "label": "cat", "split": "train"}

CSV files have a header with the same column names. ``image`` and ``caption`` are required;
relative paths are relative to the file's folder. ``label`` (a class name) makes the data
usable for kNN / linear / zero-shot evaluation when every line has one; ``split`` ("train"
or "test", default "train") divides the file. ``kontrast captions --data DIR --out FILE``
writes such a file for an ImageFolder tree. Images are decoded on every load (not cached).
"""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import torch

from kontrast.data.decode import decode_blobs, report_bad_images
from kontrast.data.samples import Samples, SourceKind
from kontrast.errors import UserError
from kontrast.registry import SOURCES

PAIR_SUFFIXES = (".jsonl", ".csv")


def read_pairs(path: Path) -> list[dict]:
    """The rows of a ``.jsonl`` / ``.csv`` paired file, checked for ``image`` and ``caption``."""
    if not path.is_file():
        raise UserError(f"paired file not found: {path}; write one with `kontrast captions --data DIR --out {path}`")
    text = path.read_text(encoding="utf-8")
    if path.suffix.lower() == ".csv":
        rows = list(csv.DictReader(text.splitlines()))
    else:
        rows = []
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise UserError(f"{path}:{n} is not valid JSON ({exc.msg}); one JSON object per line") from None
    for n, row in enumerate(rows, 1):
        if not isinstance(row, dict) or not row.get("image") or not isinstance(row.get("caption"), str):
            raise UserError(f"{path}: row {n} needs an 'image' path and a 'caption' text")
        if row.get("split", "train") not in ("train", "test"):
            raise UserError(f"{path}: row {n} has split {row['split']!r}; use 'train' or 'test'")
    if not rows:
        raise UserError(f"{path} holds no image-caption pairs")
    return rows


def load_pairs(source: str | os.PathLike, split: str, *, size: int, cache_dir: str | Path | None = None,
               skip_bad_images: bool = False) -> Samples:
    """One split of a paired file as :class:`~kontrast.data.Samples` with ``captions`` (never cached:
    ``cache_dir`` is unused); each row's path is its ``image`` as written in the file."""
    path = Path(source).expanduser()
    rows = read_pairs(path)
    labelled = all(row.get("label") for row in rows)
    classes = sorted({str(row["label"]) for row in rows}) if labelled else []
    mine = [row for row in rows if row.get("split", "train") == split]
    if split == "test" and (not mine or not labelled):
        raise UserError(f"{path} has no labelled test rows; evaluation needs lines with \"label\" and "
                        "\"split\": \"test\" (kontrast captions writes them)")
    if not mine:
        raise UserError(f"{path} has no {split} rows")
    files = [str(path.parent / row["image"]) for row in mine]
    images, bad = decode_blobs(((f, _read(f)) for f in files), size)
    if bad:
        report_bad_images(sorted(bad.items()), str(path), skip_bad_images, stacklevel=4)  # names load_images' caller
    keep = [i for i, f in enumerate(files) if f in images]
    if not keep:
        raise UserError(f"no readable {split} images listed in {path}")
    index = {c: i for i, c in enumerate(classes)}
    labels = torch.tensor([index[str(mine[i]["label"])] for i in keep]) if labelled else None
    return Samples(torch.stack([images[files[i]] for i in keep]), labels, classes, f"{path} ({split})",
                   paths=[str(mine[i]["image"]) for i in keep], captions=[mine[i]["caption"] for i in keep])


def _read(file: str) -> bytes:
    try:
        return Path(file).read_bytes()
    except OSError:
        return b""  # reported as unreadable with the others


def _is_pairs(source: str) -> bool:
    return source.lower().endswith(PAIR_SUFFIXES)


SOURCES.register("pairs")(SourceKind(order=1, matches=_is_pairs, load=load_pairs))
